"""Modeled plans of WORKLOADS.md A1 and B at full size (no GPU needed).

    .venv/bin/python bench/plans.py

For each workload: kernels, DRAM bytes of the plan against the compulsory bytes (inputs read
once, outputs written once), the plan's *modeled* H100 time against the limit (compulsory bytes
at 0.9 x peak bandwidth plus one launch), Panamera's compile time (measured here, frontend to
CUDA source), and what the fusion planner stitched or rejected. Nothing is run on a GPU.
"""

from __future__ import annotations

import time

import numpy as np

import panamera as pn
from panamera.model.gpu import H100

P = pn.placeholder


def nbytes(tensors) -> int:
    return sum(int(np.prod(t.shape)) * t.dtype.itemsize for t in tensors)


def row(name, outs, ins):
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    t0 = time.perf_counter()
    k = pn.compile(outs, target="emulator")
    compile_ms = (time.perf_counter() - t0) * 1e3
    dram = sum(ln.bytes_read + ln.bytes_written for ln in k.plan.launches)
    compulsory = nbytes(ins) + nbytes(outs)
    limit = compulsory / H100.achievable_bw * 1e6 + H100.launch_s * 1e6
    planner = "; ".join(
        f"{'stitched' if c.chosen else 'rejected'} {'+'.join(c.statements)} "
        f"({c.stitched_us:.0f} vs {c.unfused_us:.0f} us unfused)"
        for c in k.considered
    )
    return (name, len(k.plan.kernels), f"{dram / 1e6:.1f}", f"{compulsory / 1e6:.1f}", f"{k.plan.modeled_us:.1f}",
            f"{limit:.1f}", f"{k.plan.modeled_us / limit:.2f}", f"{compile_ms:.0f}", planner or "-")  # fmt: skip


def workloads():
    for shape, axis in [((21128, 768), None), ((256, 256, 56, 56), (0, 2, 3)), ((768, 21128), 1),
                        ((256, 56, 56, 256), (0, 1, 2)), ((21128, 768), 0)]:  # fmt: skip
        x = P(shape, "float32", name="x")
        yield f"A1 sum f32 {shape} axis={axis}", pn.sum(x, axis=axis), [x]
    for dt in ("float32", "float16"):
        for shape in ((4 * 12 * 128, 128), (64, 30522)):
            x = P(shape, dt, name="x")
            yield f"B softmax {dt} {shape}", pn.nn.softmax(x), [x]
    x, t = P((64, 30522), "float32", name="x"), P((64,), "int64", name="t")
    yield "B log_softmax f32 (64, 30522)", pn.nn.log_softmax(x), [x]
    yield "B cross_entropy f32 (64, 30522)", pn.nn.cross_entropy(x, t, reduction="none"), [x, t]
    for dt in ("float32", "float16"):
        for shape in ((8 * 128, 768), (4096, 4096)):
            x, g, b = P(shape, dt, name="x"), P(shape[1:], dt, name="g"), P(shape[1:], dt, name="b")
            yield f"B layer_norm {dt} {shape}", pn.nn.layer_norm(x, g, b), [x, g, b]
    for dt in ("float32", "bfloat16"):
        for shape in ((16 * 64, 512), (4096, 8192)):
            x, g = P(shape, dt, name="x"), P(shape[1:], dt, name="g")
            yield f"B rms_norm {dt} {shape}", pn.nn.rms_norm(x, g), [x, g]
    x, g, b = P((32, 64, 56, 56), "float32", name="x"), P((64,), "float32", name="g"), P((64,), "float32", name="b")
    yield "B batch_norm train f32 (32,64,56,56)", list(pn.nn.batch_norm(x, g, b)), [x, g, b]
    x = P((4, 64, 16, 16), "float32", name="x")
    yield "B group_norm f32 (4,64,16,16) 8 groups", pn.nn.group_norm(x, 8, g, b), [x, g, b]
    x = P((256, 1000), "float32", name="x")
    yield "B l2_normalize f32 (256, 1000)", pn.nn.l2_normalize(x), [x]
    for shape in ((64, 30522), (1, 10_000_000)):
        x = P(shape, "float32", name="x")
        yield f"B argmax f32 {shape}", pn.argmax(x, axis=1), [x]
    for shape in ((65536, 64), (802816, 256)):
        x = P(shape, "float32", name="x")
        yield f"B bias gradient f32 {shape}", pn.sum(x, axis=0), [x]


def main() -> None:
    rows = [row(*w) for w in workloads()]
    head = ("workload", "kernels", "DRAM MB", "compulsory MB", "modeled us (H100)", "limit us", "ratio",
            "compile ms", "planner")  # fmt: skip
    widths = [max(len(str(r[c])) for r in [head, *rows]) for c in range(len(head) - 1)]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)) + "  " + r[-1])


if __name__ == "__main__":
    main()
