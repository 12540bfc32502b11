"""Each implementation of the CPU bench in its own worker process, timed inside it, rounds
interleaved by the parent, the idle workers' thread pools asleep.

Why: in one process the libraries' worker pools (OpenMP in Panamera's kernels and in torch/MKL,
onnxruntime's intra-op pool, OpenBLAS's pthreads) spin for a while after each parallel run, on the
cores the next implementation measured needs (Panamera's bert at 2 threads: 46 us median alone,
273 us interleaved in one process). Here:

- One worker process per implementation (`Pool`), spawned once per bench run, started with
  `PASSIVE_ENV`: libgomp (Panamera's kernels; torch's ATen and MKL, which run on torch's bundled
  libgomp) parks idle threads at once with OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT=0 (libgomp
  manual, "GOMP_SPINCOUNT": 0 spins when the policy is PASSIVE); an LLVM/Intel OpenMP runtime with
  KMP_BLOCKTIME=0 (LLVM D18577: PASSIVE means blocktime 0 there too); numpy's OpenBLAS (pthreads
  build) with OPENBLAS_THREAD_TIMEOUT=4, its shortest idle spin (2^4 cycles; OpenBLAS's
  "runtime variables"); onnxruntime by its session option `session.intra_op.allow_spinning` = "0"
  (onnxruntime docs, "Thread management"; set by cpu_impls.build and cpu_models.build), since its
  pool reads no environment variable.
- Thread counts are set inside the worker for each workload: Panamera by `threads=`, numpy's BLAS
  through threadpoolctl, torch by `torch.set_num_threads`, onnxruntime by `intra_op_num_threads`.
- The parent sends "time this many calls" to one worker at a time, every worker once per round in
  an order shuffled per round (drift and bursts of outside load hit all alike); the worker times
  each call with perf_counter_ns (after untimed ones, below) and answers the mean, its fastest
  call, and the CPU time its process used while it sat idle since its previous sample
  (`idle_cpu_us`: near 0 when its pools really sleep; results.json keeps it, the evidence that the
  knobs held).
- Each sample starts with as many untimed calls as it times, at least WARM_CALLS: between two
  samples of a worker the others stream their own copies of the workload (and their temporaries)
  through the caches, so the first calls find its data evicted, and on this VM a 25 MB input takes
  a few calls to be served at the warm rate again. Timed cold, a sample of one call (every
  workload over ~1 ms) read A2#7 [64x128x768] at 1930 us in bench/cpu (2026-11-25 02:50, idle)
  against 940-975 us warm in one process (load 1-2); in one process after a 256 MB stream its
  calls took 2035, 5864, 1640, 1148, 1066, 986 us (medians of 8, load 3). In this harness (load
  4-8, 8 rounds, panamera/numpy/torch eager) its median was 1721-5802 us after one untimed call and
  969-1129 after four. The model, like samples of many calls, describes warm data.
- Measured here (2 cores, load average 4-9 from other sessions, 9 rounds, 2 threads; median us):
  with the libraries' default spinning instead, Panamera's softmax [6144x128] took 16748 (448
  passive), sum row 768x768 23910 (73), torch eager's layer_norm [1024x768] 6260 (397): a team
  thread descheduled by another process leaves its partner spinning at every barrier, and
  onnxruntime's idle pool burned 12-23 ms of CPU during the other workers' samples (0.1 ms
  passive). Waking a sleeping team costs a call ~10-120 us on this loaded VM, charged to every
  multi-threaded implementation alike.
- Not pinned: at every core each worker needs all of them, and at one thread a worker pinned to a
  core would queue behind whatever else runs there while the other core idles; only one worker
  runs at a time, so they never contend with each other.

A worker builds its implementation from a factory named "module:function" (importable in the
worker) called with picklable keyword arguments; it returns (a callable, a picklable info dict).

Skipped as a doctest (it starts processes; tests/test_cpu_isolated.py runs the same):

>>> with Pool(["a", "b"]) as pool:  # doctest: +SKIP
...     loaded = pool.load({k: ("panamera.bench.cpu_isolated:counter", {"tag": k}) for k in pool.workers})
...     res = pool.measure(rounds=3, min_sample_s=0.0)
>>> sorted(res), loaded["a"].info["tag"], res["a"]["calls"]  # doctest: +SKIP
(['a', 'b'], 'a', 3)
"""

