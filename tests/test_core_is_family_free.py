"""The core reaches a model family only through nvfp4stack/families/ (the contract and registry): no
DeepSeek-specific literal (family names, wo_a, compressor, indexer) in any module outside
nvfp4stack/models/, families/ included."""
from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nvfp4stack"
# 'llm-compressor' is a library (precision-rule semantics), not the family's compressor.
LITERAL = re.compile(r"deepseek|dsv4|wo_a|(?<!llm-)compressor|indexer", re.IGNORECASE)
def _core_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "models")


def test_no_family_literal_outside_models():
    hits = []
    for path in _core_files():
        rel = path.relative_to(PACKAGE).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if LITERAL.search(line):
                hits.append(f"nvfp4stack/{rel}:{i}: {line.strip()}")
    assert not hits, "family-specific literals in the core (move them into nvfp4stack/models/<family>/):\n" + "\n".join(hits)


def test_scan_sees_the_core_and_the_pattern_bites():
    files = {p.relative_to(PACKAGE).as_posix() for p in _core_files()}
    assert {"config.py", "plan/planner.py", "tasks/serve.py", "doctor/__init__.py",
            "families/family.py", "families/registry.py", "families/resolve.py"} <= files
    assert not any(f.startswith("models/") for f in files)
    for text in ("model.family == 'deepseek_v4'", "attn.wo_a", "x.compressor.wkv", "indexer.wq_b", "tiny_dsv4"):
        assert LITERAL.search(text), text
    assert not LITERAL.search("llm-compressor targets/ignore")
