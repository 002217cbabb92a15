"""vLLM 0.26's DeepSeek-V4 KV pool (plan/kv_pool.py) against what vLLM 0.26.0 logged on H200s.

Measured on one H200, 2026-11-26 (vLLM 0.26.0, synthetic weights, DeepSeek-V4-Flash full width cut
to model.num_layers=8, compress ratios 0,0,128,4,128,4,128,4; tp=1, max_model_len 4096,
gpu_memory_utilization 0.85, max_num_seqs 32, block size 256, kv_cache_dtype fp8):
  "Available KV cache memory: 85.87 GiB" / "GPU KV cache size: 1,707,577 tokens" /
  "Maximum concurrency for 4,096 tokens per request: 416.89x"; another start: 84.34 GiB,
  1,677,293 tokens, 409.50x.
Measured on two H200s the same day: all 43 layers, tp=2 (no EP), max_num_seqs 256, same settings:
  "Maximum concurrency for 4,096 tokens per request: 27.57x".
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from nvfp4stack.models import DESCRIPTORS
from nvfp4stack.models.deepseek_v4.kv_cache import dsv4_layer_specs
from nvfp4stack.plan.kv_cache import format_kv_report, kv_cache_report, nothing_fits
from nvfp4stack.plan.kv_pool import KVLayerSpec, in_flight_tokens, packed_pool, pool_capacity

GiB = 2**30
FLASH = json.loads((DESCRIPTORS / "dsv4_flash.json").read_text())
FLASH8 = {**FLASH, "num_hidden_layers": 8, "compress_ratios": FLASH["compress_ratios"][:8]}
H200_8_LAYERS = [(85.87, 1_707_577, "416.89"), (84.34, 1_677_293, "409.50")]   # (GiB logged, tokens, concurrency)


def _pool(hf, mtp=0):
    return packed_pool(dsv4_layer_specs(hf, "fp8", 256, mtp))


def test_flash_8_layers_pool_shape():
    """9 full-attention layers (3 C4 KV, 3 C4 indexer, 3 C128 KV) and the sliding groups split to 3 layer tuples."""
    assert FLASH8["compress_ratios"] == [0, 0, 128, 4, 128, 4, 128, 4]
    pool = _pool(FLASH8)
    assert [(b, w, len(p)) for b, w, p in pool.groups] == [
        (256, None, 9), (64, 128, 3), (64, 128, 3), (64, 128, 2), (8, 128, 3), (4, 8, 6)]
    assert pool.bytes_per_block == 3 * 37440 + 3 * 1728 + 3 * 8640 == 143_424
    cap = pool_capacity(pool, 0, 4096, in_flight_tokens(4096, 32))
    # ~54 KB charged per token for 8 layers: the ~100x the old per-token plan (560 B/token stored) missed
    assert cap.blocks_per_request == 1542 and round(cap.blocks_per_request * pool.bytes_per_block / 4096) == 53_994


@pytest.mark.parametrize("gib,tokens,concurrency", H200_8_LAYERS)
def test_reproduces_the_h200_log(gib, tokens, concurrency):
    """vLLM logs the available bytes rounded to 0.01 GiB (format_gib): the block counts whose bytes log
    as ``gib`` include one that gives exactly the logged tokens and concurrency, and no other figure."""
    pool = _pool(FLASH8)
    in_flight = in_flight_tokens(4096, 32)
    near = pool_capacity(pool, int(gib * GiB), 4096, in_flight)
    # 0.005 GiB of rounding is 37 blocks of 143,424 B: 0.024x (plus the log's own 0.005x), 99 tokens
    assert abs(near.tokens - tokens) < 100 and abs(near.max_concurrency - float(concurrency)) < 0.03
    lo, hi = int((gib - 0.005) * GiB) // pool.bytes_per_block, int((gib + 0.005) * GiB) // pool.bytes_per_block + 1
    seen = set()
    for blocks in range(lo, hi + 1):
        available = blocks * pool.bytes_per_block
        if round(available / GiB, 2) != gib:
            continue
        cap = pool_capacity(pool, available, 4096, in_flight)
        assert cap.num_blocks == blocks
        seen.add((cap.tokens, f"{cap.max_concurrency:.2f}"))
    assert (tokens, concurrency) in seen
    assert pool_capacity(pool, int(gib * GiB), 4096, in_flight).one_request_bytes < gib * GiB


def test_flash_43_layers_tp2():
    """Every TP rank holds the whole cache (one latent head): tp changes no per-rank figure. 27.57x on
    two H200s at 1,533 blocks a request of 1,032,768 B means ~40.65 GiB of KV memory per rank."""
    pool = _pool(FLASH)
    assert pool.bytes_per_block == 22 * 37440 + 21 * 1728 + 20 * 8640 == 1_032_768
    cap = pool_capacity(pool, int(40.65 * GiB), 4096, in_flight_tokens(4096, 256))
    assert cap.blocks_per_request == 1533 and f"{cap.max_concurrency:.2f}" == "27.57"
    engine = SimpleNamespace(kv_cache_dtype="fp8", block_size=256, max_model_len=4096, gpu_memory_utilization=0.85,
                             speculative=SimpleNamespace(method=None), tp=1, dp=1, ep=False, max_num_seqs=256)
    one = kv_cache_report(FLASH, engine, SimpleNamespace(gpu_memory_gb=141.0), 80e9)
    two = kv_cache_report(FLASH, SimpleNamespace(**{**vars(engine), "tp": 2}), SimpleNamespace(gpu_memory_gb=141.0), 80e9)
    assert one["vllm"] == two["vllm"] and one["max_kv_tokens"] == two["max_kv_tokens"]


def test_in_flight_tokens_follow_the_defaults():
    # 8192 batched tokens on an H100/H200-class API server, two batches in flight (async scheduling)
    assert in_flight_tokens(4096) == 16384 and in_flight_tokens(65536, 256) == 16384
    assert in_flight_tokens(100, 4) == 800          # capped at max_num_seqs x max_model_len
    # a window of 8 in 4-token pages (its 500 B page padded to the full layer's 1000 B): all 4096
    # tokens in flight charge cdiv(4096, 4) + 1 pages, 10 in flight cdiv(8 - 1 + 10, 4) + 1
    small = packed_pool([KVLayerSpec(1000, 256), KVLayerSpec(500, 4, 8)])
    assert small.bytes_per_block == 1000
    assert pool_capacity(small, 0, 4096, 16384).blocks_per_request == 16 + 1025
    assert pool_capacity(small, 0, 4096, 10).blocks_per_request == 16 + 6


def test_plan_section_uses_vllms_figures():
    """The brief's plan (two H200s, tp=2, 4096 tokens, util 0.85): tokens that fit and batch are the
    start-up figures vLLM would log for the plan's budget; the stored bytes stay shown."""
    engine = SimpleNamespace(kv_cache_dtype="fp8", block_size=256, max_model_len=4096, gpu_memory_utilization=0.85,
                             speculative=SimpleNamespace(method=None), tp=2, dp=1, ep=False, max_num_seqs=None)
    weights = 84.79e9
    r = kv_cache_report(FLASH, engine, SimpleNamespace(gpu_memory_gb=141.0), weights)
    budget = 141e9 * 0.85 - weights
    cap = pool_capacity(_pool(FLASH), int(budget), 4096, 16384)
    assert (r["max_kv_tokens"], r["max_batch_at_max_len"]) == (cap.tokens, int(cap.max_concurrency))
    assert r["vllm"]["num_blocks"] == cap.num_blocks == int(budget) // 1_032_768
    assert r["bytes_per_token"] == pytest.approx(3741.75)       # stored: what the pages hold
    assert r["vllm"]["bytes_per_token"] == pytest.approx(1533 * 1_032_768 / 4096)
    text = format_kv_report(r)
    print(text)
    assert f"GPU KV cache size {cap.tokens:,} tokens; maximum concurrency {cap.max_concurrency:,.2f}x" in text
    over = [line for line in text.splitlines() if "over-conservative" in line]
    assert len(over) == 1 and "holds 42 blocks" in over[0] and "charges 1,533" in over[0]


