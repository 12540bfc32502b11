"""Dynamic shared memory (schedule/dynsmem.py): the emulator gives each block its own buffer of the
launch's bytes (past the 48 KiB of static shared memory), refuses a kernel launched without them or
with more than its arena; the decision carries the bytes (JSON), the plan passes them at launch, and
the preconditions refuse a plan whose bytes are not its stages' (1) or are over the device's opt-in
maximum (2). The held tiles of BatchNorm backward NHWC (tests/test_hold.py) are checked against numpy
float64 there; here their static and dynamic bytes against ptxas's report."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
from conftest import need_nvcc

import panamera as pn
from panamera.bench.train_suite import batch_norm_backward
from panamera.codegen.header import PRELUDE
from panamera.errors import BackendError, ScheduleError
from panamera.model.gpu import A100, H100
from panamera.poly.statement import Form
from panamera.runtime import emulator, nvcc
from panamera.schedule import dynsmem
from panamera.schedule.decision import Decision
from panamera.schedule.hold import hold_bytes, static_bytes
from panamera.schedule.persistent import map_joined

KEEP = r"""
// Each block fills n floats of its dynamic shared memory, waits for every block (a grid-wide wait: the
// other blocks run meanwhile on the emulator), then copies them out: each block must find its own.
extern "C" __global__ void keep(float* out, unsigned* arrived, int n) {
  PN_DYNAMIC_SHARED(pn_dsmem);
  float* const s = reinterpret_cast<float*>(pn_dsmem);
  for (int k = threadIdx.x; k < n; k += blockDim.x) s[k] = blockIdx.x * 100000.f + k;
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(arrived, 1u);
  pn_grid_wait(arrived, gridDim.x);
  for (int k = threadIdx.x; k < n; k += blockDim.x) out[blockIdx.x * n + k] = s[k];
}
"""
N = 15 * 1024  # 60 KiB of floats a block: past the 48 KiB of static shared memory


def _keep(shared: int, blocks: int = 3) -> np.ndarray:
    lib = emulator.build(PRELUDE + KEEP, {"keep": ["float*", "unsigned*", "int"]})
    out, arrived = np.zeros(blocks * N, np.float32), np.zeros(1, np.uint32)
    args = [ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(arrived.ctypes.data), ctypes.c_int(N)]
    emulator.launch(lib, "keep", (blocks, 1, 1), (64, 1, 1), args, "shuffled", seed=5, cooperative=True, shared=shared)
    return out


def test_each_block_keeps_its_own_dynamic_shared_memory_across_a_grid_wide_wait():
    want = (np.arange(3)[:, None] * 100000.0 + np.arange(N)[None, :]).astype(np.float32).reshape(-1)
    assert np.array_equal(_keep(N * 4), want)


def test_a_kernel_launched_without_its_dynamic_shared_memory_fails():
    with pytest.raises(BackendError, match=r"keep: extern __shared__: .*launched with none"):
        _keep(0)


def test_more_dynamic_shared_memory_than_the_emulators_arena_fails():
    with pytest.raises(BackendError, match=r"keep: dynamic shared memory: more bytes than .*256 KB arena"):
        _keep(257 * 1024)


BOTH = r"""
extern "C" __global__ void both(float* out) {
  PN_BLOCK_SHARED(float, pn_rows, [10 * 1024]);  // 40 KiB, each block's own
  PN_DYNAMIC_SHARED(pn_dsmem);
  float* const d = reinterpret_cast<float*>(pn_dsmem);
  pn_rows[threadIdx.x] = 1.f;
  d[threadIdx.x] = 2.f;
  out[threadIdx.x] = pn_rows[threadIdx.x] + d[threadIdx.x];
}
"""


def test_block_shared_and_dynamic_shared_memory_never_overlap():
    """Each block's PN_BLOCK_SHARED arrays and its dynamic shared memory are apart, whatever their sum
    (a GPU's opt-in maximum is the plan's precondition 2, not the emulator's)."""
    lib = emulator.build(PRELUDE + BOTH, {"both": ["float*"]})
    out = np.zeros(32, np.float32)
    for shared in (200 * 1024, 240 * 1024):
        out[:] = 0
        emulator.launch(lib, "both", (2, 1, 1), (32, 1, 1), [ctypes.c_void_p(out.ctypes.data)], shared=shared)
        assert (out == 3).all()


TWO = r"""
extern "C" __global__ void rows(float* out) {  // another kernel's block-shared rows: 160 KiB
  PN_BLOCK_SHARED(float, pn_rows, [40 * 1024]);
  pn_rows[threadIdx.x] = 1.f;
  out[threadIdx.x] = pn_rows[threadIdx.x];
}
extern "C" __global__ void held(float* out) {  // 192 KiB of dynamic shared memory, no block-shared array
  PN_DYNAMIC_SHARED(pn_dsmem);
  float* const d = reinterpret_cast<float*>(pn_dsmem);
  d[48 * 1024 - 1 - threadIdx.x] = 2.f;
  out[threadIdx.x] = d[48 * 1024 - 1 - threadIdx.x];
}
"""


def test_a_kernels_dynamic_shared_memory_is_not_taken_by_another_kernels_block_shared_arrays():
    """PN_BLOCK_SHARED offsets are fixed per library (all its kernels' declarations in turn): one
    kernel's 160 KiB of rows must not leave another kernel of the same program too little room for
    its own 192 KiB of dynamic shared memory (a training program holds both kinds)."""
    lib = emulator.build(PRELUDE + TWO, {"rows": ["float*"], "held": ["float*"]})
    out = np.zeros(32, np.float32)
    arg = [ctypes.c_void_p(out.ctypes.data)]
    emulator.launch(lib, "rows", (2, 1, 1), (32, 1, 1), arg)
    assert (out == 1).all()
    emulator.launch(lib, "held", (2, 1, 1), (32, 1, 1), arg, shared=192 * 1024)
    assert (out == 2).all()
    emulator.launch(lib, "held", (3, 1, 1), (32, 1, 1), arg, "shuffled", cooperative=True, shared=192 * 1024)
    assert (out == 2).all()


def test_the_raw_kernel_compiles_with_nvcc():
    need_nvcc()
    (res,) = nvcc.compile_cuda(PRELUDE + KEEP, archs=("sm_90",))
    assert res.shared_bytes == 0 and res.spill_stores == 0  # all of it dynamic: none static


def test_the_decision_carries_its_bytes_in_json_only_when_it_has_some():
    d = Decision(statements=("S0",), form=Form.ROW, M=8, N=64, stitched=False, vec=1, tx=64, ty=1, split=1,
                 chunk=64, grid=(8, 1), unroll=1, merges=(), access=(), levels=(0,))  # fmt: skip
    assert "dynamic_smem" not in d.to_dict()
    held = dataclasses.replace(d, dynamic_smem=65536)
    assert held.to_dict()["dynamic_smem"] == 65536 and Decision.from_dict(held.to_dict()) == held
    assert "dynamic-smem=65536" in held.describe()


def test_precondition_1_a_plan_no_stage_carves_asks_for_none():
    """A softmax's stitched plan carves nothing: a saved decision asking for dynamic shared memory is refused."""
    x = pn.placeholder((8, 256), name="x")
    k = pn.compile(pn.nn.softmax(x), target="emulator")
    s = k.schedule
    bad = dataclasses.replace(s, kernels=(dataclasses.replace(s.kernels[0], dynamic_smem=1024),))
    with pytest.raises(ScheduleError, match=r"dynamic_smem=1024 bytes .*carve 0 \(1\)"):
        pn.compile(pn.nn.softmax(x), target="emulator", schedule=bad)


def _bench(gpu):
    k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=gpu, use_database=False)
    return k.groups[0], map_joined(k.groups[0], gpu).decision


