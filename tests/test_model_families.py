"""Issue 20's failure classes, each on a minimal graph: what the exported model families
(tests/test_exported_models.py) tripped over, reduced to the mechanism."""

import math

import numpy as np
from conftest import tolerance
from test_onnx_net import ref_conv

import panamera as pn
from panamera.subgraph.conv import conv, geometry, im2col


def test_im2col_addresses_that_scale_before_they_divide_use_64_bit_indices():
    """A depthwise 3x3 convolution over 2x16x32x32 (an EfficientNet's): every index of its
    im2col fits int, but isl's address expression multiplies i by 29507 before it divides, which
    overflows int: the kernel read out of bounds (segfault on the emulator). The index type now
    covers every intermediate value of the rendered addresses (islast.widest)."""
    xs, ws, attrs = (2, 16, 32, 32), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}
    win, g = geometry(xs, ws, attrs)
    cols = pn.compile(im2col(pn.placeholder(xs, name="x"), win, g), target="emulator")
    assert "typedef long long pn_idx;" in cols.source
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = np.zeros(ws[0], np.float32)
    tol = tolerance("float32", math.prod(ws[1:])) * 4
    np.testing.assert_allclose(
        conv(np, attrs, x, w), ref_conv(x, w, b, (1, 1), [1] * 4, (1, 1), 16), rtol=tol, atol=tol
    )
