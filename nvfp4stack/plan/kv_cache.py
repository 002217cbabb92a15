"""KV-cache bytes per token and per sequence on one GPU, and the context / batch that fits.

DeepSeek-V4 numbers follow vLLM's own cache specs (vllm 0.32, site-packages):

- ``vllm/models/deepseek_v4/attention.py`` ``DeepseekV4MLAAttention.get_kv_cache_spec``: layers
  with compress_ratio 4 or 128 keep one 584-byte state (448 B FP8 NoPE + 128 B BF16 RoPE + 8 B
  UE8M0 scales; layout in ``v1/attention/backends/mla/flashmla_sparse.py``) per ``ratio`` tokens,
  pages of ``block_size`` tokens padded to 576 B; bf16 rows are 512*2 B, fp8 rows 512 B.
- same file, ``DeepseekV4Indexer``: ratio-4 layers also keep an indexer K cache of
  128 fp8 + 4 fp32 scales = 132 B per compressed state.
- ``vllm/v1/attention/backends/mla/sparse_swa.py`` ``DeepseekV4SWACache``: every layer (the MTP
  layer too, whose compress_ratio is 1) keeps the last ``sliding_window`` tokens, 584 B each in
  64-token pages: a fixed cost per sequence, not per token.
- ``vllm/models/deepseek_v4/compressor.py``: compressor states (f32, ``2*coff*head_dim`` wide)
  over a window of ``coff*ratio`` tokens: also a fixed cost per sequence.
- ``vllm/v1/kv_cache_interface.py``: page = states per page * state bytes, rounded up to the
  alignment; sliding-window specs hold ``cdiv(window - 1 + in_flight, block) + 1`` pages.

Every cache is built with ``max_tp_shards=1`` (one latent KV head), so each TP rank holds the
whole cache: per-GPU bytes per token do not shrink with TP. vLLM's hybrid allocator may pad page
sizes further when it groups layers; the figures here are its per-spec formulas, an estimate
within a few percent.
"""
from __future__ import annotations

from dataclasses import dataclass

from nvfp4stack.models.dsv4_spec import compress_ratios

DSV4_FP8_DS_MLA_BYTES = 584       # per token per layer (attention.py, state_content_bytes)
DSV4_PAGE_ALIGN_FP8_DS_MLA = 576  # FlashMLA packing stride
DSV4_PAGE_ALIGN_DENSE = 512       # bf16 / per-tensor fp8 rows
DSV4_SWA_BLOCK = 64               # DeepseekV4SWACache default block_size
DSV4_DEFAULT_BLOCK = 256          # compressor.py: "KV block shape [256//4, head_dim]"
DEFAULT_GPU_UTIL = 0.92           # vLLM CacheConfig.gpu_memory_utilization default
DECODE_IN_FLIGHT = 1              # tokens in flight per decoding sequence (sliding-window pages)
GB = 1e9


@dataclass
class CacheLine:
    """One cache kind across the layers that allocate it."""

    cache: str
    layers: int
    page_bytes: int
    tokens_per_page: int
    bytes_per_token: float = 0.0     # grows with context (per GPU, all such layers)
    bytes_per_seq: float = 0.0       # fixed per sequence (sliding windows, compressor state)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def resolve_kv_dtype(kv_cache_dtype: str) -> str:
    """What vLLM's DeepSeek-V4 stores for ``--kv-cache-dtype`` on the FlashMLA-sparse path.

    ``_resolve_dsv4_kv_cache_dtype``: with the fp8_ds_mla layout (the NVIDIA sparse backends),
    auto and every fp8 spelling become fp8_ds_mla; bfloat16 stays bf16 rows.
    """
    if kv_cache_dtype in ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla"):
        return "fp8_ds_mla"
    if kv_cache_dtype in ("bfloat16", "float16"):
        return "bfloat16"
    raise ValueError(
        f"engine.kv_cache_dtype={kv_cache_dtype!r}: DeepSeek-V4 in vLLM stores fp8_ds_mla (auto, fp8, "
        "fp8_e4m3, fp8_ds_mla) or bfloat16 rows; fp8_e5m2 is not supported there. Fix: engine.kv_cache_dtype=fp8"
    )


def _paged(states_per_page: int, state_bytes: int, align: int) -> int:
    return _round_up(states_per_page * state_bytes, align)


