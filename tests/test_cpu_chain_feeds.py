"""A chained CPU model's per-run arrays (subgraph/cpu_chain.Chain.run): feeds read in place when
C-contiguous and aligned (copied otherwise), outputs written into fresh arrays (never a resident buffer
a later run rewrites), the per-run feed check still naming the bad input; an exported model the same
as onnxruntime on the in-place path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cpu_chain import _check, _se_model
from test_exported_models import feeds_for, ort_bounds

from panamera.errors import DTypeError, InputError
from panamera.subgraph.optimizer import optimize

MODELS = Path(__file__).parent / "data" / "models"


def _chained(rng):
    opt = optimize(_se_model(rng), target="cpu")
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    for _ in range(2):  # the second run builds the chain
        opt.run({"x": x}, threads=1)
    chain = opt._chain[1]
    assert chain is not None and set(chain.in_place) == {"x", "y"}
    return opt, chain


def test_outputs_are_fresh_and_feeds_are_not_kept(rng):
    opt, chain = _chained(rng)
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    first = opt.run({"x": x}, threads=1)
    want = first["y"].copy()
    _check(opt, {"x": x}, first)
    x2 = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    second = opt.run({"x": x2}, threads=1)
    _check(opt, {"x": x2}, second)
    np.testing.assert_array_equal(first["y"], want)  # a later run never writes an earlier result
    assert not np.shares_memory(first["y"], second["y"])
    assert not any(np.shares_memory(second["y"], r) for r in chain.resident.values())
    x2[:] = 7.0  # the caller's feed changed after the run: the result stays
    _check(opt, {"x": x.copy()}, {"y": want})
    third = opt.run({"x": x2}, threads=1)
    _check(opt, {"x": x2}, third)
    assert all(c.ok for c in opt.verify())  # `keep=` of inner values: copied out of their resident arrays


@pytest.mark.parametrize("layout", ["fortran", "strided", "read-only", "unaligned"])
def test_feeds_the_chain_cannot_read_in_place_are_copied(rng, layout):
    opt, _ = _chained(rng)
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    if layout == "fortran":
        feed = np.asfortranarray(x)
    elif layout == "strided":
        feed = np.repeat(x, 2, axis=3)[..., ::2]
    elif layout == "read-only":
        feed = x.copy()
        feed.flags.writeable = False
    else:
        raw = np.empty(x.nbytes + 1, np.uint8)[1:]
        feed = np.ndarray(x.shape, np.float32, raw.data)
        feed[...] = x
        assert not feed.flags.aligned
    np.testing.assert_array_equal(feed, x)
    want = opt.run({"x": x}, threads=1)["y"]
    np.testing.assert_array_equal(opt.run({"x": feed}, threads=1)["y"], want)
    np.testing.assert_array_equal(opt.run({"x": x}, threads=1)["y"], want)  # in place again after a copy


def test_bad_feeds_after_the_chain_still_name_the_input(rng):
    opt, _ = _chained(rng)
    x = rng.standard_normal((2, 8, 8, 8))
    with pytest.raises(DTypeError, match="'x'.*float32"):
        opt.run({"x": x})
    with pytest.raises(DTypeError, match="'x'"):
        opt.run({"x": x.astype(">f4")})
    with pytest.raises(InputError, match="'x'.*shape"):
        opt.run({"x": x[:1].astype(np.float32)})
    with pytest.raises(InputError, match="missing"):
        opt.run({})
    with pytest.raises(InputError, match="unknown.*'z'"):
        opt.run({"x": x.astype(np.float32), "z": x})
    with pytest.raises(InputError, match="'x'.*expected an array"):
        opt.run({"x": x.tolist()})


def test_exported_mobilenet_in_place_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    path = MODELS / "mobilenetv3-torchscript.onnx"
    feeds = feeds_for(path)
    opt = optimize(path.read_bytes(), target="cpu")
    for _ in range(2):
        opt.run(feeds, threads=1)
    assert opt._chain[1] is not None and opt._chain[1].in_place
    got = opt.run(feeds, threads=1)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    bounds = ort_bounds(path, feeds, list(expected))
    for k, want in expected.items():
        r, a = bounds[k]
        err = np.abs(got[k].astype(np.float64) - want)
        assert (err <= 2 * (a + r * np.abs(want))).all(), f"output {k}: max |error| {err.max():.3g}"
