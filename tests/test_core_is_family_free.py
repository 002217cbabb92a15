"""The core reaches a model family only through nvfp4stack/models/registry.py: no DeepSeek-specific
literal (family names, wo_a, compressor, indexer) in any module outside nvfp4stack/models/."""
from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nvfp4stack"
# 'llm-compressor' is a library (precision-rule semantics), not the family's compressor.
LITERAL = re.compile(r"deepseek|dsv4|wo_a|(?<!llm-)compressor|indexer", re.IGNORECASE)
# Known follow-up, not an exception to the rule: helper K's kernel-backend rework of issue #19
# renames the kernels' family-named SwiGLU clamp and rewords their docstrings; the lead empties
# this list when that branch is merged. bench/moe_kernel.py only imports that function.
ALLOWED = {
    "kernels/linear/torch_emulation.py", "kernels/moe/fp8_prefill.py", "kernels/moe/deep_gemm.py",
    "kernels/moe/routing_triton.py", "kernels/moe/torch_emulation.py", "kernels/moe/_fp8_prefill_kernels.py",
    "kernels/moe/triton_w4a16.py", "kernels/moe/_triton_w4a16_kernels.py", "bench/moe_kernel.py",
}


def _core_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "models")


def test_no_family_literal_outside_models():
    hits = []
    for path in _core_files():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ALLOWED:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if LITERAL.search(line):
                hits.append(f"nvfp4stack/{rel}:{i}: {line.strip()}")
    assert not hits, "family-specific literals in the core (move them into nvfp4stack/models/<family>/):\n" + "\n".join(hits)


def test_scan_sees_the_core_and_the_pattern_bites():
    files = {p.relative_to(PACKAGE).as_posix() for p in _core_files()}
    assert {"config.py", "plan/planner.py", "tasks/serve.py", "doctor/__init__.py"} <= files
    assert not any(f.startswith("models/") for f in files)
    assert all((PACKAGE / f).exists() for f in ALLOWED), sorted(f for f in ALLOWED if not (PACKAGE / f).exists())
    for text in ("model.family == 'deepseek_v4'", "attn.wo_a", "x.compressor.wkv", "indexer.wq_b", "tiny_dsv4"):
        assert LITERAL.search(text), text
    assert not LITERAL.search("llm-compressor targets/ignore")