def _window_pages(window: int, block: int) -> int:
    # kv_cache_interface.SlidingWindowSpec.max_admission_blocks_per_request at decode
    return -(-(window - 1 + DECODE_IN_FLIGHT) // block) + 1


def dsv4_cache_lines(hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int) -> list[CacheLine]:
    """Per cache kind: layers, page bytes, bytes per token and per sequence on one GPU."""
    dtype = resolve_kv_dtype(kv_dtype)
    block = block_size or DSV4_DEFAULT_BLOCK
    head_dim = int(hf.get("head_dim", 512))
    window = int(hf.get("sliding_window", 128))
    idx_dim = int(hf.get("index_head_dim", 128))
    ds = dtype == "fp8_ds_mla"
    state = DSV4_FP8_DS_MLA_BYTES if ds else head_dim * 2
    align = DSV4_PAGE_ALIGN_FP8_DS_MLA if ds else DSV4_PAGE_ALIGN_DENSE
    ratios = [max(1, r) for r in compress_ratios(hf)]
    lines: list[CacheLine] = []

    n_all = len(ratios) + mtp_layers
    swa_page = _paged(DSV4_SWA_BLOCK, state, align)
    lines.append(CacheLine("swa (sliding window, every layer)", n_all, swa_page, DSV4_SWA_BLOCK,
                           bytes_per_seq=n_all * _window_pages(window, DSV4_SWA_BLOCK) * swa_page))
    for ratio in sorted(set(r for r in ratios if r > 1)):
        n = ratios.count(ratio)
        page = _paged(block // ratio, state, align)
        lines.append(CacheLine(f"compressed kv (ratio {ratio})", n, page, block, bytes_per_token=n * page / block))
        coff = 1 + (ratio == 4)
        cblock = 4 if ratio == 4 else 8                      # compressor.py block sizes
        cstate = 2 * coff * head_dim * 4                     # f32 kv_state + score_state
        cpage = _paged(cblock, cstate, align)
        lines.append(CacheLine(f"compressor state (ratio {ratio})", n, cpage, cblock,
                               bytes_per_seq=n * _window_pages(coff * ratio, cblock) * cpage))
        if ratio == 4:  # only C4A layers have the lightning indexer
            ipage = _paged(block // ratio, idx_dim + idx_dim // 128 * 4, align)
            lines.append(CacheLine("indexer k (ratio 4, fp8)", n, ipage, block, bytes_per_token=n * ipage / block))
            icstate = 2 * coff * idx_dim * 4
            icpage = _paged(cblock, icstate, align)
            lines.append(CacheLine("indexer compressor state", n, icpage, cblock,
                                   bytes_per_seq=n * _window_pages(coff * ratio, cblock) * icpage))
    return lines


def mla_cache_lines(hf: dict, kv_dtype: str, block_size: int | None) -> list[CacheLine]:
    """DeepSeek-V3 style MLA: one (kv_lora_rank + rope) latent per token per layer."""
    latent = int(hf["kv_lora_rank"]) + int(hf["qk_rope_head_dim"])
    n = int(hf["num_hidden_layers"])
    if kv_dtype == "fp8_ds_mla":
        per = 656  # V3.2 layout: 512 fp8 + 4 fp32 scales + 64 bf16 (flashmla_sparse.py)
    elif kv_dtype.startswith("fp8"):
        per = latent
    else:
        per = latent * 2
    block = block_size or 16
    return [CacheLine("mla latent kv", n, block * per, block, bytes_per_token=n * per)]


def kv_cache_report(hf_config: dict, engine_cfg, arch_cfg, weight_bytes_per_gpu: float) -> dict:
    """KV bytes per token / per sequence on one GPU and what fits after the weights.

    Args:
        hf_config: the model's config.json.
        engine_cfg: ``cfg.engine`` (kv_cache_dtype, block_size, max_model_len, tp, speculative, ...).
        arch_cfg: ``cfg.arch`` (gpu_memory_gb, decimal GB per GPU; 0 = unknown, nothing to fit).
        weight_bytes_per_gpu: the plan's per-GPU weight bytes.
    Returns:
        a JSON-able dict; ``format_kv_report`` prints it.
    """
    kv_dtype = getattr(engine_cfg, "kv_cache_dtype", "auto")
    block = getattr(engine_cfg, "block_size", None)
    spec = getattr(engine_cfg, "speculative", None)
    mtp_layers = int(hf_config.get("num_nextn_predict_layers", 0)) if getattr(spec, "method", None) == "mtp" else 0
    if hf_config.get("model_type") == "deepseek_v4" or "compress_ratios" in hf_config:
        stored = resolve_kv_dtype(kv_dtype)
        lines = dsv4_cache_lines(hf_config, kv_dtype, block, mtp_layers)
    elif "kv_lora_rank" in hf_config:
        stored = kv_dtype
        lines = mla_cache_lines(hf_config, kv_dtype, block)
    else:
        raise ValueError(
            f"kv_cache_report: model_type {hf_config.get('model_type')!r} is neither DeepSeek-V4 nor an MLA "
            "model (no compress_ratios / kv_lora_rank in config.json); only those are planned"
        )
    per_token = sum(c.bytes_per_token for c in lines)
    per_seq = sum(c.bytes_per_seq for c in lines)
    util = getattr(engine_cfg, "gpu_memory_utilization", None) or DEFAULT_GPU_UTIL
    gpu_bytes = float(getattr(arch_cfg, "gpu_memory_gb", 0.0) or 0.0) * GB
    max_len = getattr(engine_cfg, "max_model_len", None) or int(hf_config.get("max_position_embeddings", 0)) or None
    out = {
        "kv_cache_dtype": kv_dtype, "stored_as": stored, "block_size": block,
        "mtp_layers_cached": mtp_layers,
        "caches": [vars(c) for c in lines],
        "bytes_per_token": per_token, "bytes_per_seq": per_seq,
        "gpu_memory_bytes": gpu_bytes, "gpu_memory_utilization": util,
        "weight_bytes_per_gpu": float(weight_bytes_per_gpu), "max_model_len": max_len,
        "kv_budget_bytes": None, "max_kv_tokens": None, "max_context_one_seq": None, "max_batch_at_max_len": None,
    }
    if gpu_bytes <= 0:
        return out
    budget = gpu_bytes * util - weight_bytes_per_gpu
    out["kv_budget_bytes"] = budget
    if budget <= per_seq:
        return out  # the weights (plus one sequence's fixed state) do not fit: nothing to plan
    out["max_kv_tokens"] = int(budget // per_token)
    one = int((budget - per_seq) // per_token)
    out["max_context_one_seq"] = min(one, max_len) if max_len else one
    if max_len:
        out["max_batch_at_max_len"] = int(budget // (max_len * per_token + per_seq))
    return out


def format_kv_report(d: dict) -> str:
    """The KV section of ``plan``'s printout."""
    lines = [f"KV cache per GPU ({d['kv_cache_dtype']} -> stored as {d['stored_as']}, block {d['block_size'] or 'default'};"
             " replicated on every TP rank: one latent KV head)"]
    for c in d["caches"]:
        grow = f"{c['bytes_per_token']:10.2f} B/token" if c["bytes_per_token"] else " " * 17
        fixed = f"{c['bytes_per_seq'] / 2**20:8.2f} MiB/seq" if c["bytes_per_seq"] else ""
        lines.append(f"  {c['cache']:<36}{c['layers']:>4} layers  page {c['page_bytes']:>7} B  {grow}  {fixed}")
    lines.append(f"  total: {d['bytes_per_token']:,.2f} bytes per token + {d['bytes_per_seq'] / 2**20:,.2f} MiB per sequence")
    if d["kv_budget_bytes"] is None:
        lines.append("  no GPU memory given (arch.gpu_memory_gb=0): set it to get the tokens that fit")
        return "\n".join(lines)
    lines.append(
        f"  budget: {d['gpu_memory_bytes'] / GB:,.1f} GB x {d['gpu_memory_utilization']:.2f} - weights "
        f"{d['weight_bytes_per_gpu'] / GB:,.2f} GB = {d['kv_budget_bytes'] / GB:,.2f} GB for KV cache per GPU")
    if d["max_kv_tokens"] is None:
        lines.append("  NOTHING FITS: the weights leave no room for KV cache; add GPUs (engine.tp/ep) or "
                     "shrink the weights (precision.*)")
        return "\n".join(lines)
    lines.append(f"  max KV tokens that fit: {d['max_kv_tokens']:,} "
                 f"(one sequence: {d['max_context_one_seq']:,} tokens of context"
                 + (f"; at max_model_len {d['max_model_len']:,}: batch {d['max_batch_at_max_len']:,})" if d["max_model_len"] else ")"))
    return "\n".join(lines)
