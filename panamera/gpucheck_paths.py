"""The code paths no GPU has run yet, one kernel each: `make gpu-check`'s "paths" step.

Each path (a `PathCase`) is one small program planned to take it (the model's plan where it
does, else a replayed decision that forces it), run, checked against numpy in float64 with a
tolerance from its dtype and reduction length, and timed (CUDA events, L2 flushed, median:
bench/runner.measure_us) beside its peer where one exists: CuPy's reduction (CUB), torch's
softmax, cuBLAS through `cupy.matmul`. On the emulator (`run_paths(target="emulator")`, small
shapes) the same builders are checked here without a GPU; `plan_lines` lists what a device call
would run (`python -m panamera.gpucheck --list`).

A path that needs a newer GPU than the device (sm_90's clusters, mbarriers, warpgroup MMAs) is
skipped with a note, never failed. A path still being built elsewhere is listed in `PENDING`
(the dynamic-shared-memory held tiles): add its case to `cases()` when it lands.

>>> [c.name for c in cases()][:3]
['stitched_cluster_mbarrier', 'stitched_cluster_barrier', 'reduce_cluster_mbarrier']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Paths with no case of their own here (name -> why, and where a device call does run them).
PENDING = {
    "dynamic_smem": "held tiles in dynamic shared memory: no case here; the measured bench's training suite"
    " (--only bench --suites training) runs BN NHWC backward holding 192 KiB of it on sm_90",
}


@dataclass(frozen=True)
class PathCase:
    """One path: `build(target, gpu, small)` -> (compiled program, numpy inputs, float64 (or
    int64) reference, tolerance relative to `scale`); `shows(k)` says the plan takes the path;
    `peer(arrays)` -> (peer's name, a callable on device arrays) or None; `arch`: the least
    compute capability x 10 that has the path."""

    name: str
    what: str
    build: Callable
    shows: Callable
    peer: Callable | None = None
    arch: int = 90


def _eps(dtype: str) -> float:
    return {"float16": 2**-11, "bfloat16": 2**-8, "float32": 2**-24, "float64": 2**-53}.get(dtype, 0.0)


def _tolerance(dtype: str, n: int) -> float:
    """Relative error of a result of `dtype` over n accumulated values: 2 ulps of the result,
    float32 accumulation growing as sqrt(n) (x8 headroom), and a few ulps of transcendentals."""
    acc = _eps("float32") if dtype != "float64" else _eps("float64")
    return 4 * _eps(dtype) + acc * (8 * math.sqrt(n) + 16)


def _compile(y, target: str, gpu, tweak=None):
    """y planned for `gpu`, with its one kernel's decision changed by `tweak(group, decision)`."""
    import panamera as pn

    base = pn.compile(y, target=target, gpu=gpu, use_database=False, cache=False)
    if tweak is None:
        return base
    d = tweak(base.groups[0], base.schedule.kernels[0])
    return pn.compile(y, target=target, gpu=gpu, cache=False, schedule=dataclasses.replace(base.schedule, kernels=(d,)))


def _softmax_case(completion: str):
    def build(target, gpu, small):
        import panamera as pn

        from .schedule.decision import Completion
        from .schedule.mapping import map_group

        shape = (2, 16384) if small else (16, 131072)
        a = (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)
        e = np.exp(a.astype(np.float64) - a.max(1, keepdims=True))
        k = _compile(
            pn.nn.softmax(pn.placeholder(shape, "float32", name="x")),
            target,
            gpu,
            lambda g, d: dataclasses.replace(
                map_group(g, gpu, cluster=True).decision, completion=Completion(completion)
            ),
        )
        return k, [a], e / e.sum(1, keepdims=True), _tolerance("float32", shape[1])

    return build


def _sum_case(completion: str):
    def build(target, gpu, small):
        import panamera as pn

        from .schedule.decision import Completion
        from .schedule.mapping import map_group

        shape = (2, 65536) if small else (8, 1 << 22)
        a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)

        def tweak(g, d):
            d = map_group(g, gpu, split=16 if small else 128, cluster=True).decision
            return dataclasses.replace(d, completion=Completion(completion))

        k = _compile(pn.sum(pn.placeholder(shape, "float32", name="x"), axis=1), target, gpu, tweak)
        return k, [a], a.astype(np.float64).sum(1), _tolerance("float32", shape[1]) * float(np.abs(a).sum(1).max())

    return build


