"""The code's shape, read from source by scripts/import_graph.py: no import cycles in
taskplane/ and workflows/ (lazy and TYPE_CHECKING imports count), between modules or
between packages, every package importing only the layers below its own, no module over
400 lines, no class over 300, no function over 60 lines or 8 positional parameters. Plus a few checks that the reader itself sees what it must, so that a clean
result means something."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


ig = _checker()


def test_no_import_cycles() -> None:
    _, edges = ig.graph(ROOT)
    found = {" -> ".join(f"{e.source}:{e.line}" for e in ig.one_cycle(c, edges)): c for c in ig.cycles(edges)}
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_package_cycles_and_every_package_imports_only_lower_layers() -> None:
    _, edges = ig.graph(ROOT)
    assert not ig.cycles(ig.package_edges(edges)), "package import cycles"
    bad = ig.layer_findings(edges)
    assert not bad, "layering (scripts/import_graph.py LAYERS):\n" + "\n".join(bad)


def test_the_script_exits_0_on_the_project() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_module_over_400_lines() -> None:
    modules, _ = ig.graph(ROOT)
    big = [f"{modules[m].relative_to(ROOT)}: {n} lines" for m, n in ig.oversized(modules)]
    assert not big, "modules over 400 lines:\n" + "\n".join(big)


def test_no_class_function_or_parameter_list_over_its_limit() -> None:
    modules, _ = ig.graph(ROOT)
    found = ig.oversized_definitions(modules)
    assert not found, "\n".join(found)


def test_the_size_reader_sees_long_classes_functions_and_positional_lists(tmp_path: Path) -> None:
    pkg = tmp_path / "taskplane"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "    x = 1\n"
    (pkg / "big.py").write_text(
        "class Big:\n" + "    y = 1\n" * 300                               # 301 lines
        + "def long():\n" + body * 60                                      # 61 lines
        + "def short():\n" + body * 59                                     # 60 lines: allowed
        + "def many(a, b, c, d, e, f, g, h, i):\n    pass\n"               # 9 positional
        + "class K:\n    def eight(self, a, b, c, d, e, f, g, h):\n        pass\n"
        + "def keywords(a, *, b, c, d, e, f, g, h, i, j):\n    pass\n")    # keyword-only: free
    (pkg / "cli.py").write_text("def command(a, b, c, d, e, f, g, h, i):\n    pass\n")  # typer flags: free
    modules, _ = ig.graph(tmp_path)
    found = ig.oversized_definitions(modules)
    assert [line.split(":")[0] for line in found] == [
        "class over 300 lines", "function over 60 lines", "function with more than 8 positional parameters"]
    assert "Big (301)" in found[0] and "long (61)" in found[1] and "many (9)" in found[2]


def test_the_reader_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "taskplane"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "workflows").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from taskplane.sub import b\n    return b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import taskplane.a\n")
    (pkg / "sub" / "d.py").write_text("from .c import something\n" + "x = 1\n" * 601)
    (tmp_path / "workflows" / "w.py").write_text("from taskplane.sub.b import name\n")
    modules, edges = ig.graph(tmp_path)
    assert {e.target for e in edges["taskplane.a"]} == {"taskplane.sub.b"}  # inside a function
    assert {e.target for e in edges["taskplane.sub.b"]} == {"taskplane.sub.c"}  # TYPE_CHECKING, relative
    assert {e.target for e in edges["taskplane.sub.d"]} == {"taskplane.sub.c"}  # a name from a module
    assert {e.target for e in edges["workflows.w"]} == {"taskplane.sub.b"}
    assert ig.cycles(edges) == [["taskplane.a", "taskplane.sub.b", "taskplane.sub.c"]]
    assert [e.target for e in ig.one_cycle(["taskplane.a", "taskplane.sub.b", "taskplane.sub.c"], edges)] == [
        "taskplane.sub.b", "taskplane.sub.c", "taskplane.a"]
    assert ig.oversized(modules) == [("taskplane.sub.d", 602)]


def test_the_reader_sees_packages_looping_and_reaching_up(tmp_path: Path) -> None:
    pkg = tmp_path / "taskplane"
    for d in ("scheduler", "scheduler/kv", "engines"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (tmp_path / "workflows").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "context.py").write_text("from taskplane.scheduler.kv import walk\n")
    (pkg / "scheduler" / "kv" / "walk.py").write_text("")
    (pkg / "scheduler" / "core.py").write_text("import taskplane.errors\nfrom taskplane.engines import kv\n")
    (pkg / "engines" / "kv.py").write_text("from taskplane.context import Priority\n")
    (pkg / "errors.py").write_text("")
    _, edges = ig.graph(tmp_path)
    assert ig.cycles(edges) == []  # no module cycle ...
    lifted = ig.package_edges(edges)
    assert ig.cycles(lifted) == [["taskplane.context", "taskplane.engines", "taskplane.scheduler"]]  # ... a package one
    assert {e.target for e in lifted["taskplane.scheduler"]} == {"taskplane.errors", "taskplane.engines"}
    layers = [("taskplane.errors",), ("taskplane.scheduler",), ("taskplane.context", "taskplane.engines")]
    assert ig.layer_findings(edges, layers) == [
        "package taskplane is on no layer: add it to LAYERS in scripts/import_graph.py",
        "taskplane.engines.kv:1 -> taskplane.context: taskplane.engines (layer 3) may import only lower layers, "
        "and taskplane.context is on layer 3",
        "taskplane.scheduler.core:2 -> taskplane.engines.kv: taskplane.scheduler (layer 2) may import only lower "
        "layers, and taskplane.engines is on layer 3",
    ]
    assert ig.layer_findings(edges, [*layers, ("taskplane", "taskplane.gone")])[0] == (
        "LAYERS names taskplane.gone, which is no package of the project")
    assert any(line.startswith("cycle of 3 packages") for line in ig.report(tmp_path, layers))
