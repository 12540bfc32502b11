"""`torch.compile(..., backend="panamera")` with dynamo's dynamic shapes (issue 22, item 4): a
dynamic graph's Panamera subgraphs are compiled once over dynamo's symbols (one DynamicCompiled
each, kernels per size class), not per shape; a subgraph the symbolic path refuses is compiled per
concrete shape, counted with its reason. CPU emulator, small sizes.

Tolerances: as tests/test_torch_backend.py: Panamera's result against the module in float64, no
further from it than twice eager PyTorch's float32 result plus one reduction's tolerance.
"""

import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")
nn = torch.nn

import panamera as pn  # noqa: E402  (after torch: `import panamera` registers the backend)
import panamera.torch_backend as tb  # noqa: E402
from panamera.bench.train_steps import eager_us  # noqa: E402
from panamera.frontend.symbolic import sym  # noqa: E402
from panamera.torch_backend import symbolic  # noqa: E402

OPTIONS = {"target": "emulator"}


pytestmark = [pytest.mark.usefixtures("fresh_dynamo"), pytest.mark.filterwarnings("ignore::panamera.EmulatorWarning")]


class Block(nn.Module):
    """Linear (eager), then ReLU, LayerNorm and softmax (one Panamera subgraph)."""

    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.up, self.norm = nn.Linear(d, hidden), nn.LayerNorm(hidden)

    def forward(self, x):
        return torch.softmax(self.norm(torch.relu(self.up(x))), -1)


def check_close(m, x, got, n: int):
    with torch.no_grad():
        eager, ref = m(x).double(), m.double()(x.double())
        m.float()
    scale = max(1.0, ref.abs().max().item())
    err, eager_err = ((v.double() - ref).abs().max().item() / scale for v in (got, eager))
    assert err <= 2 * eager_err + tolerance("float32", n), f"error {err:.3g} against eager's {eager_err:.3g}"


def test_automatic_dynamic_compiles_one_panamera_program_for_every_batch():
    torch.manual_seed(0)
    m = Block().eval()
    f = torch.compile(m, backend="panamera", options=OPTIONS)
    with torch.no_grad():
        for batch in (8, 16, 24, 40):
            x = torch.randn(batch, 5, 16)
            check_close(m, x, f(x), 32)
    s = tb.stats()
    # batch 8: dynamo's static graph; 16: its dynamic graph over s0, one symbolic program for 16, 24 and 40
    assert (s.graphs, s.recompiles) == (2, 1), s.describe()
    assert (s.programs, s.symbolic_programs, s.specializations) == (2, 1, []), s.describe()
    (sub,) = s.reports[1].subgraphs
    assert sub.mode == "symbolic" and sub.program.stats()["calls"] == 3
    assert 1 <= s.size_classes <= 2  # 16 and 24 share [16, 32); 40 is in [32, 64)
    # traffic and modeled time at dynamo's size hint (batch 16: the shape the dynamic graph was traced at),
    # so `bench --suite steps` models the eager side of a dynamic graph too
    moved = {op: (r, w) for op, r, w in sub.traffic}
    assert moved["aten._softmax.default"] == (16 * 5 * 32 * 4,) * 2  # a (16, 5, 32) float32 tensor read and written
    assert eager_us(sub.traffic, pn.model.gpu.H100)[0] > 0
    assert sub.modeled_us == pytest.approx(sub.program.modeled_us(**{sub.program.symbols[0]: 16}))
    assert sub.modeled_us < sub.program.modeled_us(**{sub.program.symbols[0]: 40})


def test_mark_dynamic_compiles_once_from_the_first_call():
    torch.manual_seed(1)
    m = Block().eval()
    f = torch.compile(m, backend="panamera", options=OPTIONS)
    with torch.no_grad():
        for batch in (3, 9):
            x = torch.randn(batch, 5, 16)
            torch._dynamo.mark_dynamic(x, 0)
            check_close(m, x, f(x), 32)
    s = tb.stats()
    assert (s.graphs, s.programs, s.symbolic_programs) == (1, 1, 1), s.describe()


