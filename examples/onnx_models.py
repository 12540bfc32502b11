"""Small ONNX models built with onnx.helper: a transformer block's memory-intensive tail and a
conv net's normalization. Used by the CLI tests and as examples:

    python examples/onnx_models.py build/models    # writes encoder.onnx and convnet.onnx, and a
                                                   # random batch of inputs for each (NAME.in.npz)
    panamera optimize build/models/encoder.onnx --verify
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def encoder(batch="batch", seq=128, hidden=256, heads=4) -> bytes:
    """Attention scores -> softmax -> context, then residual + LayerNorm + GELU(erf) MLP tail."""
    rng = np.random.default_rng(0)
    d = hidden // heads
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("MatMul", ["q", "kT"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="pv"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="merge_heads", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "hshape"], ["attn"], name="flatten_heads"),
        helper.make_node("Add", ["attn", "x"], ["res"], name="residual"),
        helper.make_node(
            "LayerNormalization", ["res", "gamma", "beta"], ["ln"], name="layer_norm", axis=-1, epsilon=1e-5
        ),
        helper.make_node("MatMul", ["ln", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("Div", ["hb", "sqrt2"], ["hs"], name="gelu_div"),
        helper.make_node("Erf", ["hs"], ["he"], name="gelu_erf"),
        helper.make_node("Add", ["he", "one"], ["he1"], name="gelu_add"),
        helper.make_node("Mul", ["hb", "he1"], ["hm"], name="gelu_mul"),
        helper.make_node("Mul", ["hm", "half"], ["y"], name="gelu_half"),
        helper.make_node("ReduceMean", ["y", "axes"], ["pooled"], name="mean_pool", keepdims=0),
    ]
    inits = [
        _init("scale", np.float32(1 / np.sqrt(d))),
        _init("hshape", np.array([0, 0, hidden], np.int64)),
        _init("gamma", rng.standard_normal(hidden).astype(np.float32)),
        _init("beta", rng.standard_normal(hidden).astype(np.float32)),
        _init("w1", (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)),
        _init("b1", rng.standard_normal(hidden).astype(np.float32)),
        _init("sqrt2", np.float32(np.sqrt(2))),
        _init("one", np.float32(1)),
        _init("half", np.float32(0.5)),
        _init("axes", np.array([1], np.int64)),
    ]
    inputs = [
        helper.make_tensor_value_info("q", f, [batch, heads, seq, d]),
        helper.make_tensor_value_info("kT", f, [batch, heads, d, seq]),
        helper.make_tensor_value_info("v", f, [batch, heads, seq, d]),
        helper.make_tensor_value_info("mask", f, [batch, 1, 1, seq]),
        helper.make_tensor_value_info("x", f, [batch, seq, hidden]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", f, [batch, seq, hidden]),
        helper.make_tensor_value_info("pooled", f, [batch, hidden]),
    ]
    g = helper.make_graph(nodes, "encoder", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def convnet(n=2, c=32, hw=28, groups=8) -> bytes:
    """Conv -> BatchNorm(inference) -> Relu -> GroupNorm -> global average pool -> LogSoftmax."""
    rng = np.random.default_rng(1)
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["img", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["act"], name="relu"),
        helper.make_node("GroupNormalization", ["act", "gn_s", "gn_b"], ["gn"], name="gn", num_groups=groups),
        helper.make_node("ReduceMean", ["gn", "hw_axes"], ["pool"], name="pool", keepdims=0),
        helper.make_node("LogSoftmax", ["pool"], ["logp"], name="log_softmax", axis=1),
    ]
    inits = [
        _init("w", (rng.standard_normal((c, 3, 3, 3)) * 0.2).astype(np.float32)),
        _init("bn_s", rng.random(c).astype(np.float32) + 0.5),
        _init("bn_b", rng.standard_normal(c).astype(np.float32)),
        _init("bn_m", rng.standard_normal(c).astype(np.float32) * 0.1),
        _init("bn_v", rng.random(c).astype(np.float32) + 0.5),
        _init("gn_s", rng.random(c).astype(np.float32) + 0.5),
        _init("gn_b", rng.standard_normal(c).astype(np.float32)),
        _init("hw_axes", np.array([2, 3], np.int64)),
    ]
    g = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("img", f, [n, 3, hw, hw])],
                          [helper.make_tensor_value_info("logp", f, [n, c])], initializer=inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()


def inputs(name: str, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for `panamera run --inputs` (the default sizes of the models above)."""
    r = np.random.default_rng(seed)
    if name == "convnet":
        return {"img": r.standard_normal((batch, 3, 28, 28), np.float32)}
    shapes = {"q": (batch, 4, 128, 64), "kT": (batch, 4, 64, 128), "v": (batch, 4, 128, 64), "x": (batch, 128, 256)}
    feeds = {k: r.standard_normal(s, np.float32) for k, s in shapes.items()}
    feeds["mask"] = np.where(r.random((batch, 1, 1, 128)) < 0.1, -1e4, 0.0).astype(np.float32)
    return feeds


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "build/models"
    os.makedirs(out, exist_ok=True)
    for name, data in (("encoder", encoder()), ("convnet", convnet())):
        with open(os.path.join(out, f"{name}.onnx"), "wb") as fh:
            fh.write(data)
        np.savez(os.path.join(out, f"{name}.in.npz"), **inputs(name))  # batch 2, for `panamera run --inputs`
        print(os.path.join(out, f"{name}.onnx"), os.path.join(out, f"{name}.in.npz"))