def test_precondition_1_the_bytes_are_the_held_tiles():
    group, d = _bench(H100)
    tree = static_bytes(group, d)
    dynsmem.check(H100, d, hold_bytes(group, d), tree, "bench")
    with pytest.raises(ScheduleError, match=r"bench: dynamic_smem=196592 bytes .*carve 196608 \(1\)"):
        dynsmem.check(
            H100, dataclasses.replace(d, dynamic_smem=d.dynamic_smem - 16), hold_bytes(group, d), tree, "bench"
        )


def test_precondition_2_over_the_devices_opt_in_maximum():
    """The H100's held plan (16 KiB static + 192 KiB dynamic) is over an A100's 163 KiB opt-in."""
    group, d = _bench(H100)
    tree = static_bytes(group, d)
    with pytest.raises(ScheduleError, match=r"196608 bytes .*beside 16400 static: over the 166912 bytes .*A100.*\(2\)"):
        dynsmem.check(A100, d, hold_bytes(group, d), tree, "bench")


def test_the_bench_kernels_static_shared_memory_is_the_column_tree():
    """ptxas's static shared memory of the H100 bench kernel is what the preconditions count beside the
    dynamic bytes (`static_bytes`), and the two stay within the opt-in maximum."""
    need_nvcc()
    k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=H100, use_database=False)
    (m,) = k.mappings
    (res,) = [r for r in nvcc.compile_cuda(k.source, archs=("sm_90",)) if r.kernel == m.name]
    assert res.shared_bytes == static_bytes(k.groups[0], m) == 16384 + 16  # the column tree and pn_is_last
    assert res.shared_bytes + m.dynamic_smem <= dynsmem.opt_in(H100)


