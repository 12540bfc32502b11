"""GPU detection (issue 19 item 6): a GPUSpec from the device's properties, any sm_80+ GPU, names
accepted wherever specs exist, and the detected GPU as the default plan target; tested without a
GPU by feeding the properties dict CuPy's `getDeviceProperties` returns."""

from __future__ import annotations

import pytest

import panamera as pn
from panamera.errors import OptionError
from panamera.model import detect
from panamera.model.gpu import A100, H100

H100_SXM = {"name": b"NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multiProcessorCount": 132,
            "clockRate": 1980000, "memoryClockRate": 2619000, "memoryBusWidth": 5120, "l2CacheSize": 50 * 2**20,
            "sharedMemPerBlockOptin": 232448, "maxThreadsPerMultiProcessor": 2048,
            "maxBlocksPerMultiProcessor": 32}  # fmt: skip
RTX4090 = {"name": b"NVIDIA GeForce RTX 4090", "major": 8, "minor": 9, "multiProcessorCount": 128,
           "clockRate": 2520000, "memoryClockRate": 10501000, "memoryBusWidth": 384, "l2CacheSize": 72 * 2**20,
           "sharedMemPerBlockOptin": 101376, "maxThreadsPerMultiProcessor": 1536,
           "maxBlocksPerMultiProcessor": 24}  # fmt: skip


def test_a_known_gpu_keeps_its_calibrated_terms():
    g = detect.spec_from_properties(H100_SXM)
    assert (g.name, g.sms, g.eta, g.launch_s) == (H100.name, 132, H100.eta, H100.launch_s)
    assert g.dram_bw == pytest.approx(3.35e12, rel=0.01)  # 2 x 2619 MHz x 5120 bits
    assert g.measured_limit == H100.measured_limit  # the same chip: its measurements hold


def test_any_sm80_gpu_is_accepted_with_its_own_figures():
    g = detect.spec_from_properties(RTX4090)
    assert (g.name, g.sms, g.max_threads_sm, g.max_blocks_sm) == ("NVIDIA GeForce RTX 4090", 128, 1536, 24)
    assert g.dram_bw == pytest.approx(1.008e12, rel=0.01) and g.l2_size == 72 * 2**20
    assert g.smem_per_block == 101376 and not g.vector_atomics  # float4 atomics are sm_90
    assert g.eta == A100.eta and g.measured_limit is None  # an sm_8x GPU borrows A100's terms, assumed
    assert any("assumed" in why for _, why in g.sources)
    assert g.resident_blocks(64) == 24  # its own block limit


def test_missing_figures_keep_the_base_gpus():
    g = detect.spec_from_properties({"name": "NVIDIA A100-SXM4-40GB", "major": 8, "minor": 0})
    assert (g.sms, g.dram_bw) == (A100.sms, A100.dram_bw)


def test_a_gpu_below_sm80_is_refused_by_name():
    with pytest.raises(OptionError, match=r"Tesla V100.*sm_70.*sm_80"):
        detect.spec_from_properties({"name": b"Tesla V100-SXM2-16GB", "major": 7, "minor": 0})


def test_names_are_accepted_where_specs_exist():
    assert detect.gpu_by_name("A100") is A100 and detect.gpu_by_name("h100-sxm5") is H100
    x = pn.placeholder((64, 256), "float32", name="x")
    k = pn.compile(pn.sum(x, axis=1), target="emulator", gpu="a100", cache=False)
    assert k.gpu is A100 and "gpu: A100-SXM4-80GB: named 'a100'" in k.explain()
    with pytest.raises(OptionError, match="unknown GPU 'b300'.*a100, h100, h200, v100"):
        pn.compile(pn.sum(x, axis=1), target="emulator", gpu="b300")
    with pytest.raises(OptionError, match="GPUSpec or a GPU name"):
        pn.compile(pn.sum(x, axis=1), target="emulator", gpu=3)


def test_the_default_is_the_detected_gpu_else_h100(monkeypatch):
    x = pn.placeholder((64, 256), "float32", name="x")
    monkeypatch.setattr(detect, "detect", lambda: None)
    k = pn.compile(pn.sum(x, axis=1), target="emulator", cache=False, use_database=False)
    assert k.gpu is H100 and "the default (CuPy sees no sm_80+ GPU)" in k.explain()
    seen = detect.spec_from_properties(RTX4090)
    monkeypatch.setattr(detect, "detect", lambda: seen)
    k = pn.compile(pn.sum(x, axis=1), target="emulator", cache=False, use_database=False)
    assert k.gpu is seen and "NVIDIA GeForce RTX 4090: the GPU CuPy sees" in k.explain()


def test_a_detected_calibrated_gpu_uses_the_schedule_database(monkeypatch):
    """The device's own name ('NVIDIA H100 80GB HBM3') is not the database's key: a detected GPU
    that is a calibrated one plans under that one's name, so shipped schedules replay on it."""
    seen = detect.spec_from_properties(H100_SXM)
    assert seen.name == H100.name
    monkeypatch.setattr(detect, "detect", lambda: seen)
    y = pn.placeholder((1024, 768), "float16", name="y")
    g, b = pn.placeholder((768,), "float16", name="g"), pn.placeholder((768,), "float16", name="b")
    k = pn.compile(pn.nn.layer_norm(y, g, b), target="emulator", cache=False)
    assert k.origin.startswith("from schedules/"), k.origin
