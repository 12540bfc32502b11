"""The CPU bench's implementations as built inside a worker process (panamera/bench/cpu_isolated.py):
`build(impl, workload, threads)` returns (a callable running one call, a picklable info dict).

Every worker derives the same inputs from the workload's name (`inputs`), sets its own library's
thread count for the call (Panamera by `threads=`, numpy's BLAS through threadpoolctl, torch by
`torch.set_num_threads`, onnxruntime by `intra_op_num_threads` with its spinning off), and only
Panamera's worker checks its result against the recipe in float64 numpy and reports the model's
time (its info: modeled_us, limit_us, max_rel_err, tolerance, correct, plan).

>>> fn, info = build("numpy", "sum all 4096", 1)
>>> info["threads"], fn().shape
(1, ())
"""

from __future__ import annotations

import zlib

import numpy as np

from ..errors import OptionError
from .cpu_isolated import ORT_NO_SPIN

IMPLS = ("panamera", "numpy", "torch eager", "torch.compile", "onnxruntime")
_last: dict = {}  # the last workload's compiled Panamera program (both thread counts reuse it)


def find_workload(name: str):
    """The CPU bench's workload (cpu_workloads() or tiny_cpu()) called `name`."""
    from .cpu_recipes import cpu_workloads, tiny_cpu

    found = {w.name: w for w in [*cpu_workloads(), *tiny_cpu()]}
    if name not in found:
        raise OptionError(
            f"the CPU bench has no workload {name!r} (panamera/bench/cpu_recipes.py: cpu_workloads, tiny_cpu)"
        )
    return found[name]


def inputs(w) -> list[np.ndarray]:
    """The workload's inputs, the same in every worker (seeded by its name)."""
    from .cpu_measure import _inputs

    return _inputs(w, np.random.default_rng(zlib.crc32(w.name.encode())))


def _set_blas(n: int) -> None:
    from ..runtime.blas_threads import loaded_blas

    for lib in loaded_blas():
        lib.set_num_threads(n)


def build(impl: str, workload: str, threads: int, ort_spin: bool = False) -> tuple:
    """(call, info) of implementation `impl` (one of IMPLS) on the named workload at `threads`;
    `ort_spin`: onnxruntime keeps its default spinning (to compare with Pool(passive=False))."""
    w = find_workload(workload)
    arrays = inputs(w)
    _set_blas(threads)  # numpy's own BLAS pool on `threads` (Panamera's gemm calls and the numpy peer's matmul)
    info = {"threads": threads}
    if impl == "panamera":
        return _panamera(w, arrays, threads, info)
    if impl == "numpy":
        from .cpu_recipes import NumpyBackend

        nb = NumpyBackend()
        return (lambda: w.recipe(nb, *arrays)), info
    if impl in ("torch eager", "torch.compile"):
        import torch

        from .cpu_measure import _tensor
        from .cpu_recipes import TorchBackend

        torch.set_num_threads(threads)
        tb, ts = TorchBackend(), [_tensor(torch, a) for a in arrays]
        if impl == "torch eager":

            def eager():
                with torch.no_grad():
                    return w.recipe(tb, *ts)

            return eager, info
        torch._dynamo.reset()
        fn = torch.compile(lambda *xs: w.recipe(tb, *xs))
        with torch.no_grad():
            fn(*ts)
        return (lambda: fn(*ts)), info
    if impl == "onnxruntime":
        import onnxruntime as ort

        from .cpu_recipes import OnnxBackend

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.log_severity_level = 3
        for k, v in ({} if ort_spin else ORT_NO_SPIN).items():
            so.add_session_config_entry(k, v)
        sess = ort.InferenceSession(OnnxBackend().model(w), so, providers=["CPUExecutionProvider"])
        feed = {f"x{k}": a for k, a in enumerate(arrays)}
        return (lambda: sess.run(None, feed)), {**info, "session_config": dict(ORT_NO_SPIN)}
    raise OptionError(f"no CPU bench implementation {impl!r}: one of {', '.join(IMPLS)}")


def probe() -> tuple:
    """(a no-op, {"model": the CPU model's description}): the CPU model as this worker has it,
    probed under the worker's OpenMP wait policy (runtime/cpu_probe.py keys the probe by it), which
    is the model every Panamera build in this worker reports (`modeled_us`)."""
    from ..cpu_target import cpu_model

    return (lambda: None), {"model": cpu_model().describe()}


def _panamera(w, arrays, threads: int, info: dict) -> tuple:
    from ..compiler import compile as pn_compile
    from ..frontend.tensor import placeholder
    from .cpu_measure import _tuple, check
    from .cpu_recipes import NumpyBackend, PanameraBackend

    if _last.get("name") != w.name:
        _last.clear()
        holders = [placeholder(s, d, name=f"x{k}") for k, (s, d) in enumerate(zip(w.shapes, w.input_dtypes))]
        k = pn_compile(list(_tuple(w.recipe(PanameraBackend(), *holders))), target="cpu")
        ref = w.recipe(NumpyBackend(ref=True), *[a.astype(np.float64) for a in arrays])
        err, tol, ok = check(k(*arrays), ref, w.reduced)
        _last.update(name=w.name, k=k, check={"max_rel_err": err, "tolerance": tol, "correct": ok})
    k = _last["k"]
    m = k.modeled(threads)
    info = {**info, **_last["check"], "modeled_us": round(m.total_us, 2), "limit_us": round(m.limit_us, 2),
            "plan": [d.describe() for d in k.decisions]}  # fmt: skip
    return (lambda: k(*arrays, threads=threads)), info
