"""A deployable folder reloads in a fresh process and computes what the model does (issue 19
item 1): `optimize --out DIR`, then `run DIR` in another process, outputs bit-equal to
`run model.onnx`. Models: the exported networks in tests/data/models (a cheap subset by default,
all with PANAMERA_FULL_ROUNDTRIP=1: about 3 minutes here), the ONNX examples of examples/, and
a PyTorch 2.13 nn.MultiheadAttention export (tests/data/mha-torchscript.onnx, whose 0-d
head-select Gather index came back as shape (1,))."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import numpy as np
import pytest
from test_exported_models import feeds_for

from panamera.cli import main

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import onnx_models  # noqa: E402

CHEAP = {"gpt2-torchscript", "mha-torchscript"}  # shared weights; a 0-d head index (attention)
FULL = os.environ.get("PANAMERA_FULL_ROUNDTRIP") == "1"
EXPORTED = sorted(glob.glob(os.path.join(HERE, "data", "models", "*.onnx"))) + [
    os.path.join(HERE, "data", "mha-torchscript.onnx")
]
# name: (ONNX bytes, `optimize` arguments)
EXAMPLES = {
    "encoder": (lambda: onnx_models.encoder(seq=16, hidden=32, heads=2), ["--shape", "batch=2"]),
    "convnet": (lambda: onnx_models.convnet(c=16, hw=8), []),
}


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".onnx")]


def test_the_attention_export_is_committed_and_tiny():
    path = os.path.join(HERE, "data", "mha-torchscript.onnx")
    import onnx

    m = onnx.load(path)
    assert os.path.getsize(path) < 16_000 and "Gather" in {n.op_type for n in m.graph.node}


def test_models_reload_in_a_fresh_process_with_equal_outputs(tmp_path):
    cases = []  # (name, model, optimize arguments, inputs .npz or None)
    for path in EXPORTED:
        if FULL or _name(path) in CHEAP:
            feeds = tmp_path / f"{_name(path)}.in.npz"
            np.savez(feeds, **feeds_for(path))
            cases.append((_name(path), path, [], str(feeds)))
    for name, (build, args) in EXAMPLES.items():
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(build())
        cases.append((name, str(path), args, None))
    script = []
    for name, model, args, feeds in cases:
        d, inputs = str(tmp_path / f"{name}.dir"), ["--inputs", feeds] if feeds else []
        assert main(["optimize", model, "--out", d, "--target", "emulator", *args]) == 0, name
        out = str(tmp_path / f"{name}.model.npz")
        assert main(["run", model, "--target", "emulator", "--output", out, *args, *inputs]) == 0, name
        script.append(["run", d, "--target", "emulator", "--output", str(tmp_path / f"{name}.dir.npz"), *inputs])
    # One fresh process reloads every folder: nothing of this process (caches, arrays) is reused.
    code = "import sys, json; from panamera.cli import main; sys.exit(max(main(a) for a in json.loads(sys.argv[1])))"
    import json

    r = subprocess.run([sys.executable, "-c", code, json.dumps(script)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for name, *_ in cases:
        with np.load(tmp_path / f"{name}.model.npz") as want, np.load(tmp_path / f"{name}.dir.npz") as got:
            assert sorted(got.files) == sorted(want.files), name
            for k in want.files:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"{name}: output {k}")


def test_a_zero_d_constant_keeps_its_shape(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from panamera.subgraph import load_optimized, optimize, write_deployable

    idx = numpy_helper.from_array(np.array(1, np.int64), "i")  # 0-d: Gather drops the axis
    g = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["g"], axis=0), helper.make_node("Softmax", ["g"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializer=[idx],
    )
    opt = optimize(helper.make_model(g), target="emulator")
    write_deployable(opt, str(tmp_path))
    back = load_optimized(tmp_path, target="emulator")
    assert back.model.constants["i"].shape == ()
    x = {"x": np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)}
    np.testing.assert_array_equal(back.run(x)["y"], opt.run(x)["y"])


@pytest.mark.skipif(not FULL, reason="re-exports with PyTorch: PANAMERA_FULL_ROUNDTRIP=1")
def test_the_attention_export_reproduces_from_torch(tmp_path):
    torch = pytest.importorskip("torch")

    class MHA(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.a(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    path = tmp_path / "mha.onnx"
    torch.onnx.export(MHA().eval(), (torch.randn(1, 8, 16),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], opset_version=17)  # fmt: skip
    d = str(tmp_path / "dir")
    assert main(["optimize", str(path), "--out", d, "--target", "emulator"]) == 0
    assert main(["run", d, "--target", "emulator"]) == 0
