"""KV planner: page sizes against vLLM's own KVCacheSpec classes, and known DeepSeek-V4 Pro figures."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nvfp4stack.models import DESCRIPTORS
from nvfp4stack.models.deepseek_v4.kv_cache import DSV4_FP8_DS_MLA_BYTES, dsv4_cache_lines, resolve_kv_dtype
from nvfp4stack.plan.kv_cache import format_kv_report, kv_cache_report, model_dtype

VLLM = Path(torch.__file__).parent.parent / "vllm"
PRO = json.loads((DESCRIPTORS / "dsv4_pro.json").read_text())


def _engine(**kw):
    base = dict(kv_cache_dtype="fp8", block_size=256, max_model_len=None, gpu_memory_utilization=None,
                speculative=SimpleNamespace(method="mtp", num_speculative_tokens=2), tp=8, dp=1, ep=True)
    return SimpleNamespace(**{**base, **kw})


def test_584_bytes_is_what_vllm_source_says():
    src = (VLLM / "models/deepseek_v4/attention.py").read_text()
    assert f"state_content_bytes={DSV4_FP8_DS_MLA_BYTES} if uses_fp8_ds_mla_layout" in src
    swa = (VLLM / "v1/attention/backends/mla/sparse_swa.py").read_text()
    assert re.search(rf"packed_bytes_per_token: int = {DSV4_FP8_DS_MLA_BYTES}\b", swa)
    assert "block_size: int = 64" in swa  # our DSV4_SWA_BLOCK


@pytest.mark.parametrize("kv", ["fp8", "bfloat16"])
def test_page_bytes_match_vllm_specs(kv):
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

    seed = random.randrange(2**31)
    print(f"seed={seed}")
    block = random.Random(seed).choice([64, 128, 256, 512])
    ds = resolve_kv_dtype(kv) == "fp8_ds_mla"
    common = dict(num_kv_heads=1, max_tp_shards=1, alignment=576 if ds else 512)
    kv_dt = torch.uint8 if ds else torch.bfloat16
    content = 584 if ds else None
    lines = {c.cache: c for c in dsv4_cache_lines(PRO, kv, block, mtp_layers=1)}
    for ratio in (4, 128):
        want = MLAAttentionSpec(block_size=block, head_size=512, dtype=kv_dt, tokens_per_state=ratio,
                                state_content_bytes=content, model_version="deepseek_v4", **common)
        assert lines[f"compressed kv (ratio {ratio})"].page_bytes == want.page_size_bytes, (ratio, block)
        coff = 1 + (ratio == 4)
        cs = SlidingWindowMLASpec(block_size=4 if ratio == 4 else 8, head_size=2 * coff * 512, dtype=torch.float32,
                                  sliding_window=coff * ratio, **common)
        c = lines[f"compressor state (ratio {ratio})"]
        assert c.page_bytes == cs.page_size_bytes
        assert c.bytes_per_seq == c.layers * cs.max_admission_blocks_per_request(1, 10**6) * cs.page_size_bytes
    idx = MLAAttentionSpec(block_size=block, head_size=132, dtype=torch.uint8, tokens_per_state=4, **common)
    assert lines["indexer k (ratio 4, fp8)"].page_bytes == idx.page_size_bytes
    swa = SlidingWindowMLASpec(block_size=64, head_size=512, dtype=kv_dt, sliding_window=PRO["sliding_window"],
                               state_content_bytes=content, model_version="deepseek_v4", **common)
    s = lines["swa (sliding window, every layer)"]
    assert s.layers == PRO["num_hidden_layers"] + 1  # the MTP layer (compress_ratio 1) has a SWA cache
    assert s.page_bytes == swa.page_size_bytes
    assert s.bytes_per_seq == s.layers * swa.max_admission_blocks_per_request(1, 10**6) * swa.page_size_bytes


def test_pro_bytes_per_token_from_layer_counts():
    r = kv_cache_report(PRO, _engine(), SimpleNamespace(gpu_memory_gb=0.0), 0.0)
    n4, n128 = PRO["compress_ratios"].count(4), PRO["compress_ratios"].count(128)
    # 256-token pages: ratio 4 -> 64 states x 584 B -> 37440 B; indexer 64 x 132 -> 8640; ratio 128 -> 2 x 584 -> 1728
    assert r["bytes_per_token"] == pytest.approx((n4 * (37440 + 8640) + n128 * 1728) / 256)
    assert r["max_kv_tokens"] is None
    assert "arch.gpu_memory_gb=0" in format_kv_report(r)


def test_pro_b200_fits_and_bf16_halves_it():
    from nvfp4stack.models.deepseek_v4 import FAMILY
    from nvfp4stack.models.deepseek_v4.spec import dsv4_tensor_groups
    from nvfp4stack.models.deepseek_v4.spec import source_scheme as source_scheme_dsv4
    from nvfp4stack.plan.memory import Layout, group_bytes, shard_factor
    from nvfp4stack.schemes import Scheme

    lay = Layout(tp=8, dp=1, ep=True)
    groups = [(g, source_scheme_dsv4(g, "official")) for g in dsv4_tensor_groups(PRO)]
    native = sum(group_bytes(g, s) for g, s in groups)
    nv = sum(group_bytes(g, Scheme.NVFP4 if g.role == "routed_experts" else s) for g, s in groups)
    print(f"Pro native {native / 1e9:.1f} GB, NVFP4 experts {nv / 1e9:.1f} GB")
    assert 855e9 < native < 875e9      # published: ~864 (FP8 attention + MXFP4 experts)
    assert 880e9 < nv < 915e9          # published: 880-915 GB with NVFP4 routed experts
    per_gpu = sum(group_bytes(g, Scheme.NVFP4 if g.role == "routed_experts" else s) / shard_factor(g, lay, FAMILY.tp_sharded_roles)
                  for g, s in groups)
    fp8 = kv_cache_report(PRO, _engine(), SimpleNamespace(gpu_memory_gb=180.0), per_gpu)
    text = format_kv_report(fp8)
    print(text)
    # vLLM 0.26 sizes DeepSeek-V4 by its packed pool (tests/plan/test_kv_pool.py), not bytes per token
    assert fp8["max_kv_tokens"] == int(fp8["vllm"]["num_blocks"] / fp8["vllm"]["blocks_per_request"] * 1_048_576)
    assert fp8["vllm"]["num_blocks"] == int(180e9 * 0.92 - per_gpu) // fp8["vllm"]["bytes_per_block"]
    assert fp8["max_kv_tokens"] > 1_000_000 and fp8["max_batch_at_max_len"] >= 1
    assert "max KV tokens that fit" in text
    bf16 = kv_cache_report(PRO, _engine(kv_cache_dtype="bfloat16"), SimpleNamespace(gpu_memory_gb=180.0), per_gpu)
    assert 1.4 < bf16["bytes_per_token"] / fp8["bytes_per_token"] < 2.0  # 1024 B rows vs 584 B; indexer unchanged
    tiny = kv_cache_report(PRO, _engine(), SimpleNamespace(gpu_memory_gb=80.0), per_gpu)
    assert tiny["max_kv_tokens"] is None and "NOTHING FITS" in format_kv_report(tiny)


def test_bad_kv_dtype_names_the_key():
    with pytest.raises(ValueError, match="engine.kv_cache_dtype"):
        resolve_kv_dtype("fp8_e5m2")


def test_mtp_layers_cached_are_the_familys_count(monkeypatch):
    from nvfp4stack.plan.kv_cache import CacheLine
    from tests.support.toy_family import register_toy_family

    seen = []

    def kv_cache(self, hf, kv_dtype, block_size, mtp_layers, tp=1, model_dtype=None):
        seen.append(mtp_layers)
        return "bfloat16", [CacheLine("kv", 1 + mtp_layers, 4096, 16, bytes_per_token=256.0 * (1 + mtp_layers))]

    toy = register_toy_family(monkeypatch, mtp_layers=lambda self, hf: hf["draft_layers"], kv_cache=kv_cache)
    hf = {"draft_layers": 3, "num_nextn_predict_layers": 7}   # DeepSeek's key means nothing to this family
    r = kv_cache_report(hf, _engine(), SimpleNamespace(gpu_memory_gb=0.0), 0.0, family=toy)
    assert seen == [3] and r["mtp_layers_cached"] == 3 and r["bytes_per_token"] == 1024.0
    off = kv_cache_report(hf, _engine(speculative=SimpleNamespace(method=None)), SimpleNamespace(gpu_memory_gb=0.0),
                          0.0, family=toy)
    assert seen == [3, 0] and off["mtp_layers_cached"] == 0
    assert kv_cache_report(PRO, _engine(), SimpleNamespace(gpu_memory_gb=0.0), 0.0)["mtp_layers_cached"] == \
        PRO["num_nextn_predict_layers"]


@pytest.mark.parametrize("engine_dtype,hf,want", [
    ("float32", {"torch_dtype": "bfloat16"}, "float32"),     # engine.dtype wins over config.json
    ("float16", {}, "float16"),
    ("auto", {"torch_dtype": "float16"}, "float16"),          # auto: config.json's dtype ...
    ("auto", {"dtype": "bfloat16"}, "bfloat16"),              # (transformers 5 writes 'dtype')
    ("auto", {"torch_dtype": "float32"}, "bfloat16"),         # ... a float32 model downcast, as vLLM does
    ("auto", {}, "bfloat16"),
    (None, {"torch_dtype": "float16"}, "float16"),
])
def test_model_dtype_is_what_vllm_runs(engine_dtype, hf, want):
    assert model_dtype(engine_dtype, hf) == want


def test_auto_kv_cache_follows_engine_dtype():
    """kv_cache_dtype=auto caches the dtype the engine runs the model in (vLLM: model_config.dtype), not
    config.json's when engine.dtype says otherwise; DeepSeek-V4 stores fp8_ds_mla for auto whatever it is."""
    from nvfp4stack.models.qwen3_moe.spec import _head_dim

    hf = json.loads((Path(__file__).resolve().parents[2] / "nvfp4stack/models/qwen3_moe/descriptors/"
                     "qwen3_235b_a22b.json").read_text())
    assert hf["torch_dtype"] == "bfloat16"
    no_gpu = SimpleNamespace(gpu_memory_gb=0.0)
    per_elem = hf["num_hidden_layers"] * 2 * hf["num_key_value_heads"] * _head_dim(hf)

    def report(**kw):
        engine = _engine(**{"kv_cache_dtype": "auto", "speculative": None, "tp": 1, **kw})
        return kv_cache_report(hf, engine, no_gpu, 0.0)

    fp32 = report(dtype="float32")
    assert (fp32["stored_as"], fp32["model_dtype"], fp32["bytes_per_token"]) == ("float32", "float32", 4 * per_elem)
    assert "auto -> stored as float32" in format_kv_report(fp32)
    assert (report(dtype="auto")["stored_as"], report(dtype="auto")["bytes_per_token"]) == ("bfloat16", 2 * per_elem)
    assert report(dtype="float32", kv_cache_dtype="fp8")["stored_as"] == "fp8"   # an explicit kv dtype stays
    v4 = kv_cache_report(PRO, _engine(kv_cache_dtype="auto", dtype="float32"), no_gpu, 0.0)
    assert v4["stored_as"] == "fp8_ds_mla" and v4["bytes_per_token"] == kv_cache_report(
        PRO, _engine(kv_cache_dtype="auto"), no_gpu, 0.0)["bytes_per_token"]
