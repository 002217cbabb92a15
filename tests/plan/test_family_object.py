"""The model family travels as an object (issue #37): ``plan_for_config`` looks it up once, and the walk
from the recipe's ``precision.routed_experts`` to the planner's decision asks no registry again."""
from __future__ import annotations

import pytest

from nvfp4stack.arch import resolve
from nvfp4stack.cli import compose_config
from nvfp4stack.families import registry
from nvfp4stack.plan.build import layout_of, plan_for_config, plan_groups
from nvfp4stack.plan.planner import build_plan


def _no_registry(*_a, **_k):
    raise AssertionError("the planner climbed back to the model-family registry")


@pytest.mark.parametrize("recipe,experts,want", [
    ("dsv4_flash_b200", "nvfp4", "nvfp4"),     # weight-free descriptors: no factory build
    ("dsv4_flash_b200", "bf16", "bf16"),
    ("qwen3_235b_b200", "fp8_block", "fp8_block"),
])
def test_routed_experts_decision_asks_no_registry(recipe, experts, want, monkeypatch, tmp_path):
    cfg = compose_config(f"recipe={recipe}", f"precision.routed_experts={experts}", f"run_dir={tmp_path}")
    reference = plan_for_config(cfg)          # the edge: looks the family up (and registers converters)
    family = registry.get_family(cfg.model.family)
    hf, groups = plan_groups(cfg, family)

    monkeypatch.setattr(registry, "_families", _no_registry)
    monkeypatch.setattr(registry, "plugins", _no_registry)
    with pytest.raises(AssertionError, match="climbed back"):
        registry.get_family(cfg.model.family)  # the block bites
    plan = build_plan(groups, model=cfg.model.name, family=family, arch=resolve(cfg.arch.name),
                      source_format=cfg.model.source_format, precision=cfg.precision, backend=cfg.backend,
                      layout=layout_of(cfg.engine), fp8_ue8m0=cfg.precision.fp8_scale_fmt == "ue8m0",
                      num_hidden_layers=hf.get("num_hidden_layers"))

    assert plan.to_json() == reference.to_json()
    experts = {g.target.value for g in plan.groups if g.role == "routed_experts" and not g.mtp}
    assert experts == {want}
    assert plan.family == family.name == cfg.model.family
