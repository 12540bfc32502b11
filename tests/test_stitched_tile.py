"""Register tiles of stitched row groups (issue 21's KeyError): an RMSNorm or LayerNorm whose rows
share the weight loads across a tile (schedule/rtile.py) reads the row's statistics from the
registers the stitched group keeps them in, never from a buffer (codegen/thread_loop.py)."""

from __future__ import annotations

import dataclasses

import pytest
from test_stitched_split import assert_close, case

import panamera as pn
from panamera.compiler import lower
from panamera.schedule.mapping import map_group

SHAPES = [
    ("rms_norm", (16384, 256)),
    ("rms_norm", (32768, 256)),
    ("rms_norm", (32768, 512)),
    ("layer_norm", (32768, 256)),
]


def _norm(op: str, shape):
    n = shape[1]
    x, g = pn.placeholder(shape, "bfloat16", name="x"), pn.placeholder((n,), "bfloat16", name="g")
    if op == "rms_norm":
        return pn.nn.rms_norm(x, g)
    return pn.nn.layer_norm(x, g, pn.placeholder((n,), "bfloat16", name="b"))


@pytest.mark.parametrize("op,shape", SHAPES, ids=[f"{o}-{s[0]}x{s[1]}" for o, s in SHAPES])
def test_reported_shapes_generate(op, shape):
    """The shapes that raised KeyError generate their kernel (no GPU or nvcc needed)."""
    a = lower(_norm(op, shape), target="emulator", gpu=pn.model.H100)
    assert "__global__" in a.source


@pytest.mark.parametrize("op,R,C", [("rms_norm", 2, 2), ("rms_norm", 2, 1), ("layer_norm", 2, 1), ("layer_norm", 4, 1)])
def test_tiled_stitched_rows_match_numpy(op, R, C, rng):
    """The tile the model picks at those shapes, forced at a small one through a replayed schedule."""
    shape = (256 * R, 256)  # the tile's row stride is the row length (rtile.row_strides)
    outputs, arrays, ref = case(op, shape, "bfloat16", rng)
    base = pn.compile(outputs, target="emulator", use_database=False, cache=False)
    kernels = tuple(
        map_group(g, base.gpu, rtile=R, ctile=C).decision if g.stitched else m.decision
        for g, m in zip(base.groups, base.mappings)
    )
    k = pn.compile(outputs, target="emulator", schedule=dataclasses.replace(base.schedule, kernels=kernels))
    (m,) = [m for m in k.mappings if m.stitched]
    assert (m.rtile, m.ctile) == (R, C), m.describe()
    assert_close(k(*arrays), ref, "bfloat16", shape[1])