def test_a_subgraph_the_symbolic_path_refuses_is_compiled_per_shape_with_its_reason():
    table = torch.randn(20, 8)

    def fn(ids):  # an embedding lookup: a gather, which the symbolic path does not take
        return torch.nn.functional.embedding(ids, table).softmax(-1)

    f = torch.compile(fn, backend="panamera", options=OPTIONS, dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 3):
            ids = torch.randint(0, 20, (rows,))
            torch.testing.assert_close(f(ids), fn(ids), rtol=tolerance("float32", 8), atol=tolerance("float32", 8))
    s = tb.stats()
    assert s.symbolic_programs == 0 and [r.subgraphs[0].mode for r in s.reports] == ["per-shape"], s.describe()
    assert [shapes[-1][0] for _, shapes, _ in s.specializations] == [(3,), (5,)], s.specializations  # 3 again: cached
    assert all("gather" in why for _, _, why in s.specializations) and s.programs == 2


def test_extents_of_dynamo_become_panamera_dims():
    shape_env = torch.fx.experimental.symbolic_shapes.ShapeEnv()
    s0, s1 = (shape_env.create_unbacked_symint() for _ in range(2))
    assert symbolic.extent(7) == 7
    name0, name1 = str(s0.node.expr), str(s1.node.expr)
    assert symbolic.extent(s0 * 5) == sym(name0) * 5
    assert symbolic.extent(s0 * s1) == sym(name0) * sym(name1)
    assert symbolic.split((sym(name0) * 5, 16)) == (sym(name0), 5, 16)
    # a sum (a KV cache after cat) is a symbol of its own, the same name wherever it appears
    assert symbolic.extent(s0 + 1) == sym(f"{name0}p1")
    assert symbolic.extent((s0 + 1) * 4) == sym(f"{name0}p1") * 4
    with pytest.raises(tb.aten.TranslationError, match="not a product of symbols"):
        symbolic.extent(s0 // 2)


def test_a_kv_cache_grown_by_cat_keeps_softmax_in_one_symbolic_program():
    """Decode attention as GPT-2 writes it: the cache (T) and the new key cat into T + 1 keys;
    the softmax over them is one program for every T (it used to run in eager PyTorch)."""
    torch.manual_seed(2)

    def fn(q, k, new):
        return torch.softmax(q @ torch.cat([k, new], dim=1).transpose(-1, -2) * 0.25, -1)

    f = torch.compile(fn, backend="panamera", options=OPTIONS)
    with torch.no_grad():
        for t in (2, 3, 6, 7):
            q, k, new = torch.randn(2, 1, 8), torch.randn(2, t, 8), torch.randn(2, 1, 8)
            got, ref = f(q, k, new), fn(q.double(), k.double(), new.double())
            eager = (fn(q, k, new).double() - ref).abs().max().item()
            assert (got.double() - ref).abs().max().item() <= 2 * eager + tolerance("float32", t + 1)
    s = tb.stats()
    assert s.graphs == 2 and s.symbolic_programs == 1 and not s.specializations, s.describe()
    assert not [op for op, _ in s.eager if "softmax" in op], s.describe()


def test_a_size_read_as_a_number_is_an_input_not_a_compilation_per_value():
    """GPT-2's positions: `arange(n) + past_length`, a SymInt added to a tensor whose shape is
    static. The partition is one static program taking the number as a 0-d input, not one
    compilation per value."""
    torch.manual_seed(3)

    def fn(x, past):
        return torch.softmax(x * past.shape[0], -1)

    f = torch.compile(fn, backend="panamera", options=OPTIONS)
    with torch.no_grad():
        x = torch.randn(3, 8)
        for t in (2, 3, 5, 9):
            past = torch.zeros(t)
            tol = tolerance("float32", 8) * t  # the logits grow with t
            torch.testing.assert_close(f(x, past), fn(x.double(), past).float(), rtol=tol, atol=tol)
    s = tb.stats()
    assert s.graphs == 2 and s.programs == 2 and not s.specializations, s.describe()


def test_a_dynamic_graph_aot_cannot_trace_symbolically_is_specialized_per_shape(monkeypatch):
    real = tb._static

    def refuse_symbolic(gm, inputs, *rest):
        if any(isinstance(a, torch.SymInt) for a in inputs):
            raise RuntimeError("no symbolic trace")
        return real(gm, inputs, *rest)

    monkeypatch.setattr(tb, "_static", refuse_symbolic)
    f = torch.compile(lambda x: x.softmax(-1), backend="panamera", options=OPTIONS)
    with torch.no_grad():
        for rows in (2, 3, 4):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(f(x), x.softmax(-1), rtol=tolerance("float32", 8), atol=tolerance("float32", 8))
    ids = [r.compile_id for r in tb.stats().reports]
    assert ids == ["0/0", "0/1/shape0", "0/1/shape1"] and tb.stats().symbolic_programs == 0, ids