def test_nothing_fits_when_one_max_len_request_does_not():
    """vLLM 0.26 refuses to start when one max_model_len request's reservation exceeds the KV memory."""
    engine = SimpleNamespace(kv_cache_dtype="fp8", block_size=256, max_model_len=1_048_576, gpu_memory_utilization=0.9,
                             speculative=SimpleNamespace(method="mtp"), tp=8, dp=1, ep=True, max_num_seqs=None)
    need = pool_capacity(_pool(FLASH, mtp=1), 0, 1_048_576, 16384).one_request_bytes
    weights = 141e9 * 0.9 - need + 1e6          # a budget 1 MB short of one request
    r = kv_cache_report(FLASH, engine, SimpleNamespace(gpu_memory_gb=141.0), weights)
    assert r["max_kv_tokens"] is None and r["kv_budget_bytes"] > 0
    line = nothing_fits(r)
    assert line.startswith("NOTHING FITS at engine.max_model_len=1048576: vLLM 0.26 needs ")
    assert "lower engine.max_model_len" in line and line in format_kv_report(r)
    fits = kv_cache_report(FLASH, engine, SimpleNamespace(gpu_memory_gb=141.0), weights - 2e6)
    assert fits["max_kv_tokens"] is not None and nothing_fits(fits) is None
    # the same budget reached with part of it as vLLM's runtime reserve: the reason names that key too
    reserved = kv_cache_report(FLASH, engine, SimpleNamespace(gpu_memory_gb=141.0, runtime_reserve_gb=5.0),
                               weights - 5e9)
    assert reserved["kv_budget_bytes"] == pytest.approx(r["kv_budget_bytes"])
    assert "after vLLM's runtime reserve of 5.00 GB (arch.runtime_reserve_gb)" in nothing_fits(reserved)
    none_left = kv_cache_report(FLASH, engine, SimpleNamespace(gpu_memory_gb=141.0, runtime_reserve_gb=200.0), 1e9)
    assert nothing_fits(none_left).startswith("NOTHING FITS on this layout") and "(arch.runtime_reserve_gb)" in \
        nothing_fits(none_left)


