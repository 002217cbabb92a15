"""The README's backend table and commands match the code."""
import re
from pathlib import Path

from nvfp4stack.kernels.table import markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def test_backend_table_is_current():
    text = README.read_text()
    m = re.search(r"<!-- backend-table:start -->\n(.*?)\n<!-- backend-table:end -->", text, re.S)
    assert m, "README lost its backend-table markers"
    assert m.group(1).strip() == markdown().strip(), "run: python -m nvfp4stack.kernels.table and paste it into README.md"


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash install.sh && .venv/bin/python -m pytest -q" in README.read_text()
    assert "bash install.sh" in ci and "python -m pytest -q" in ci


def _recipe_table_names() -> set[str]:
    """The backticked names in the first column of README's recipe table (``a`` / ``b`` rows name two)."""
    m = re.search(r"^\| recipe \| model \|.*?\n\|[-|]+\|\n((?:\|.*\n)+)", README.read_text(), re.M)
    assert m, "README lost its recipe table (header '| recipe | model | ...')"
    return {name for row in m.group(1).splitlines() for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_every_recipe_is_in_the_recipe_table():
    recipes = {p.stem for p in (README.parent / "recipes").glob("*.yaml")}
    listed = _recipe_table_names()
    assert "tiny_cpu" in listed and "qwen3_235b_b200" in listed, listed   # the parse sees both row shapes
    assert not recipes - listed, f"recipes missing from README's recipe table: {sorted(recipes - listed)}"
    assert not listed - recipes, f"README's recipe table names recipes that do not exist: {sorted(listed - recipes)}"
