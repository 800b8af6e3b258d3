"""The shape of the scheduling core, read from its source: a pure core with no import loops
(lazy and TYPE_CHECKING imports included), modules of one job, and a pipeline that names
no plugin."""

from __future__ import annotations

import ast
from pathlib import Path

from taskplane.scheduler.framework.plugin import Kind
from taskplane.scheduler.framework.registry import REGISTRY
from taskplane.scheduler.policies import policy_names

PKG = Path(__file__).resolve().parents[2] / "taskplane" / "scheduler"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement stands."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # a submodule by name
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}


def _strings(source: str) -> set[str]:
    """The string literals of ``source``, outside ``__slots__`` and docstrings."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            skip.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
    return {
        n.value for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    }


def test_no_import_loops_in_the_scheduler() -> None:
    graph = _graph()
    done: set[str] = set()
    stack: list[str] = []

    def visit(m: str) -> None:
        if m in stack:
            raise AssertionError("import loop: " + " -> ".join([*stack[stack.index(m):], m]))
        if m in done:
            return
        stack.append(m)
        for dep in sorted(graph[m]):
            visit(dep)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_the_core_imports_nothing_above_it() -> None:
    above = ("taskplane.api", "taskplane.calls", "taskplane.gateway", "taskplane.store", "taskplane.engines", "taskplane.sim", "taskplane.bench")
    for path in PKG.rglob("*.py"):
        bad = sorted(i for i in _imports(path) if i.startswith(above))
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_modules_stay_small() -> None:
    for path in PKG.rglob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 600, f"{path.relative_to(PKG)} has {lines} lines"
    assert len((PKG / "core.py").read_text(encoding="utf-8").splitlines()) <= 250  # the pipeline


def test_pipeline_and_flow_control_name_no_plugin() -> None:
    assert policy_names()  # (importing the presets registers every plugin)
    names = {d["type"] for d in REGISTRY.describe()}
    assert {"session-affinity", "prefix-cache", "dynamo-cost", "sglang-cache-aware"} <= names
    for rel in ("core.py", "feedback.py", "flowcontrol/controller.py", "framework/state.py", "framework/one.py"):
        text = (PKG / rel).read_text(encoding="utf-8")
        named = sorted(_strings(text) & names)
        assert not named, f"{rel} names plugin types {named}"
        assert ".scheduler." not in text.replace("taskplane.scheduler.", ""), f"{rel} reaches into a scheduler"
    assert REGISTRY.types(Kind.SCORER)["session-affinity"].__module__.endswith("scorers.session")


def test_the_priority_enum_is_a_light_import() -> None:
    """``taskplane.context`` (the SDK's headers) takes ``Priority`` from the scheduler's types
    without loading numpy or the pipeline: the package's face loads names on first use."""
    import subprocess
    import sys

    code = (
        "import sys, taskplane.context as c; assert c.Priority.BATCH.rank == 3; "
        "heavy = [m for m in ('numpy', 'taskplane.scheduler.core') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