from __future__ import annotations

import importlib
import os
import pickle
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PanameraError

PASSIVE_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "GOMP_SPINCOUNT": "0",
    "KMP_BLOCKTIME": "0",
    "OPENBLAS_THREAD_TIMEOUT": "4",
}
ORT_NO_SPIN = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
MAX_INNER = 1000  # calls per sample at most
WARM_CALLS = 4  # untimed calls before a sample at least (as many as it times where more: module docstring)


class WorkerError(PanameraError):
    """A bench worker process died or answered out of turn (its stderr tail is in the message)."""


@dataclass(frozen=True)
class Loaded:
    """A worker's answer to a load: `error` (type: message) where its factory raised, else the
    factory's info and the time of one call after a warm-up one."""

    info: dict = field(default_factory=dict)
    one_call_us: float = 0.0
    error: str | None = None
    refused: bool = False  # the factory raised a PanameraError (the workload refused, not a crash)


# ---- the worker's side --------------------------------------------------------------------------


def _factory(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def serve(inp, out) -> None:
    """The worker's loop: answer ("load", factory, kwargs), ("time", calls) and ("quit",)."""
    fn, idle_since, calls, warm = None, None, 0, 0
    while True:
        msg = pickle.load(inp)
        op = msg[0]
        if op == "quit":
            return
        if op == "load":
            fn, idle_since, calls, warm = None, None, 0, 0
            try:
                fn, info = _factory(msg[1])(**msg[2])
                fn()  # warm-up
                t0 = time.perf_counter_ns()
                fn()
                reply = ("ok", info, (time.perf_counter_ns() - t0) / 1e3)
            except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
                fn = None
                reply = ("error", f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
                         isinstance(e, PanameraError))  # fmt: skip
        elif op == "time":
            idle_cpu = (time.process_time() - idle_since) * 1e6 if idle_since is not None else 0.0
            for _ in range(max(WARM_CALLS, msg[1])):
                fn()  # untimed: the other workers' samples evicted this one's data (module docstring)
                warm += 1
            total, best = 0, None
            for _ in range(msg[1]):
                t0 = time.perf_counter_ns()
                fn()
                dt = time.perf_counter_ns() - t0
                total, best = total + dt, dt if best is None else min(best, dt)
            calls += msg[1]
            reply = ("ok", total / msg[1] / 1e3, best / 1e3, idle_cpu, calls, warm)
            idle_since = time.process_time()
        else:
            reply = ("error", f"unknown request {op!r}", False)
        pickle.dump(reply, out)
        out.flush()


def main() -> None:
    """`python -m panamera.bench.cpu_isolated`: a worker on stdin/stdout. The protocol keeps the
    original stdout; fd 1 then points at stderr, so a library's prints cannot corrupt it."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, out)


# ---- a stand-in implementation (tests, smoke runs) ----------------------------------------------


def counter(tag: str = "", fail: str = "", refuse: bool = False, die: bool = False, hang_s: float = 0.0) -> tuple:
    """A stand-in implementation: a callable counting its calls; its info echoes `tag`, this
    worker's process id and its wait-policy environment; `fail` raises a ValueError with that
    message, `refuse` a PanameraError, `die` ends the worker process, `hang_s` sleeps that long."""
    time.sleep(hang_s)
    if die:
        sys.stderr.write("the stand-in exits\n")
        sys.stderr.flush()
        os._exit(3)
    if refuse:
        raise PanameraError("refused by the stand-in")
    if fail:
        raise ValueError(fail)
    n = [0]

    def fn():
        n[0] += 1

    return fn, {"tag": tag, "pid": os.getpid(), "env": {k: os.environ.get(k) for k in PASSIVE_ENV}}


# ---- the parent's side --------------------------------------------------------------------------


class _Worker:
    def __init__(self, name: str, env: dict):
        self.name = name
        self.log = tempfile.TemporaryFile()  # its stderr: a file, so that a chatty library never blocks on a pipe
        self.proc = subprocess.Popen([sys.executable, "-m", "panamera.bench.cpu_isolated"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env)  # fmt: skip

    def send(self, *msg) -> None:
        try:
            pickle.dump(msg, self.proc.stdin)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise self._died(e) from None

    def receive(self, timeout_s: float):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise self._died(TimeoutError(f"no answer within {timeout_s:g} s"))
        try:
            return pickle.load(self.proc.stdout)
        except (EOFError, pickle.UnpicklingError, OSError) as e:
            raise self._died(e) from None

    def _died(self, e) -> WorkerError:
        self.proc.kill()
        self.proc.wait()
        self.log.seek(max(0, self.log.seek(0, os.SEEK_END) - 600))
        tail = self.log.read().decode(errors="replace")
        return WorkerError(f"bench worker {self.name!r} failed ({type(e).__name__}: {e}); its stderr ends:\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=10)
            except (WorkerError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.log.close()


def worker_env(extra: dict | None = None, passive: bool = True) -> dict:
    """The workers' environment: this process's, this package first on PYTHONPATH, PASSIVE_ENV
    (`passive`; else without those variables: the libraries' default spinning)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    base = {k: v for k, v in os.environ.items() if k not in PASSIVE_ENV}
    return {**base, "PYTHONPATH": path, **(PASSIVE_ENV if passive else {}), **(extra or {})}


class Pool:
    """One worker process per implementation name; a context manager that ends them. `passive`
    False: the workers keep the libraries' default spinning (for comparison; see above).
    `log` records (worker, request) in the order sent (the tests check the interleaving)."""

    LOAD_S, SAMPLE_S = 1800.0, 600.0  # a worker silent longer than this (a build, a sample) is ended

    def __init__(self, names, env: dict | None = None, passive: bool = True):
        e = worker_env(env, passive)
        self.workers = {n: _Worker(n, e) for n in names}
        self.loaded: dict[str, Loaded] = {}
        self.log: list[tuple[str, str]] = []

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for w in self.workers.values():
            w.close()

    def load(self, specs: dict[str, tuple[str, dict]]) -> dict[str, Loaded]:
        """Build each named worker's implementation from (factory, kwargs), all of them at once;
        a worker whose build failed is left out of `measure`, one not named keeps what it holds."""
        for name, (factory, kwargs) in specs.items():
            self.log.append((name, "load"))
            self.workers[name].send("load", factory, kwargs)
        out = {}
        for name in specs:
            r = self.workers[name].receive(self.LOAD_S)
            out[name] = Loaded(r[1], r[2]) if r[0] == "ok" else Loaded(error=r[1], refused=r[2])
        self.loaded = {k: v for k, v in {**self.loaded, **out}.items() if v.error is None}
        return out

    def measure(self, rounds: int, min_sample_s: float) -> dict:
        """Median, p25, p75 and min (us per call) of each loaded implementation's samples over
        `rounds` rounds, each sample the mean of >= `min_sample_s` of calls timed in its worker;
        every worker once a round in a shuffled order; `fastest_call_us`: its fastest call;
        `idle_cpu_us`: the median CPU time a worker used while the
        others ran, `calls`: the calls it timed, `warm_calls`: the untimed ones
        made before its samples, in all."""
        inner = {k: max(1, min(MAX_INNER, int(min_sample_s / max(v.one_call_us * 1e-6, 1e-7))))
                 for k, v in self.loaded.items()}  # fmt: skip
        samples: dict[str, list] = {k: [] for k in self.loaded}
        names = list(self.loaded)
        for _ in range(rounds):
            random.shuffle(names)
            for k in names:
                self.log.append((k, "time"))
                self.workers[k].send("time", inner[k])
                r = self.workers[k].receive(self.SAMPLE_S)
                if r[0] != "ok":
                    raise WorkerError(f"bench worker {k!r}: {r[1]}")
                samples[k].append(r[1:])
        out = {}
        for k, s in samples.items():
            means = [x[0] for x in s]
            q = statistics.quantiles(means, n=4) if len(means) > 1 else [means[0]] * 3
            out[k] = {"median_us": statistics.median(means), "p25_us": q[0], "p75_us": q[2],
                      "min_us": min(means), "fastest_call_us": min(x[1] for x in s),
                      "idle_cpu_us": statistics.median(x[2] for x in s[1:] or s),
                      "calls": s[-1][3], "warm_calls": s[-1][4]}  # fmt: skip
        return out


if __name__ == "__main__":
    main()
