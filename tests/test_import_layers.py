"""nvfp4stack's imports form layers (issue #37): no import cycle among its modules (module-level
``import``/``from``, read with ast; a function-level import is a deliberate lazy edge and says why),
and nvfp4stack/families/ (the family contract, registry and resolve) sits below everything that uses
it: it imports no plug-in and nothing that imports it back, at any level."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nvfp4stack"
FAMILIES = "nvfp4stack.families"
PLUGINS = "nvfp4stack.models"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING"


def _imports(body: list[ast.stmt], functions: bool):
    """Import statements run when the module is imported (``functions``: those in function bodies too)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not functions:
            continue
        elif isinstance(node, ast.If) and _type_checking(node):
            yield from _imports(node.orelse, functions)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(node, field, None)
                if isinstance(sub, list):
                    yield from _imports(sub, functions)


def _target(name: str) -> str | None:
    """The nvfp4stack module ``name`` lands in (a name inside a module: that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def edges(module: str, functions: bool = False) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text()).body, functions):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        out |= {t for n in names if (t := _target(n)) and t != module}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycle_among_nvfp4stack_modules():
    graph = {m: edges(m) for m in MODULES}
    found = cycles(graph)
    assert not found, "import cycles (move the shared helper to the lower module, or import lazily where " \
        "the dependency is optional and say why):\n" + "\n".join(" <-> ".join(c) for c in found)


def _reach(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_families_sit_below_everything_that_uses_them():
    graph = {m: edges(m, functions=True) for m in MODULES}
    inside = {m for m in MODULES if m == FAMILIES or m.startswith(FAMILIES + ".")}
    assert {f"{FAMILIES}.family", f"{FAMILIES}.registry", f"{FAMILIES}.resolve"} <= inside
    below = {t for m in inside for t in graph[m]} - inside
    plugins = sorted(t for t in below if t == PLUGINS or t.startswith(PLUGINS + "."))
    assert not plugins, f"nvfp4stack/families/ imports plug-ins {plugins}; the registry loads them by name"
    for dep in sorted(below):
        back = _reach({dep}, graph) & inside
        assert not back, f"nvfp4stack/families/ imports {dep}, which imports it back (via {sorted(back)})"


def test_the_walk_sees_cycles_and_relative_imports(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert f"{FAMILIES}.family" in edges(f"{FAMILIES}.registry")
    assert "nvfp4stack.plan.planner" in edges("nvfp4stack.plan.build")
    assert "nvfp4stack.convert.base" in edges("nvfp4stack.convert")   # from nvfp4stack.convert.base import ...
    # function-level imports count only where asked (nvfp4stack.plan.planner imports the converters lazily)
    assert "nvfp4stack.convert" not in edges("nvfp4stack.plan.planner")
    assert "nvfp4stack.convert" in edges("nvfp4stack.plan.planner", functions=True)
