import json

import pytest

from nvfp4stack.models import DESCRIPTORS
from nvfp4stack.models.deepseek_v4.spec import compress_ratios, dsv4_tensor_groups


def _load(name):
    return json.loads((DESCRIPTORS / f"{name}.json").read_text())


@pytest.mark.parametrize("name,lo,hi", [("dsv4_pro", 1.5e12, 1.7e12), ("dsv4_flash", 2.5e11, 3.2e11)])
def test_parameter_counts_match_the_published_sizes(name, lo, hi):
    total = sum(g.numel for g in dsv4_tensor_groups(_load(name)))
    assert lo <= total <= hi


def test_pro_structure():
    c = _load("dsv4_pro")
    groups = {g.name: g for g in dsv4_tensor_groups(c)}
    assert groups["layers.0.attn.wo_a"].shape == (16 * 1024, 128 * 512 // 16)
    assert groups["layers.0.ffn.experts.383.w2"].shape == (7168, 3072)
    assert "layers.0.ffn.gate.tid2eid" in groups and "layers.3.ffn.gate.bias" in groups
    assert "layers.3.ffn.gate.tid2eid" not in groups
    ratios = compress_ratios(c)
    for i, r in enumerate(ratios):
        assert (f"layers.{i}.attn.compressor.wkv" in groups) == (r > 1)
        assert (f"layers.{i}.attn.indexer.wq_b" in groups) == (r == 4)
    # ratio-4 compressors overlap windows: twice the output width
    i4 = ratios.index(4)
    assert groups[f"layers.{i4}.attn.compressor.wkv"].shape == (2 * 512, 7168)
    mtp = [g for g in groups.values() if g.mtp]
    assert any(g.role == "routed_experts" for g in mtp) and all(g.name.startswith("mtp.0.") for g in mtp)


def test_missing_compress_ratios_is_a_clear_error():
    c = _load("dsv4_flash")
    del c["compress_ratios"]
    with pytest.raises(KeyError, match="neither 'compress_ratios' nor 'layer_types'"):
        list(dsv4_tensor_groups(c))
    c["layer_types"] = ["sliding_attention"] * (c["num_hidden_layers"] - 1)
    with pytest.raises(ValueError, match="expected num_hidden_layers=43"):
        compress_ratios(c)
