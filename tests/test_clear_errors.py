"""The reliability campaign's classes (issue 14): each one numpy's answer or one clear PanameraError
naming the tensor, option or file; the CLI's errors and warnings one line each."""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import panamera as pn
from panamera import errors
from panamera.cli import main
from panamera.runtime import cuda as cuda_backend


def test_every_error_class_is_exported_at_the_top():
    for name in errors.__all__:
        assert getattr(pn, name) is getattr(errors, name)
    assert issubclass(pn.ScheduleError, pn.PanameraError) and issubclass(pn.EmulatorWarning, pn.PanameraWarning)


@pytest.mark.parametrize("ddof", [3, 4, 6])
def test_var_with_ddof_at_least_n_is_inf_or_nan_as_numpy(ddof):
    a = np.array([[1.0, 2.0, 4.0, 8.0], [3.0, 3.0, 3.0, 3.0]], np.float32)  # a spread row and a flat row
    x = pn.placeholder(a.shape, "float32", name="x")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = [pn.var(x, axis=1, ddof=ddof), pn.std(x, axis=1, ddof=ddof)]
    assert any("Degrees of freedom <= 0" in str(w.message) for w in seen) == (ddof >= 4)  # numpy's warning
    v, s = pn.compile(y, target="emulator")(a)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        ref_v, ref_s = np.var(a, axis=1, ddof=ddof), np.std(a, axis=1, ddof=ddof)
    if ddof < 4:
        np.testing.assert_allclose(v, ref_v, rtol=1e-6)
    else:
        np.testing.assert_array_equal(v, ref_v)  # [inf, nan]
        np.testing.assert_array_equal(s, ref_s)
        assert np.isposinf(v[0]) and np.isnan(v[1])


def test_bfloat16_with_float16_or_an_int_is_a_dtype_error():
    b = pn.placeholder((3,), "bfloat16", name="b")
    with pytest.raises(pn.DTypeError, match="add of 'b' and 'h'.*bfloat16 and float16.*astype"):
        b + pn.placeholder((3,), "float16", name="h")
    with pytest.raises(pn.DTypeError, match="mul of 'i' and 'b'.*int32 and bfloat16"):
        pn.placeholder((3,), "int32", name="i") * b
    with pytest.raises(pn.DTypeError, match="where"):
        pn.where(b > 0, b, pn.placeholder((3,), "int64", name="j"))


@pytest.mark.parametrize("shape", ["34", (3.5, 2), ((3,), 4), None])
def test_a_shape_that_is_not_integers_is_a_shape_error(shape):
    with pytest.raises(pn.ShapeError, match="placeholder 's'"):
        pn.placeholder(shape, name="s")


def test_shape_may_be_numpy_integers_or_one_integer():
    assert pn.placeholder((np.int64(3), 4)).shape == (3, 4)
    assert pn.placeholder(5).shape == (5,)


@pytest.mark.parametrize(
    "kw, match",
    [({"split": 0}, "split must be a positive int"), ({"split": "2"}, "split"), ({"split": 1.5}, "split"),
     ({"target": "gpu"}, "unknown target 'gpu'")],
)  # fmt: skip
def test_bad_compile_options_are_option_errors(kw, match):
    with pytest.raises(pn.OptionError, match=match):
        pn.compile(pn.sum(pn.placeholder((4, 8), name="x"), axis=1), **{"target": "emulator", **kw})


def test_split_as_a_numpy_integer_is_taken():
    y = pn.sum(pn.placeholder((4, 4096), name="x"), axis=1)
    assert pn.compile(y, target="emulator", split=np.int64(2)).plan.kernels[0].blocks_per_reduction == 2


@pytest.mark.parametrize(
    "kw, match", [({"order": "backwards"}, "unknown thread order"), ({"seed": -1}, "seed"), ({"seed": "s"}, "seed")]
)
def test_bad_call_options_are_option_errors(kw, match):
    k = pn.compile(pn.sum(pn.placeholder((4, 8), name="x"), axis=1), target="emulator")
    with pytest.raises(pn.OptionError, match=match):
        k(np.ones((4, 8), np.float32), **kw)


def test_bad_ddof_is_an_option_error():
    x = pn.placeholder((4, 8), name="x")
    with pytest.raises(pn.OptionError, match="var of 'x': ddof must be an integer"):
        pn.var(x, ddof=0.5)
    with pytest.raises(pn.OptionError, match="ddof and correction"):
        pn.var(x, ddof=1, correction=1)


@pytest.mark.auto_default
def test_auto_target_without_a_gpu_is_the_cpu(monkeypatch):
    """Without a GPU, target="auto" is the CPU target, silently; a program it refuses (a replayed
    GPU schedule) runs on the emulator with an EmulatorWarning that gives the reason."""
    monkeypatch.setattr(cuda_backend, "available", lambda: False)
    x = pn.placeholder((4, 8), name="x")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k = pn.compile(pn.sum(x, axis=1))
        e = pn.compile(pn.min(x, axis=1), target="emulator")
    assert k.target == "cpu" and not [w for w in seen if issubclass(w.category, pn.PanameraWarning)]
    with pytest.warns(pn.EmulatorWarning, match="refuses this program .*schedule=") as w:
        r = pn.compile(pn.min(x, axis=1), schedule=e.schedule)
    assert r.target == "emulator" and "correctness tool, not a fast CPU path" in str(w[0].message)
    assert w[0].filename == __file__  # points at the user's pn.compile call
    with pytest.raises(pn.TargetRefused, match="schedule="):  # asked for by name: refused, no fallback
        pn.compile(pn.min(x, axis=1), schedule=e.schedule, target="cpu")


# -- the command line ---------------------------------------------------------------------------
def _model(path, opset=13, domain=""):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    if domain:
        node, opsets = helper.make_node("Foo", ["x"], ["y"], domain=domain), [("", 13), (domain, 1)]
    else:
        node, opsets = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0), [("", opset)]
    g = helper.make_graph([node], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]), path)
    return str(path)


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_version(capsys):
    rc, out, _ = _run(capsys, "--version")
    assert rc == 0 and out.strip() == f"panamera {pn.__version__}"


@pytest.mark.parametrize(
    "argv", [["optimize"], ["bogus"], ["bench", "--repeat", "x"], ["optimize", "m.onnx", "--gpu", "z100"],
             ["cache", "bogus"]],
)  # fmt: skip
def test_every_usage_error_is_one_line(capsys, argv):
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("panamera: error: ") and "--help" in err


def test_a_bad_path_is_one_line(capsys, tmp_path):
    rc, _, err = _run(capsys, "optimize", str(tmp_path / "missing.onnx"))
    assert rc == 2 and err.count("\n") == 1 and "missing.onnx" in err


def test_a_newer_opset_is_exit_2(capsys, tmp_path):
    newest = onnx.defs.onnx_opset_version()
    rc, _, err = _run(capsys, "optimize", _model(tmp_path / "new.onnx", opset=newest + 1))
    assert rc == 2 and err.count("\n") == 1 and f"opset {newest + 1}" in err and f"up to {newest}" in err


def test_a_custom_domain_op_is_exit_2_never_internal(capsys, tmp_path):
    path = _model(tmp_path / "custom.onnx", domain="com.example")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32))
    rc, out, _ = _run(capsys, "optimize", path)
    assert rc == 0 and "com.example" in out  # reported as a library node
    rc, _, err = _run(capsys, "run", path, "--inputs", str(tmp_path / "in.npz"))
    assert rc == 2 and err.count("\n") == 1 and "com.example::Foo" in err and "internal" not in err
