"""model.num_layers: a descriptor cut to its first N decoder layers, full width (planning, synthetic serve)."""
from __future__ import annotations

import json

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.families.resolve import descriptor_files, with_num_layers
from nvfp4stack.plan.build import plan_for_config


def test_per_layer_lists_keep_their_first_layers_and_the_mtp_tail():
    hf = json.loads(descriptor_files()["dsv4_flash"].read_text())
    n0 = hf["num_hidden_layers"]
    cut = with_num_layers(hf, 8)
    assert cut["num_hidden_layers"] == 8 and hf["num_hidden_layers"] == n0   # the input is not changed
    assert cut["compress_ratios"] == hf["compress_ratios"][:8] + hf["compress_ratios"][n0:]
    assert cut["num_hash_layers"] == min(hf["num_hash_layers"], 8)
    assert with_num_layers(hf, 2)["num_hash_layers"] == 2
    assert with_num_layers(hf, None) is hf and with_num_layers(hf, n0) is hf
    with pytest.raises(ValueError, match=r"model.num_layers=44: expected at most the model's num_hidden_layers \(43\)"):
        with_num_layers(hf, n0 + 1)


def test_the_plan_counts_only_the_kept_layers(tmp_path):
    full = plan_for_config(compose_config("recipe=dsv4_flash_h200", f"run_dir={tmp_path}"))
    cut = plan_for_config(compose_config("recipe=dsv4_flash_h200", "model.num_layers=8", f"run_dir={tmp_path}"))
    experts = lambda p: sum(1 for g in p.groups if g.role == "routed_experts" and not g.mtp)  # noqa: E731
    assert experts(full) == 43 * 256 * 3 and experts(cut) == 8 * 256 * 3
    assert cut.num_hidden_layers == 8
    assert any(g.mtp for g in cut.groups)   # the MTP block stays


@pytest.mark.parametrize("overrides,found", [
    (("model.num_layers=0",), "a count below 1"),
    (("model.path=/tmp", "model.num_layers=2"), "model.path='/tmp'"),
])
def test_num_layers_only_for_a_descriptor(overrides, found, tmp_path):
    with pytest.raises(Exception, match=r"model.num_layers=.*expected a positive layer count for a weight-free "
                                        rf"descriptor.*found {found}"):
        compose_config("recipe=dsv4_flash_h200", *overrides, f"run_dir={tmp_path}")
