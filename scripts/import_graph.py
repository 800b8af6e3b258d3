"""The project's import graph, read from source: module cycles, the package layers, module sizes.

Every ``import x`` and ``from x import y`` counts, wherever it stands: at the top, inside a
function (a lazy import is still a dependency) and under ``if TYPE_CHECKING:`` (a type
that needs a cycle to be named is a sign the two modules are one). An edge goes to the
most specific module of the project that the statement names: ``from a.b import c`` is
an edge to ``a.b.c`` when that is a module, else to ``a.b``. Parent packages are not
counted as imported (every ``__init__.py`` here is small and imports nothing eagerly);
what ``importlib.import_module`` loads is not read.

Sizes, so that no part grows until it hides its shape: no module over ``MAX_LINES`` lines,
no class over ``MAX_CLASS_LINES``, no function over ``MAX_FUNCTION_LINES`` or with more than
``MAX_POSITIONAL`` positional parameters (``self``/``cls`` aside; keyword-only parameters
are a public keyword API and free, and so are the typer commands of ``taskplane.cli``,
whose parameters are the command line's flags).

The package graph lifts every module edge to its packages: the top-level subpackages and
top modules of ``taskplane`` (``taskplane.scheduler``, ``taskplane.config``, ...),
``taskplane`` itself for ``taskplane/__init__.py``, ``workflows`` and ``benchmarks``. ``LAYERS`` names every
package, lowest layer first; a package may import only packages of lower layers, so the
package graph has no cycle either.

    python scripts/import_graph.py [ROOT]     # prints the findings; exit 1 when there are any

``tests/test_import_graph.py`` asserts that there is nothing to print.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("taskplane", "workflows", "benchmarks")
MAX_LINES = 400
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60
MAX_POSITIONAL = 8
#: modules whose functions are typer commands: their parameters are the command line's flags
FLAG_MODULES = frozenset({"taskplane.cli"})
#: every package of the project, lowest layer first: a package may import only packages of lower layers
LAYERS: tuple[tuple[str, ...], ...] = (
    ("taskplane.errors", "taskplane.logs", "taskplane.ports", "taskplane.process_exit", "taskplane.procfs"),  # import nothing of ours
    ("taskplane.scheduler", "taskplane.temporal_names"),  # the pure scheduling core (also run by sim and bench)
    ("taskplane.config", "taskplane.context", "taskplane.store"),
    ("taskplane.engines",),
    ("taskplane.calls", "taskplane.dev"),  # calls: the call lifecycle both data planes drive
    ("taskplane.autoscale", "taskplane.reports", "taskplane.sdk"),
    ("taskplane", "taskplane.api", "taskplane.demo", "taskplane.integrations", "taskplane.sidecar",
     "taskplane.sim"),  # api: the HTTP API
    ("taskplane.epp", "taskplane.gateway", "workflows"),  # the two data planes: neither imports the other
    ("taskplane.bench",),
    ("taskplane.cli",),
    ("benchmarks",),  # measurement harnesses and experiments: nothing shipped imports them
)


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    line: int


def module_files(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below the packages."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the project."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    keep = len(package) - (node.level - 1)
    base = package[:keep]
    if node.module:
        base.append(node.module)
    return ".".join(base)


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every edge from ``module`` to another module of the project, nested imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            names = [f"{base}.{alias.name}" if base else alias.name for alias in node.names if alias.name != "*"]
            names = names or [base]
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                edges.append(Edge(module, target, node.lineno))
    return edges


def graph(root: Path) -> tuple[dict[str, Path], dict[str, list[Edge]]]:
    modules = module_files(root)
    return modules, {m: imports_of(m, p, modules) for m, p in modules.items()}


def cycles(edges: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:  # iterative: the graph is deep enough to matter
        nonlocal counter
        work = [(root, iter(sorted({e.target for e in edges.get(root, [])})))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({e.target for e in edges.get(child, [])}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return sorted(out)


def one_cycle(component: list[str], edges: dict[str, list[Edge]]) -> list[Edge]:
    """A shortest cycle through the component's first module, as edges (for the message)."""
    inside = set(component)
    start = component[0]
    previous: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for e in edges.get(node, []):
                if e.target not in inside:
                    continue
                if e.target == start:
                    path = [e]
                    while path[0].source != start:
                        path.insert(0, previous[path[0].source])
                    return path
                if e.target not in previous:
                    previous[e.target] = e
                    nxt.append(e.target)
        frontier = nxt
    return []


