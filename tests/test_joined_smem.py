"""A joined-row kernel's shared memory is counted once (schedule/hold.py `joined_static_bytes`):
the bytes of the `__shared__` arrays its source declares, the cost's `shared_bytes` and the
residency check's count (`block_bytes`, with the held tiles' dynamic bytes) agree byte for byte on a
held-tile kernel (BatchNorm backward NHWC) and column-partials kernels (LayerNorm / RMSNorm
backward); ptxas's figure, where nvcc is found, is the same, less an array the kernel never reads."""

from __future__ import annotations

import re

import pytest
from conftest import need_nvcc

import panamera as pn
from panamera.bench.train_suite import batch_norm_backward, layer_norm_backward, rms_norm_backward
from panamera.model.gpu import H100
from panamera.runtime import nvcc
from panamera.schedule import hold, persistent
from panamera.schedule.cost import joined_cost
from panamera.schedule.decision import MergeMode
from panamera.schedule.derived import co_resident
from panamera.schedule.hold import block_bytes, static_bytes

CASES = {
    "held": lambda: batch_norm_backward((256, 56, 56, 256), True),  # 8 x 128 threads, 192 KiB of held tiles
    "partials": lambda: layer_norm_backward(4096, 1024, "bfloat16"),  # tree, row reductions, no flag
    "one-row": lambda: rms_norm_backward(4096, 8192, "bfloat16"),  # 1024 x 1: no tree, the row reduction's arrays
    "half-warp": lambda: layer_norm_backward(512, 64, "float32"),  # 16 x 64, atomics: the flag
}
SIZES = {"float": 4, "double": 8, "int": 4, "unsigned": 4}


def _joined(name: str):
    k = pn.compile(CASES[name](), target="emulator", gpu=H100, use_database=False)
    ((g, m),) = [(g, m) for g, m in zip(k.groups, k.mappings) if g.columns and m.persistent]
    return k, g, m


def declared_bytes(source: str, kernel: str, dynamic: bool) -> int:
    """The bytes of the static `__shared__` arrays `kernel`'s body declares, packed (4- and 8-byte
    types), up to the 16-byte boundary of the dynamic buffer where it has one."""
    body = source.split(f" {kernel}(", 1)[1].split('extern "C"', 1)[0]
    total = 0
    for t, n in re.findall(r"__shared__ (\w+) pn_\w+(?:\[(\d+)\])?;", body):
        total += SIZES[t] * int(n or 1)
    assert "PN_BLOCK_SHARED(" not in body
    return -(-total // 16) * 16 if dynamic else total


@pytest.mark.parametrize("name", list(CASES))
def test_the_declared_arrays_the_cost_and_the_residency_count_agree(name):
    k, g, m = _joined(name)
    d = m.decision
    static = static_bytes(g, d)
    assert declared_bytes(k.source, m.name, d.dynamic_smem > 0) == static
    assert block_bytes(g, d) == static + d.dynamic_smem
    assert dict(joined_cost(g, H100, d).features)["shared_bytes"] == block_bytes(g, d)
    if name == "held":
        assert d.hold and d.dynamic_smem and static == 16384 + 16  # the tree and the flag, to the dynamic buffer
    if name == "partials":
        assert MergeMode.PARTIALS_GRID in d.merges and static == 32768 + (32 + 8) * 4  # no flag


@pytest.mark.parametrize("name", ["held", "partials"])
def test_the_residency_checks_count_the_same_bytes(name, monkeypatch):
    """persistent.check's precondition 5 (every block of a grid-wide combine co-resident) and, for
    held tiles, `most_held` (precondition 7) ask `co_resident` about `block_bytes`."""
    _, g, m = _joined(name)
    d = m.decision
    seen = {}

    def spy(module):
        def co(gpu, threads, shared=0, min_blocks=0):
            seen.setdefault(module.__name__, []).append(shared)
            return co_resident(gpu, threads, shared, min_blocks)

        monkeypatch.setattr(module, "co_resident", co)

    spy(persistent)
    spy(hold)
    persistent.check(g, d, H100, False, "replayed")
    assert seen[persistent.__name__] == [block_bytes(g, d)]
    if name == "held":
        assert block_bytes(g, d) in seen[hold.__name__]  # the held count's own


@pytest.mark.parametrize("name", list(CASES))
def test_ptxas_reports_the_counted_bytes(name):
    need_nvcc()
    k, g, m = _joined(name)
    (res,) = [r for r in nvcc.compile_cuda(k.source, archs=("sm_90",)) if r.kernel == m.name]
    if name == "half-warp":  # rows of 16 threads: one of the row reduction's arrays is never read
        assert res.shared_bytes == static_bytes(g, m.decision) - 64 * 4
    else:
        assert res.shared_bytes == static_bytes(g, m.decision)