# vLLM 0.26.0's logs on H200s, synthetic DeepSeek-V4-Flash weights, max_model_len 4096, gpu_memory_utilization 0.85
# (bench/RESULTS.md): (overrides, "Model loading took" GiB, "GPU KV cache size")
NO_DRAFT = ["engine.ep=false", "engine.speculative.method=null"]
MEASURED_H200 = [
    # two H200s of a four-H200 host, 2026-11-27, all 43 layers, max_num_seqs 256: ours and stock side by side
    ([*NO_DRAFT, "engine.tp=2", "engine.max_num_seqs=256"], 78.13, 101_846),
    ([*NO_DRAFT, "engine.tp=2", "engine.max_num_seqs=256", "precision.routed_experts=mxfp4", "backend.moe=marlin"], 74.06,
     112_526),
    # one H200, 2026-11-27, 8 layers, max_num_seqs 8: stock
    ([*NO_DRAFT, "model.num_layers=8", "engine.tp=1", "engine.max_num_seqs=8", "precision.routed_experts=mxfp4",
      "backend.moe=marlin"], 29.42, 1_709_033),
    # two H200s, 2026-11-27 (sixth visit): ours at TP=2 + EP, no draft
    (["engine.ep=true", "engine.speculative.method=null", "engine.tp=2", "engine.max_num_seqs=256"], 78.1, 103_225),
    # four H200s, 2026-11-27 (seventh visit): the recipe as written, TP4 + EP with the MTP draft (its start's load and
    # memory profile; the machine went before it was ready)
    (["engine.tp=4", "engine.max_num_seqs=256"], 40.96, 206_266),
]


@pytest.mark.parametrize("overrides,weights_gib,kv_tokens", MEASURED_H200)
def test_the_flash_h200_recipe_plans_what_vllm_measured(overrides, weights_gib, kv_tokens):
    """The recipe's plan per GPU within 5% of what vLLM logged: weights, and the KV tokens once the recipe's
    arch.runtime_reserve_gb (vLLM's memory-profile reserve) is off the budget; without the reserve the TP=2
    KV figures were 12-15% high."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.plan.build import kv_cache_for_config, plan_for_config

    cfg = compose_config("recipe=dsv4_flash_h200", "engine.max_model_len=4096", "engine.gpu_memory_utilization=0.85",
                         *overrides,
                         "run_dir=/tmp/unused")
    assert cfg.arch.runtime_reserve_gb > 0
    plan = plan_for_config(cfg)
    kv = kv_cache_for_config(cfg, plan)
    assert kv["weight_bytes_per_gpu"] / GiB == pytest.approx(weights_gib, rel=0.05)
    assert kv["max_kv_tokens"] == pytest.approx(kv_tokens, rel=0.05)
    assert "vLLM's runtime reserve 5.00 GB (arch.runtime_reserve_gb)" in format_kv_report(kv)
