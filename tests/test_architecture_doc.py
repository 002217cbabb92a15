"""docs/ARCHITECTURE.md's "The registries" and "To add X, touch Y" tables stay true (issue #37).

The tables are read, not copied here: every path they name exists (a ``<placeholder>`` matches at
least one file or directory), every name given right after a path (``models/registry.py``
``PACKAGES``, ``plan/memory.py`` (``group_bytes``)) is defined there, every config key of the
registries table is a RootConfig key, every registry object of the core is named by a row, and what
each registry holds is where its row says (families, factories, backends, converters, commands).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TOKEN = re.compile(r"`([^`]+)`")
# Between a path and a name defined in it: nothing but punctuation ("`x.py` (`NAME`, `OTHER`; ...").
NAME_AFTER = re.compile(r"^[\s(),;]*$")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KEY = re.compile(r"^[a-z_]+\.([a-z_]+|\*)$")


def _table(heading: str) -> list[dict[str, str]]:
    """The rows of the first table under ``## heading``, as {column: cell}."""
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith("|")]
    split = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    head, rows = split[0], [r for r in split[2:] if len(r) == len(split[0])]
    assert rows and set(split[1]) <= {"---", ":---", "---:", ":---:"}, f"{DOC}: no table under '## {heading}'"
    return [dict(zip(head, r)) for r in rows]


def _row(rows: list[dict[str, str]], word: str) -> dict[str, str]:
    found = [r for r in rows if word in next(iter(r.values()))]
    assert len(found) == 1, f"{DOC}: expected one row naming {word!r}, found {len(found)}"
    return found[0]


def _is_path(token: str) -> bool:
    return "/" in token.split(" ")[0] or token.split(":")[0].endswith((".py", ".yaml", ".json", ".md"))


def _paths(token: str, near: str | None = None) -> list[Path]:
    """The files or directories a table's path token names: relative to ``near`` (the directory the
    cell named just before, for a bare file name), the repository or nvfp4stack/; ``<x>`` matches
    anything, and a token ending in ``/`` only directories."""
    rel = token.split(":")[0].split(" ")[0]
    pattern = re.sub(r"<[^>]+>", "*", rel.rstrip("/"))
    bases = ([ROOT / re.sub(r"<[^>]+>", "*", near)] if near and "/" not in rel else []) + [ROOT, ROOT / "nvfp4stack"]
    for base in bases:
        hits = sorted(h for b in (sorted(ROOT.glob(str(base.relative_to(ROOT)))) if "*" in str(base) else [base])
                      for h in b.glob(pattern)
                      if not (rel.endswith("/") and not h.is_dir()) and "__pycache__" not in h.parts)
        if hits:
            return hits
    return []


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _defines(path: Path, name: str) -> bool:
    """``name`` is defined in the module ``path`` (for a package directory: in it or one of its modules)."""
    files = [path] if path.is_file() else [path / "__init__.py", *sorted(path.glob("*.py"))]
    for f in files:
        if f.is_file() and f.suffix == ".py" and hasattr(importlib.import_module(_module(f)), name):
            return True
    return False


def _checks(rows: list[dict[str, str]]):
    """(where, path token, the directory token before it in the cell, [names right after it]) for
    every path token of every cell."""
    for row in rows:
        for col, cell in row.items():
            matches = list(TOKEN.finditer(cell))
            near = None
            for i, m in enumerate(matches):
                if not _is_path(m.group(1)):
                    continue
                before, near = near, (m.group(1) if m.group(1).endswith("/") else near)
                names, end = [], m.end()
                for nxt in matches[i + 1:]:
                    if not (NAME_AFTER.match(cell[end:nxt.start()]) and IDENT.match(nxt.group(1))):
                        break
                    names.append(nxt.group(1))
                    end = nxt.end()
                yield f"{next(iter(row.values()))!r} / {col}", m.group(1), before, names


@pytest.mark.parametrize("heading", ["The registries", "To add X, touch Y"])
def test_every_path_and_name_the_table_gives_exists(heading):
    rows = _table(heading)
    checked = 0
    for where, token, near, names in _checks(rows):
        hits = _paths(token, near)
        assert hits, f"{DOC} '{heading}' {where}: `{token}` names no file or directory in the repository"
        if "<" not in token:
            for name in names:
                assert _defines(hits[0], name), f"{DOC} '{heading}' {where}: `{name}` is not defined in `{token}`"
                checked += 1
    assert checked >= 3, f"{heading}: expected names after paths (e.g. `models/registry.py` `PACKAGES`)"
    for row in rows:
        for m in re.finditer(r"python -m (nvfp4stack[\w.]*)", " ".join(row.values())):
            assert importlib.util.find_spec(m.group(1)), f"{DOC} '{heading}': module {m.group(1)} does not exist"


