"""No private name is reached across nvfp4stack's packages (issue #37): a ``_name`` belongs to its own
package (``nvfp4stack.<pkg>``; a top-level module is a package of its own), so another package
imports or reads only public names. Tests are exempt: they may pin a package's internals."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package(module: str) -> str:
    """'nvfp4stack.plan.build' -> 'plan'; 'nvfp4stack.arch' -> 'arch'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _absolute(node: ast.ImportFrom, module: str, is_init: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts[: len(parts) - node.level + (1 if is_init else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, methods, assigned names and attributes."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
    return {n for n in out if _private(n)}


def cross_package_private_uses(root: Path) -> list[str]:
    """'file:line: what' for each private name of one nvfp4stack package used in another: imported
    (``from nvfp4stack.<other>... import _x``), read off a name bound to another package's module or
    object (``mod._x``, ``Cls._x``), or read off any object where only other packages define it
    (``plan._x()`` on an instance)."""
    files = sorted((root / "nvfp4stack").rglob("*.py"))
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in files}
    modules = {p: _module_of(p, root) for p in files}
    owners: dict[str, set[str]] = defaultdict(set)   # private name -> packages that define it
    for p, tree in trees.items():
        for name in _defined_privates(tree):
            owners[name].add(_package(modules[p]))
    found = []
    for p, tree in trees.items():
        module, where = modules[p], p.relative_to(root)
        own = _package(module)
        foreign: dict[str, str] = {}   # local name -> the other package's module it is, or comes from
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("nvfp4stack.") and _package(a.name) != own:
                        foreign[a.asname or a.name] = a.name
                        if any(_private(part) for part in a.name.split(".")):
                            found.append(f"{where}:{node.lineno}: import {a.name}")
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(node, module, p.name == "__init__.py")
                if not src.startswith("nvfp4stack") or _package(src) == own:
                    continue
                if any(_private(part) for part in src.split(".")):
                    found.append(f"{where}:{node.lineno}: from {src} import ...")
                for a in node.names:
                    if _private(a.name):
                        found.append(f"{where}:{node.lineno}: from {src} import {a.name}")
                    foreign[a.asname or a.name] = src
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in foreign:
                found.append(f"{where}:{node.lineno}: {base.id}.{node.attr} ({base.id} from {foreign[base.id]})")
            elif owners.get(node.attr) and own not in owners[node.attr]:
                found.append(f"{where}:{node.lineno}: .{node.attr} (defined only in {', '.join(sorted(owners[node.attr]))})")
    return found


def test_the_scan_sees_each_kind_of_reach(tmp_path):
    """A private import, a private attribute of an imported module, of an imported class and of an
    instance are found; a package's own privates, relative sibling imports and dunders pass."""
    (tmp_path / "nvfp4stack" / "tasks").mkdir(parents=True)
    (tmp_path / "nvfp4stack" / "plan").mkdir()
    (tmp_path / "nvfp4stack" / "plan" / "planner.py").write_text(
        "class Plan:\n    def _rows(self):\n        return []\n_SAME = 1\n")
    (tmp_path / "nvfp4stack" / "tasks" / "plan.py").write_text("def _fmt(n):\n    return n\n")
    (tmp_path / "nvfp4stack" / "tasks" / "probe.py").write_text(
        "import nvfp4stack.plan.build as build\n"
        "from nvfp4stack.plan import planner\n"
        "from nvfp4stack.plan.planner import Plan, _SAME\n"
        "from nvfp4stack.tasks.plan import _fmt\n"
        "from . import plan as sibling\n"
        "x = build._private, planner._hidden, Plan._cache, planner.__file__, sibling._fmt\n"
        "def rows(plan):\n    return plan._rows()\n")
    found = [f.split(":", 2)[2].strip() for f in cross_package_private_uses(tmp_path)]
    assert found == [
        "from nvfp4stack.plan.planner import _SAME",
        "build._private (build from nvfp4stack.plan.build)",
        "planner._hidden (planner from nvfp4stack.plan)",
        "Plan._cache (Plan from nvfp4stack.plan.planner)",
        "._rows (defined only in plan)",
    ]


def test_no_package_reaches_another_packages_private_names():
    assert len(list((ROOT / "nvfp4stack").rglob("*.py"))) > 50
    found = cross_package_private_uses(ROOT)
    assert not found, ("private names reached across packages; make the name public where it is defined "
                       "(or move the code into its package):\n" + "\n".join(found))
