"""The package reads top-down as the pipeline: each layer imports only the layers above it.

    frontend -> poly -> schedule -> codegen -> options, launch_plan -> stages -> compiled -> compiler
             -> bench, subgraph, cli
    (leaves anyone may import: dtypes, errors, enums, algebra, model, runtime.plan, logs)

runtime.executor and the backends import no compiler stage; the frontend imports no compiler.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "panamera"
LEAVES = {"dtypes", "errors", "enums", "algebra", "model", "runtime.plan", "logs"}
# What each layer may import besides the leaves and itself.
ALLOWED = {
    "frontend": set(),
    "poly": {"frontend"},
    "schedule": {"frontend", "poly"},
    "codegen": {"frontend", "poly", "schedule"},
    "runtime": set(),
    "cache": {"frontend", "schedule", "runtime"},
    # the compiler, split by idea: the options and target, the launches of a plan, the stages, the runtime object,
    # and the public API (compiler.py)
    "options": {"schedule", "runtime"},
    "launch_plan": {"frontend", "poly", "schedule", "codegen"},
    "stages": {"frontend", "poly", "schedule", "codegen", "cache", "segments", "options", "launch_plan"},
    "compiled": {"frontend", "poly", "schedule", "codegen", "runtime", "explain", "options", "stages"},
    "compiler": {"frontend", "schedule", "runtime", "cache", "explain", "options", "stages", "compiled"},
    # the sorted-segment scatter's compile path (a whole-graph plan beside the stages, as attention's)
    "segments": {"frontend", "poly", "schedule", "codegen", "runtime"},
    "explain": {"schedule"},  # compiler's explain(): reads the artifacts of every stage
}


def _layer(module: str) -> str:
    if module in LEAVES or module.split(".")[0] in LEAVES - {"runtime.plan"}:
        return "leaf"
    return module.split(".")[0]


def _imports(path: Path) -> set[str]:
    """Panamera modules imported by `path`, as dotted names relative to the package."""
    pkg = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(pkg[: len(pkg) - node.level + 1])
            mod = base + (node.module.split(".") if node.module else [])
            if node.module is None:  # from . import x
                out |= {".".join(base + [a.name]) for a in node.names}
            else:
                out.add(".".join(mod))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("panamera."):
            out.add(node.module.removeprefix("panamera."))
    return {m for m in out if m}


FILES = sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_pipeline(path):
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    layer = _layer(module)
    if layer not in ALLOWED:
        return  # bench, subgraph, cli: users of the compiler
    bad = []
    for imp in _imports(path):
        target = _layer(imp)
        if target in ("leaf", layer) or imp == "runtime.plan" or target in ALLOWED[layer]:
            continue
        bad.append(imp)
    assert not bad, f"{module} ({layer}) imports {bad}"


def test_the_cpu_compile_paths_import_one_way():
    """cpu_target.py (the stages' kernel groups) calls cpu_segments.py (a scatter-add alone); both build
    on cpu_compiled.py (CpuCompiled, cpu_model). Neither of the two imports cpu_target, even on use:
    the cycle that made cpu_target import cpu_segments inside a function is gone."""
    for name in ("cpu_segments", "cpu_compiled"):
        assert "cpu_target" not in _imports(ROOT / f"{name}.py"), name
    assert "cpu_segments" in _imports(ROOT / "cpu_target.py")