def package_of(module: str) -> str:
    """``taskplane.scheduler.kv.walk`` -> ``taskplane.scheduler``; ``workflows.worker`` -> ``workflows``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "taskplane" else parts[0]


def package_edges(edges: dict[str, list[Edge]]) -> dict[str, list[Edge]]:
    """The module edges between two packages, lifted to them (the line is the first such import's)."""
    out: dict[str, dict[str, Edge]] = {}
    for m in sorted(edges):
        out.setdefault(package_of(m), {})
        for e in edges[m]:
            a, b = package_of(e.source), package_of(e.target)
            if a != b:
                out[a].setdefault(b, Edge(a, b, e.line))
    return {p: list(targets.values()) for p, targets in out.items()}


def example(edges: dict[str, list[Edge]], source: str, target: str) -> Edge:
    """The first module edge from package ``source`` to package ``target``."""
    return next(e for m in sorted(edges) if package_of(m) == source for e in edges[m] if package_of(e.target) == target)


def layer_findings(edges: dict[str, list[Edge]], layers: Sequence[Sequence[str]] = LAYERS) -> list[str]:
    """A package on no layer, a layer's name that is no package, and every import of a package
    on the same layer or a higher one (one line per module edge)."""
    level = {p: i for i, layer in enumerate(layers) for p in layer}
    packages = {package_of(m) for m in edges}
    lines = [f"package {p} is on no layer: add it to LAYERS in scripts/import_graph.py"
             for p in sorted(packages - level.keys())]
    lines += [f"LAYERS names {p}, which is no package of the project" for p in sorted(level.keys() - packages)]
    for m in sorted(edges):
        for e in edges[m]:
            a, b = package_of(e.source), package_of(e.target)
            if a != b and a in level and b in level and level[b] >= level[a]:
                lines.append(f"{e.source}:{e.line} -> {e.target}: {a} (layer {level[a] + 1}) may import only "
                             f"lower layers, and {b} is on layer {level[b] + 1}")
    return lines


def oversized(modules: dict[str, Path], limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """Modules of more than ``limit`` lines, largest first."""
    sizes = [(m, len(p.read_text(encoding="utf-8").splitlines())) for m, p in modules.items()]
    return sorted(((m, n) for m, n in sizes if n > limit), key=lambda x: -x[1])


def oversized_definitions(modules: dict[str, Path]) -> list[str]:
    """Classes and functions over their limits, one line each (module order, then line)."""
    out = []
    for m, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            where = f"{m}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ClassDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    out.append(f"class over {MAX_CLASS_LINES} lines: {where} {node.name} ({n})")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"function over {MAX_FUNCTION_LINES} lines: {where} {node.name} ({n})")
                positional = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(positional) > MAX_POSITIONAL and m not in FLAG_MODULES:
                    out.append(f"function with more than {MAX_POSITIONAL} positional parameters: {where} "
                               f"{node.name} ({len(positional)}): make them keyword-only or pass an options object")
    return out


def report(root: Path, layers: Sequence[Sequence[str]] = LAYERS) -> list[str]:
    """One line per finding (empty when the project is clean)."""
    modules, edges = graph(root)
    lines = []
    for component in cycles(edges):
        path = " -> ".join(f"{e.source}:{e.line}" for e in one_cycle(component, edges))
        lines.append(f"cycle of {len(component)} modules ({', '.join(component)}); e.g. {path} -> {component[0]}")
    lifted = package_edges(edges)
    for component in cycles(lifted):
        hops = [example(edges, e.source, e.target) for e in one_cycle(component, lifted)]
        path = "; ".join(f"{e.source}:{e.line} -> {e.target}" for e in hops)
        lines.append(f"cycle of {len(component)} packages ({', '.join(component)}); e.g. {path}")
    lines += layer_findings(edges, layers)
    for m, n in oversized(modules):
        lines.append(f"module over {MAX_LINES} lines: {modules[m].relative_to(root)} ({n})")
    lines += oversized_definitions(modules)
    return lines


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    findings = report(root)
    print("\n".join(findings) if findings else f"no import cycles between modules or packages, every package imports "
          f"only lower layers ({len(LAYERS)} layers), no module over {MAX_LINES} lines, no class over "
          f"{MAX_CLASS_LINES}, no function over {MAX_FUNCTION_LINES} lines or {MAX_POSITIONAL} positional parameters")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
