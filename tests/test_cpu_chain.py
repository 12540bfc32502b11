"""A whole CPU model as one C call (subgraph/cpu_chain.py): a small MobileNet-like block (3x3 conv,
strided depthwise, squeeze-excite, a residual pointwise conv) runs unit by unit, then as a chain,
with the same values as the float64 reference; results are fresh arrays; a model with a unit the
chain cannot hold stays on the unit path; the profiler's table covers every step."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from panamera.subgraph import cpu_chain
from panamera.subgraph.optimizer import optimize
from panamera.subgraph.verify import reference_values


def _se_model(rng, one_d: bool = False) -> bytes:
    """x [2,8,8,8] -> Conv 3x3 + HardSwish -> depthwise 3x3 s2 + Relu -> squeeze-excite (ReduceMean,
    1x1 + Relu, 1x1 + HardSigmoid, Mul) -> 1x1 Conv + Add(residual) -> GlobalAveragePool -> Flatten;
    `one_d`: an extra 1-D Conv branch (numpy's host convolution: no C form) added to the output."""
    f = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    inits = {"w0": f(16, 8, 3, 3), "b0": f(16), "wd": f(16, 1, 3, 3), "bd": f(16), "w1": f(4, 16, 1, 1), "b1": f(4),
             "w2": f(16, 4, 1, 1), "b2": f(16), "w3": f(16, 16, 1, 1), "b3": f(16), "w4": f(16, 4, 3)}  # fmt: skip
    axes = numpy_helper.from_array(np.array([2, 3], np.int64), "axes")
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c0"], ["h0"]),
        helper.make_node("Conv", ["h0", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], strides=[2, 2], group=16),
        helper.make_node("Relu", ["cd"], ["hd"]),
        helper.make_node("ReduceMean", ["hd", "axes"], ["s0"], keepdims=1),
        helper.make_node("Conv", ["s0", "w1", "b1"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["s2"]),
        helper.make_node("Conv", ["s2", "w2", "b2"], ["s3"]),
        helper.make_node("HardSigmoid", ["s3"], ["s4"], alpha=1 / 6),
        helper.make_node("Mul", ["hd", "s4"], ["se"]),
        helper.make_node("Conv", ["se", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "hd"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    out = [16]
    if one_d:
        nodes[-1] = helper.make_node("Flatten", ["g"], ["y0"])
        nodes += [
            helper.make_node("Reshape", ["hd", "shape"], ["flat"]),
            helper.make_node("Conv", ["flat", "w4"], ["c4"], pads=[1, 1]),
            helper.make_node("ReduceMean", ["c4", "axis2"], ["m4"], keepdims=0),
            helper.make_node("Add", ["y0", "m4"], ["y"]),
        ]
        extra = [numpy_helper.from_array(np.array([2, 4, 64], np.int64), "shape"),
                 numpy_helper.from_array(np.array([2], np.int64), "axis2")]  # fmt: skip
    g = helper.make_graph(
        nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, *out])],
        [numpy_helper.from_array(a, k) for k, a in inits.items()] + [axes] + (extra if one_d else []),
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def _check(opt, feeds: dict, got: dict) -> None:
    """Every output against the float64 reference within float32 rounding of the block's sums
    (the longest: 72-term 3x3 conv, then a 16-term pointwise, a 16-pixel mean)."""
    wide, _, _ = reference_values(opt.model, feeds, list(got))
    for k, a in got.items():
        ref = wide[k]
        assert a.dtype == np.float32 and a.shape == ref.shape
        eps = float(np.finfo(np.float32).eps)
        bound = (72 + 16 + 16 + 8) * eps * 16 * max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(a.astype(np.float64), ref, rtol=0, atol=bound)


def test_model_runs_as_one_c_call_with_the_reference_values(rng):
    opt = optimize(_se_model(rng), target="cpu")
    assert all(u.node.op_type == "Conv" for u in opt.library)  # every 2-D Conv, the SE 1x1s too (route.host_c_conv)
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    first = opt.run({"x": x})  # unit by unit
    assert opt._chain == [None]
    second = opt.run({"x": x}, threads=1)  # unit by unit, then the chain is built from its values
    chain = opt._chain[1]
    assert chain is not None and {i.kind for i in chain.infos} == set(cpu_chain.StepKind)
    third, fourth = opt.run({"x": x}, threads=1), opt.run({"x": x}, threads=2)  # the chain
    for got in (first, second, third, fourth):
        _check(opt, {"x": x}, got)
    np.testing.assert_array_equal(
        third["y"], fourth["y"]
    )  # the host steps ignore threads=; the programs' reductions fixed
    assert not np.shares_memory(third["y"], fourth["y"])  # a later run never overwrites a result
    x2 = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    _check(opt, {"x": x2}, opt.run({"x": x2}))  # the feed copied in each run
    assert all(c.ok for c in opt.verify())  # `keep=` of inner values: resident ones, copied out
    rows = cpu_chain.profile(opt, {"x": x}, rounds=3)
    assert sum(n for label, n, _ in rows[:-1]) == len(chain.infos) and rows[-1][0] == "whole run (wall)"
    assert "conv depthwise" in cpu_chain.describe(rows)


def test_a_unit_without_a_c_form_keeps_the_unit_path(rng):
    opt = optimize(_se_model(rng, one_d=True), target="cpu")
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    for _ in range(3):
        got = opt.run({"x": x})
    assert opt._chain == [None, None]  # the 1-D Conv (numpy) or its Reshape: no C form
    _check(opt, {"x": x}, got)
    rows = cpu_chain.profile(opt, {"x": x}, rounds=2)
    assert any(label.startswith("library") for label, _, _ in rows)


@pytest.mark.parametrize("plane", [4, 64, 256])
def test_channels_last_depthwise_rule(plane):
    from panamera.subgraph.conv_step import channels_last

    assert channels_last(16, plane) is (plane <= 64)


def test_cli_run_profile_prints_the_steps(rng, tmp_path):
    import json

    from click.testing import CliRunner

    from panamera.cli import cli

    path = tmp_path / "se.onnx"
    path.write_bytes(_se_model(rng))
    r = CliRunner().invoke(cli, ["run", str(path), "--target", "cpu", "--profile", "3", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output[r.output.index("{") :])["profile"]
    assert rows[-1]["step"] == "whole run (wall)" and any(row["step"] == "conv depthwise" for row in rows)
    text = CliRunner().invoke(cli, ["run", str(path), "--target", "cpu", "--profile", "2"])
    assert text.exit_code == 0 and "us/run" in text.output


def test_small_products_in_the_chain_against_float64(rng):
    """A 1x1 Conv of 8 x 9 x 4 multiply-adds runs as the chain's plain C loops (no BLAS call, SIMD
    over the 9 pixels), a 1-pixel one as dot products; both against float64."""
    w = lambda *s: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"w{len(s)}{s[0]}")  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "w48", "w18"], ["c"]),
        helper.make_node("Relu", ["c"], ["y"]),
        helper.make_node("GlobalAveragePool", ["y"], ["g"]),
        helper.make_node("Conv", ["g", "w45"], ["z"]),
    ]
    g = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 3, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 5, 1, 1])],
        [w(8, 4, 1, 1), w(8), w(5, 8, 1, 1)],
    )  # fmt: skip
    opt = optimize(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), target="cpu")
    x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    for _ in range(3):
        got = opt.run({"x": x})
    chain = opt._chain[1]
    assert chain is not None and sum(i.kind is cpu_chain.StepKind.GEMM for i in chain.infos) == 2
    _check(opt, {"x": x}, got)


def test_chain_holds_the_blas_threads_from_c(rng):
    """A chain with gemm steps holds numpy's BLAS at the run's thread count from C (one OpenBLAS on
    its own threads: blas_threads.native_count), restoring the user's count after every run; the
    values are those of a run with the BLAS held from Python (blas_threads)."""
    from panamera.runtime.blas_threads import loaded_blas, native_count

    opt = optimize(_se_model(rng), target="cpu")
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32)
    for _ in range(2):
        opt.run({"x": x}, threads=1)
    chain = opt._chain[1]
    assert chain.blas and (chain._blas[0] is not None) is (native_count() is not None)
    if native_count() is None:
        pytest.skip("no single OpenBLAS on its own threads here: the Python path holds it")
    lib = loaded_blas()[0]
    user = lib.get_num_threads()
    try:
        lib.set_num_threads(2)
        native = opt.run({"x": x}, threads=1)
        assert lib.get_num_threads() == 2  # restored after the call
        chain._blas = (None, None)  # the Python path
        held = opt.run({"x": x}, threads=1)
        assert lib.get_num_threads() == 2
    finally:
        lib.set_num_threads(user)
    np.testing.assert_array_equal(native["y"], held["y"])
    _check(opt, {"x": x}, native)
