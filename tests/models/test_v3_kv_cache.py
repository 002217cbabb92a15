"""DeepseekV3 MLA KV cache: page sizes against vLLM's own MLAAttentionSpec, and the default recipe's plan
prints it (issue #38: `plan` printed no KV section for tiny_cpu / tiny_v3_h200)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from nvfp4stack.families.registry import get_family
from nvfp4stack.models.deepseek_v3.kv_cache import mla_cache_lines, mla_latent_elements

VLLM = Path(torch.__file__).parent.parent / "vllm"
# DeepSeek-V3's own MLA sizes (config.json of the release): 61 layers, one MTP layer
V3 = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
      "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1}
TORCH_DTYPE = {"bfloat16": torch.bfloat16, "float32": torch.float32, "fp8": torch.float8_e4m3fn}


def test_latent_width_is_what_vllm_caches():
    src = (VLLM / "model_executor/layers/attention/mla_attention.py").read_text()
    assert "self.head_size = kv_lora_rank + qk_rope_head_dim" in src
    assert "num_kv_heads=1,\n            max_tp_shards=1," in src   # one latent head, whole cache on every rank
    assert mla_latent_elements(V3) == 576


@pytest.mark.parametrize("kv,model_dtype", [("auto", "bfloat16"), ("auto", "float32"), ("fp8", "bfloat16"),
                                            ("bfloat16", "float32")])
def test_page_and_token_bytes_match_vllm_spec(kv, model_dtype):
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    seed = random.randrange(2**31)
    print(f"seed={seed}")
    rng = random.Random(seed)
    block = rng.choice([16, 32, 64, 128])
    hf = {**V3, "kv_lora_rank": rng.choice([64, 128, 512]), "qk_rope_head_dim": rng.choice([32, 64])}
    stored, (line,) = mla_cache_lines(hf, kv, block, mtp_layers=0, model_dtype=model_dtype)
    assert stored == (model_dtype if kv == "auto" else kv)
    want = MLAAttentionSpec(block_size=block, num_kv_heads=1, max_tp_shards=1, dtype=TORCH_DTYPE[stored],
                            head_size=hf["kv_lora_rank"] + hf["qk_rope_head_dim"])
    assert line.page_bytes == want.page_size_bytes, (block, hf)
    assert line.layers == 61 and line.bytes_per_token == 61 * want.page_size_bytes / block
    assert line.bytes_per_seq == 0


def test_tp_does_not_split_it_and_the_mtp_draft_adds_its_layer():
    fam = get_family("deepseek_v3")
    _, (one,) = fam.kv_cache(V3, "auto", None, 0, tp=1)
    _, (eight,) = fam.kv_cache(V3, "auto", None, 0, tp=8)
    _, (mtp,) = fam.kv_cache(V3, "auto", None, fam.mtp_layers(V3), tp=8)
    assert one.bytes_per_token == eight.bytes_per_token == 61 * 576 * 2
    assert mtp.layers == 62 and mtp.bytes_per_token == 62 * 576 * 2
    assert one.page_bytes == 16 * 576 * 2          # vLLM's default block (CPU_MLA forces it too)


def test_fp8_ds_mla_is_refused_with_the_key():
    with pytest.raises(ValueError, match=r"^engine.kv_cache_dtype='fp8_ds_mla': .*pick one of those"):
        mla_cache_lines(V3, "fp8_ds_mla", None, 0)


def test_default_recipe_plan_prints_its_kv_cache(tmp_path, capsys):
    """tiny_cpu runs float32 with kv_cache_dtype=auto on CPU_MLA: 3 layers x (512 + 64) x 4 bytes."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.tasks.plan import run

    cfg = compose_config(f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}")
    assert cfg.recipe == "tiny_cpu" and (cfg.engine.dtype, cfg.engine.kv_cache_dtype) == ("float32", "auto")
    assert run(cfg) == 0
    out = capsys.readouterr().out
    assert "KV cache per GPU (auto -> stored as float32" in out
    assert "total: 6,912.00 bytes per token + 0.00 MiB per sequence" in out
    kv = json.loads((tmp_path / "run" / "plan.json").read_text())["kv_cache"]
    (line,) = kv["caches"]
    assert (kv["stored_as"], line["layers"], kv["bytes_per_token"]) == ("float32", 3, 3 * 576 * 4)