def test_registry_keys_are_config_keys():
    from nvfp4stack.config import RootConfig

    fields = {f.name: f for f in dataclasses.fields(RootConfig)}
    keys = [t for r in _table("The registries") for t in TOKEN.findall(r["key"]) if KEY.match(t)]
    assert len(keys) >= 4, keys
    for key in keys:
        group, _, name = key.partition(".")
        assert group in fields, f"{DOC}: registry key `{key}`: RootConfig has no {group!r}"
        sub = {f.name for f in dataclasses.fields(fields[group].default_factory())}
        assert name == "*" or name in sub, f"{DOC}: registry key `{key}`: {group} has no {name!r}; its keys: {sorted(sub)}"


def test_every_core_registry_is_in_the_table():
    """Each ``Registry(...)`` object outside the model families' own packages is named by a row."""
    where = " ".join(r["where"] for r in _table("The registries"))
    found = []
    for f in sorted((ROOT / "nvfp4stack").rglob("*.py")):
        if f.relative_to(ROOT / "nvfp4stack").parts[0] == "models" and len(f.relative_to(ROOT / "nvfp4stack").parts) > 2:
            continue   # a family's own registry (its config fix-ups) is the family's business
        for node in ast.walk(ast.parse(f.read_text())):
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call) \
                    and getattr(value.func, "id", None) == "Registry":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [t.id for t in targets if isinstance(t, ast.Name)]
    assert found, "no Registry(...) found in nvfp4stack"
    missing = [n for n in found if f"`{n}`" not in where]
    assert not missing, f"{DOC} 'The registries': registries {missing} are not in the table"


def _dir_of(row: dict[str, str]) -> Path:
    return next(p for t in TOKEN.findall(row["where"]) if _is_path(t) for p in _paths(t))


def test_families_and_factories_are_where_the_tables_say():
    from nvfp4stack.families.family import ModelFamily
    from nvfp4stack.families.registry import factory_names, families
    from nvfp4stack.models import PACKAGES

    add = next(t for t in TOKEN.findall(_row(_table("To add X, touch Y"), "model family")["touch"]) if "<family>" in t)
    for pkg in PACKAGES:
        assert isinstance(importlib.import_module(pkg).FAMILY, ModelFamily), f"{pkg}: FAMILY is no ModelFamily"
        assert _paths(add.replace("<family>", pkg.rsplit(".", 1)[1])), f"{DOC}: family {pkg} is not at `{add}`"
    assert {f.name for f in families()} and len(families()) == len(PACKAGES)
    factories = set(factory_names())
    for conf in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        m = re.search(r"^factory: (\S+)", conf.read_text(), re.M)
        if m and m.group(1) != "null":
            assert m.group(1) in factories, f"{conf}: model.factory={m.group(1)} is not registered ({sorted(factories)})"


def test_backends_and_converters_are_where_the_table_says():
    import nvfp4stack.convert  # noqa: F401  (registers every converter)
    from nvfp4stack.convert.base import CONVERTERS
    from nvfp4stack.kernels.base import LINEAR_BACKENDS, MOE_BACKENDS, load_backends
    from nvfp4stack.schemes import Scheme

    rows = _table("The registries")
    load_backends()
    kernels = _dir_of(_row(rows, "kernel backends"))
    for reg in (MOE_BACKENDS, LINEAR_BACKENDS):
        modules = [reg.get(n).__module__ for n in reg.names()]
        assert modules and len(set(modules)) == len(modules), f"{reg.kind}: one backend per module, found {modules}"
        for name in reg.names():
            b = reg.get(name)
            path = Path(importlib.import_module(b.__module__).__file__)
            assert kernels in path.parents, f"{reg.kind} {name}: in {path}, not under `{kernels}`"
            assert b.is_supported and b.can_implement
    convert = _dir_of(_row(rows, "converters"))
    assert CONVERTERS.names()
    for name in CONVERTERS.names():
        c = CONVERTERS.get(name)
        path = Path(importlib.import_module(c.__module__).__file__)
        # a family may register its own converter inside its package (the core never names it)
        assert convert in path.parents or (ROOT / "nvfp4stack" / "models") in path.parents, f"converter {name}: in {path}"
        assert isinstance(c.source, Scheme) and isinstance(c.target, Scheme), f"converter {name}: source/target"


def test_every_command_has_the_task_the_table_names():
    from nvfp4stack.usage import COMMANDS

    cell = _row(_table("The registries"), "commands")["what registers"]
    task = next(t for t in TOKEN.findall(cell) if "<command>" in t)
    for command in COMMANDS:
        path = _paths(task.replace("<command>", command))
        assert path, f"{DOC}: command {command!r} has no `{task}`"
        assert callable(getattr(importlib.import_module(_module(path[0])), "run", None)), f"{path[0]}: no run(cfg)"
