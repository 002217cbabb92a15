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