class _FakeKernel:
    """CuPy's RawKernel as the CUDA backend uses it: the opt-in attribute (48 KiB less the kernel's
    static bytes until raised: cudaFuncAttributeMaxDynamicSharedMemorySize), plain and cooperative
    launches; every call recorded."""

    def __init__(self, calls: list, name: str):
        self.calls, self.name, self.raised = calls, name, []
        self._max = dynsmem.STATIC_BYTES - 16400

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, v: int) -> None:
        self.raised.append(v)
        self._max = v

    def __call__(self, grid, block, args, *, shared_mem=0):
        self.calls.append((self.name, False, shared_mem))

    @property
    def kernel(self):
        def launch(grid, block, args, shared_mem=0, enable_cooperative_groups=False):
            self.calls.append((self.name, enable_cooperative_groups, shared_mem))

        return launch


def test_the_cuda_backend_opts_in_and_passes_the_bytes_at_each_launch(monkeypatch):
    """runtime/executor.py `_run_cuda` with a fake CuPy (no GPU here): a launch past the kernel's
    default maximum raises the attribute once to its bytes, before it, and passes `shared_mem=` to
    plain and cooperative launches alike; a launch of none passes 0 and raises nothing."""
    import sys
    import types

    from panamera.runtime import executor as ex
    from panamera.runtime.plan import BufferRole, BufferSpec, Launch, LaunchPlan, LaunchRole

    calls: list = []
    kernels = {n: _FakeKernel(calls, n) for n in ("big", "coop", "none")}
    module = types.SimpleNamespace(get_function=lambda n: kernels[n])
    stream = types.SimpleNamespace(ptr=0)
    cuda = types.SimpleNamespace(
        Device=lambda *a: types.SimpleNamespace(id=0), get_current_stream=lambda: stream, driver=None
    )
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda, empty=np.empty))
    monkeypatch.setattr(ex.cuda_backend, "module", lambda source: module)
    buf = {"ws": BufferSpec("ws", "float", None, 4, BufferRole.PARTIALS)}
    launches = (
        Launch("big", (2, 1, 1), (32, 1, 1), (("buf", "ws"),), LaunchRole.MAP, dynamic_smem_bytes=196608),
        Launch("coop", (2, 1, 1), (32, 1, 1), (("buf", "ws"),), LaunchRole.MAP, 100000, cooperative=True),
        Launch("none", (2, 1, 1), (32, 1, 1), (("buf", "ws"),), LaunchRole.MAP),
    )
    e = ex.Executor(LaunchPlan(launches, buf), "", tuple((n, ("float*",)) for n in kernels), "cuda")
    e._run_cuda([])
    e._run_cuda([])
    assert calls == [("big", False, 196608), ("coop", True, 100000), ("none", False, 0)] * 2
    assert kernels["big"].raised == [196608] and kernels["coop"].raised == [100000] and not kernels["none"].raised
