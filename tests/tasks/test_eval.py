"""``eval`` task: run(cfg) on the tiny DeepSeek-V4 writes metrics.json + metrics.md (layertest, e2e);
eval.level=auto picks each family's first level."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nvfp4stack.cli import compose_config

ROOT = Path(__file__).resolve().parents[2]


def compose(*overrides: str):
    return compose_config(*overrides, "command=eval")


@pytest.mark.parametrize("recipe, level", [("tiny_cpu", "e2e"), ("tiny_dsv4", "layertest"), ("tiny_qwen3_moe", "e2e")])
def test_auto_level_is_the_familys_first(recipe, level, capsys):
    from nvfp4stack.families.registry import get_family
    from nvfp4stack.tasks.eval import _with_level

    cfg = compose(f"recipe={recipe}", "eval.level=auto", "run_dir=/tmp/unused")
    resolved = _with_level(cfg)
    assert resolved.eval.level == level == get_family(cfg.model.family).eval_levels[0]
    assert cfg.eval.level == "auto" and f"eval.level=auto -> {level}" in capsys.readouterr().out
    explicit = compose(f"recipe={recipe}", "eval.level=serve_task", "run_dir=/tmp/unused")
    assert _with_level(explicit) is explicit


def test_default_level_is_auto():
    assert compose("run_dir=/tmp/unused").eval.level == "auto"


@pytest.fixture
def seed():
    s = random.randrange(1, 2**31)
    print(f"eval.seed={s}")
    return s


@pytest.mark.slow
def test_layertest_writes_metrics(tmp_path, seed):
    from nvfp4stack.tasks.eval import run

    cfg = compose("recipe=tiny_dsv4", "eval.num_prompts=1", "eval.max_tokens=12", f"eval.seed={seed}",
                  f"run_dir={tmp_path}")
    assert run(cfg) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["level"] == "layertest" and m["seed"] == seed
    assert m["precision"]["routed_experts"] == "nvfp4" and m["precision"]["attn.wo_a"] == "fp8_block"
    roles = m["layertest"]["roles"]
    assert roles["attn.wo_a"]["cosine_min"] < 1.0 and roles["attn.wq_a"]["cosine_min"] == pytest.approx(1.0)
    assert m["summary"]["fidelity"] == min(r["cosine_min"] for r in roles.values())
    assert m["weight_bytes"] > 0
    assert "| routed_experts | nvfp4 |" in (tmp_path / "metrics.md").read_text()


def test_e2e_writes_metrics(tmp_path, seed):
    from nvfp4stack.tasks.eval import run

    cfg = compose("recipe=tiny_dsv4", "eval.level=e2e", "eval.num_prompts=1", "eval.max_tokens=10",
                  f"eval.seed={seed}", f"run_dir={tmp_path}")
    assert run(cfg) == 0
    e = json.loads((tmp_path / "metrics.json").read_text())["e2e"]
    assert e["positions"] == 9 and e["prompts"] == 1
    assert 0.0 < e["kl_mean"] and 0.0 <= e["top1_agreement"] <= 1.0
    assert e["ppl_ref"] > 1.0 and e["ppl_quant"] > 1.0
    assert "KL mean" in (tmp_path / "metrics.md").read_text()


def test_level_the_family_lacks_is_refused_with_the_key(tmp_path):
    from nvfp4stack.tasks.eval import run

    cfg = compose("recipe=tiny_cpu", "eval.level=layertest", f"run_dir={tmp_path}")   # DeepseekV3: e2e only
    with pytest.raises(ValueError, match=r"eval.level=layertest: model.family=deepseek_v3 has a reference forward for e2e"):
        run(cfg)


def test_e2e_bf16_against_bf16_is_exact(tmp_path):
    """The sanity row of the fidelity tables: precision=bf16 against the BF16 reference gives KL 0,
    top-1 agreement 1 and the same perplexity (the harness adds no error of its own)."""
    from nvfp4stack.tasks.eval import run

    cfg = compose("recipe=tiny_dsv4", "precision=bf16", "eval.level=e2e", "eval.num_prompts=2", "eval.max_tokens=12",
                  f"run_dir={tmp_path}")
    assert run(cfg) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert set(m["precision"].values()) == {"bf16"}, m["precision"]
    e = m["e2e"]
    assert (e["kl_mean"], e["kl_max"], e["top1_agreement"]) == (0.0, 0.0, 1.0), e
    assert e["ppl_ref"] == e["ppl_quant"]
