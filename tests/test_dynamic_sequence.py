"""A symbolic program's modeled time is its kernels back to back, as a static plan's (issue 22's
1.05x target): every kernel after the first pays the queued-launch gap, not the launch floor.
Modeled on the H100 spec; nothing is launched."""

import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.dynamic import specialize


def test_a_multi_kernel_program_is_modeled_as_its_static_plan_would_be():
    x, g, b = pn.placeholder(("B", "S", 64), name="x"), pn.placeholder((64,), name="g"), pn.placeholder((64,), name="b")
    k = pn.compile(pn.nn.softmax(pn.sum(pn.nn.layer_norm(x, g, b), axis=-1)), target="emulator", gpu="h100",
                   cache=False, use_database=False)  # fmt: skip
    for sizes in ({"B": 1, "S": 5}, {"B": 10, "S": 100}):
        static = lower(list(specialize(k.outputs, sizes)), target="emulator", gpu="h100").plan
        assert len(static.kernels) > 1
        assert k.modeled_us(**sizes) <= 1.05 * static.modeled_us, (sizes, k.modeled_us(**sizes), static.modeled_us)


def test_a_class_plan_and_explain_cost_a_kernel_sequence_as_the_static_plan_does():
    """One rule for a sequence of kernels: the class plan's own figure (explain's) at its
    representative size is `modeled_us` at that size, and the static plan's for that size where
    the class chose the static plan's decisions (two single kernels: a row sum, then a column sum)."""
    x = pn.placeholder(("B", 64), name="x")
    k = pn.compile(pn.sum(pn.sum(x, axis=1) * 2.0, axis=0), target="emulator", gpu="h100", cache=False,
                   use_database=False)  # fmt: skip
    sizes = {"B": 3}
    plan = k.plan(k.size_class(sizes))
    assert k.size_class(sizes).representative() == sizes and len(plan.decisions) == 2
    static = lower(list(specialize(k.outputs, sizes)), target="emulator", gpu="h100").plan
    assert len(static.kernels) == 2
    assert plan.modeled_us(k.gpu) == pytest.approx(k.modeled_us(**sizes), rel=1e-12)
    assert plan.modeled_us(k.gpu) == pytest.approx(static.modeled_us, rel=1e-9)
    gap = (k.gpu.launch_s - k.gpu.queued_s) * 1e6  # what summing two full launches overstated
    assert sum(d.modeled_us for d in plan.decisions) == pytest.approx(plan.modeled_us(k.gpu) + gap, rel=1e-12)
    assert f"{plan.modeled_us(k.gpu):.2f} us modeled" in k.explain()