def _matmul_case(dtype: str, mma: str):
    """x @ w.T on the first candidate of `mma` (WGMMA or MMA_SYNC) the tensor-core tiler offers."""

    def build(target, gpu, small):
        import panamera as pn

        from .schedule.tc_tiling import candidates
        from .schedule.tensor_core import analyse
        from .schedule.warpgroup import MmaOp

        m, n, kk = (20, 40, 100) if small else (64, 4096, 4096)
        x, w = pn.placeholder((m, kk), dtype, name="x"), pn.placeholder((n, kk), dtype, name="w")
        y = x @ w.T if dtype != "int8" else pn.matmul(x, w.T).inputs[0]  # int8: the int32 sum

        def tweak(g, d):
            return next(c for c in candidates(g, analyse(g), gpu, None, False) if c.mma_op == MmaOp[mma])

        k = _compile(y, target, gpu, tweak)
        rng = np.random.default_rng(0)
        if dtype == "int8":
            X, W = rng.integers(-128, 128, (m, kk), dtype=np.int8), rng.integers(-128, 128, (n, kk), dtype=np.int8)
            return k, [X, W], X.astype(np.int64) @ W.astype(np.int64).T, 0.0  # exact
        X, W = rng.standard_normal((m, kk)).astype(dtype), rng.standard_normal((n, kk)).astype(dtype)
        scale = float((np.abs(X.astype(np.float64)) @ np.abs(W.astype(np.float64)).T).max())
        return k, [X, W], X.astype(np.float64) @ W.astype(np.float64).T, _tolerance(dtype, kk) * scale

    return build


def _pipeline_case(target, gpu, small):
    """A CUDA-core contraction whose shared operand's K slabs stream through cp.async stages."""
    import panamera as pn

    from .schedule.mapping import map_group

    m, n, kk = (4, 8, 1000) if small else (16, 4096, 4096)
    x, w = pn.placeholder((m, kk), "float32", name="x"), pn.placeholder((n, kk), "float32", name="w")

    def tweak(g, d):  # 8 rows of 32 threads per block share the staged slabs (schedule/pipeline.py)
        d = map_group(g, gpu, split=1, rtile=1, stages=1, mma=False).decision
        return dataclasses.replace(
            d, tx=32, ty=8, grid=(math.ceil(d.M / 8), 1), chunk=math.ceil(d.N / d.vec / 32) * 32, stages=2
        )

    k = _compile(x @ w.T, target, gpu, tweak)
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((m, kk)).astype(np.float32), rng.standard_normal((n, kk)).astype(np.float32)
    scale = float((np.abs(X.astype(np.float64)) @ np.abs(W.astype(np.float64)).T).max())
    return k, [X, W], X.astype(np.float64) @ W.astype(np.float64).T, _tolerance("float32", kk) * scale


def _mapping(k):
    return k.mappings[-1]


def _cupy_sum(arrays):
    import cupy as cp

    return "cupy.sum (CUB)", lambda: cp.sum(arrays[0], axis=1)


def _torch_softmax(arrays):
    try:
        import torch

        t = torch.as_tensor(arrays[0], device="cuda")
    except Exception:  # no PyTorch with CUDA: no peer
        return None
    return "torch.softmax", lambda: torch.softmax(t, dim=1)


def _cublas(arrays):
    import cupy as cp

    x, w = arrays
    if x.dtype == np.int8:  # CuPy has no int8 cuBLAS path: the same shape in fp16 on cuBLAS
        x, w = x.astype(cp.float16), w.astype(cp.float16)
        return "cupy.matmul fp16 (cuBLAS)", lambda: cp.matmul(x, w.T)
    return "cupy.matmul (cuBLAS)", lambda: cp.matmul(x, w.T)


def cases() -> list[PathCase]:
    """Every path a device call checks, sm_90-only first."""

    def completed(how):
        return lambda k: _mapping(k).cluster > 1 and str(_mapping(k).completion) == how

    def wgmma(k):
        return "pn_wgmma<" in k.source and "mma_sync" not in k.source

    return [
        PathCase("stitched_cluster_mbarrier", "softmax row split over a cluster, st.async + mbarrier exchange",
                 _softmax_case("mbarrier"), completed("mbarrier"), _torch_softmax),
        PathCase("stitched_cluster_barrier", "softmax row split over a cluster, cluster-barrier exchange",
                 _softmax_case("barrier"), completed("barrier"), _torch_softmax),
        PathCase("reduce_cluster_mbarrier", "split sum, clusters combined in rank 0 by st.async + mbarrier",
                 _sum_case("mbarrier"), completed("mbarrier"), _cupy_sum),
        PathCase("reduce_cluster_barrier", "split sum, clusters combined in rank 0 through map_shared_rank",
                 _sum_case("barrier"), completed("barrier"), _cupy_sum),
        PathCase("wgmma_f16", "fp16 x @ w.T on warpgroup MMAs (sm_90a cubin, cached on disk)",
                 _matmul_case("float16", "WGMMA"), wgmma, _cublas),
        PathCase("wgmma_s8", "int8 x int8 on s8 warpgroup MMAs (exact int32 sum)",
                 _matmul_case("int8", "WGMMA"), wgmma, _cublas),
        PathCase("mma_sync_f16", "fp16 x @ w.T on mma.sync tensor cores", _matmul_case("float16", "MMA_SYNC"),
                 lambda k: "mma_sync" in k.source, _cublas, arch=80),
        PathCase("cp_async_pipeline", "fp32 contraction on CUDA cores, K slabs through 2 cp.async stages",
                 _pipeline_case, lambda k: _mapping(k).stages == 2, _cublas, arch=80),
    ]  # fmt: skip


