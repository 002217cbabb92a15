"""Golden guard (issue #37): every recipe's plan.json and every byte the tiny convert paths write stay
what the committed goldens say, so a refactor that should change nothing proves it.

The goldens live in tests/golden/. After a change that is *meant* to move a plan or converted bytes,
regenerate them with ``NVFP4STACK_UPDATE_GOLDEN=1 python -m pytest -q tests/test_golden.py`` and
say why in the commit message.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from nvfp4stack.cli import RECIPES_DIR, compose_config

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("NVFP4STACK_UPDATE_GOLDEN") == "1"

# Every recipe as `python main.py recipe=X plan` composes it, plus the overrides the README's convert
# and cast commands plan with (a plan case is its file name: recipe, then overrides).
PLAN_CASES = {r: (f"recipe={r}",) for r in sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))} | {
    "tiny_dsv4+w4a16": ("recipe=tiny_dsv4", "precision.routed_experts=nvfp4_w4a16"),
    "tiny_dsv4+official": ("recipe=tiny_dsv4", "model.source_format=official"),
}

# Each convert path the tiny recipes exercise: (task, overrides). Random-weight factories only: a trained
# model's bytes depend on the host's float summation order, seeded random weights do not.
CONVERT_CASES = {
    "tiny_dsv4-bf16-w4a16": ("convert", "recipe=tiny_dsv4", "precision.routed_experts=nvfp4_w4a16"),
    "tiny_dsv4-release-nvfp4": ("convert", "recipe=tiny_dsv4", "model.source_format=official"),
    "tiny_dsv4-release-w4a16": ("convert", "recipe=tiny_dsv4", "model.source_format=official",
                                "precision.routed_experts=nvfp4_w4a16"),
    "tiny_dsv4-cast-w4a16": ("quantize", "recipe=tiny_dsv4", "quantize.method=cast",
                             "precision.routed_experts=nvfp4_w4a16"),
    "tiny_cpu-bf16-nvfp4": ("convert", "model.factory=tiny_v3_random"),
    "tiny_qwen3_moe-bf16-nvfp4": ("convert", "recipe=tiny_qwen3_moe"),
}
# What a loader reads; convert's own bookkeeping (manifest, report) and copied tokenizer files are left out.
HASHED = ("*.safetensors", "*.index.json", "config.json", "hf_quant_config.json")


def _quiet(run, cfg) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return run(cfg)


def _check(golden: Path, found, what: str) -> None:
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    assert golden.exists(), f"{golden}: no golden for {what}; generate it with NVFP4STACK_UPDATE_GOLDEN=1"
    assert found == json.loads(golden.read_text()), (
        f"{what} differs from {golden}; if the change is intended, regenerate with NVFP4STACK_UPDATE_GOLDEN=1")


@pytest.mark.parametrize("case", sorted(PLAN_CASES))
def test_plan_json_matches_its_golden(case, tmp_path):
    from nvfp4stack.tasks import plan

    cfg = compose_config(*PLAN_CASES[case], f"run_dir={tmp_path}")
    assert _quiet(plan.run, cfg) == 0
    _check(GOLDEN / "plans" / f"{case}.json", json.loads((tmp_path / "plan.json").read_text()), f"plan.json of {case}")


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> dict[str, dict[str, str]]:
    """sha256 of every hashed file each convert path writes, built once per session (seconds, from the
    cache's seeded factory models)."""
    from nvfp4stack.tasks import convert, quantize

    base = tmp_path_factory.mktemp("golden_convert")
    found = {}
    for case, (task, *overrides) in CONVERT_CASES.items():
        out = base / case / "out"
        dst = f"convert.dst={out}" if task == "convert" else f"quantize.output_dir={out}"
        cfg = compose_config(*overrides, f"run_dir={base / case}", dst)
        assert _quiet(convert.run if task == "convert" else quantize.run, cfg) == 0, case
        files = sorted({p for pattern in HASHED for p in out.glob(pattern)})
        found[case] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    return found


def test_converted_bytes_match_the_golden_sha256s(converted):
    assert all(any(n.endswith(".safetensors") for n in files) for files in converted.values()), converted
    _check(GOLDEN / "converted_sha256.json", converted, "the converted files' sha256")
