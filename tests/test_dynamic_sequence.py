"""A symbolic program's modeled time is its kernels back to back, as a static plan's (issue 22's
1.05x target): every kernel after the first pays the queued-launch gap, not the launch floor.
Modeled on the H100 spec; nothing is launched."""

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