def plan_lines(arch: int = 90) -> list[str]:
    """What the paths step runs on a device of compute capability `arch` (x 10), one line each.

    >>> plan_lines(80)[0]
    'stitched_cluster_mbarrier: skipped (needs sm_90; softmax row split over a cluster, st.async + mbarrier exchange)'
    """
    out = []
    for c in cases():
        if arch < c.arch:
            out.append(f"{c.name}: skipped (needs sm_{c.arch}; {c.what})")
        else:
            out.append(
                f"{c.name}: {c.what}; run, checked against numpy, timed" + (" beside its peer" if c.peer else "")
            )
    return out + [f"{name}: no case ({why})" for name, why in PENDING.items()]


def run_path(case: PathCase, target: str, gpu, small: bool, arch: int = 90, timer=None) -> dict:
    """One path: its record (outcome, error against numpy over the tolerance, µs and the peer's)."""
    rec = {"path": case.name, "what": case.what}
    if arch < case.arch:
        return rec | {"outcome": "skipped", "detail": f"needs sm_{case.arch}"}
    k, arrays, ref, tol = case.build(target, gpu, small)
    if not case.shows(k):
        return rec | {"outcome": "failed", "detail": "the plan does not take the path:\n" + k.explain()}
    dev = arrays
    if target == "cuda":
        import cupy as cp

        dev = [cp.asarray(a) for a in arrays]
    out = k(*dev)
    out = np.asarray(out.get() if hasattr(out, "get") else out)
    err = float(np.abs(out.astype(np.float64) - ref).max())
    ok = err <= tol if tol else np.array_equal(out, ref)
    rec |= {"outcome": "passed" if ok else "failed", "error": err, "tolerance": tol, "kernel": _mapping(k).name}
    if timer is not None and ok:
        rec["us"] = timer(lambda: k(*dev))
        peer = case.peer(dev) if case.peer else None
        if peer is not None:
            rec["peer"], rec["peer_us"] = peer[0], timer(peer[1])
    return rec


def run_paths(target: str = "cuda", small: bool = False, timed: bool = True) -> list[dict]:
    """Every path on `target`: on "cuda" the device's own spec, and timings where `timed`; on
    "emulator" H100's plans, untimed. A path that raises is a failed record naming the error."""
    from .model import H100

    gpu, arch, timer = H100, 90, None
    if target == "cuda":
        from .bench.runner import measure_us
        from .model import detect

        gpu = detect.detect()
        if gpu is None:
            return [{"path": "*", "outcome": "failed", "detail": "no CUDA device that CuPy sees (model.detect)"}]
        import cupy as cp

        props = cp.cuda.runtime.getDeviceProperties(0)
        arch = 10 * props["major"] + props["minor"]
        timer = (lambda run: measure_us(run, gpu)) if timed else None  # noqa: E731
    recs = []
    for c in cases():
        try:
            recs.append(run_path(c, target, gpu, small, arch, timer))
        except Exception as e:  # one path's failure must not hide the others'
            recs.append({"path": c.name, "what": c.what, "outcome": "failed", "detail": f"{type(e).__name__}: {e}"})
    return recs


def table(records: list[dict]) -> str:
    """Markdown: one row per path.

    >>> print(table([{"path": "p", "outcome": "passed", "error": 0.0, "tolerance": 1e-6, "us": 5.0,
    ...               "peer": "cupy.sum (CUB)", "peer_us": 6.0}]).splitlines()[-1])
    | p | passed | 0 / 1e-06 | 5.0 | cupy.sum (CUB) | 6.0 | 0.83 |
    """
    lines = [
        "| path | outcome | error / tolerance | us | peer | peer us | us / peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        us, pus = r.get("us"), r.get("peer_us")
        err = f"{r['error']:.3g} / {r['tolerance']:.3g}" if "error" in r else r.get("detail", "").splitlines()[0]
        lines.append(
            f"| {r['path']} | {r['outcome']} | {err} | {f'{us:.1f}' if us else '-'} | {r.get('peer', '-')} | "
            f"{f'{pus:.1f}' if pus else '-'} | {f'{us / pus:.2f}' if us and pus else '-'} |"
        )
    return "\n".join(lines)
