"""DeepSeek-V4 KV-cache kinds per GPU, from vLLM's own cache specs.

The numbers follow vLLM's own cache specs (vllm 0.32, site-packages):

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

from nvfp4stack.models.deepseek_v4.spec import compress_ratios
from nvfp4stack.plan.kv_cache import CacheLine, paged, window_pages
from nvfp4stack.plan.kv_pool import KVLayerSpec

DSV4_FP8_DS_MLA_BYTES = 584       # per token per layer (attention.py, state_content_bytes)
DSV4_PAGE_ALIGN_FP8_DS_MLA = 576  # FlashMLA packing stride
DSV4_PAGE_ALIGN_DENSE = 512       # bf16 / per-tensor fp8 rows
DSV4_SWA_BLOCK = 64               # DeepseekV4SWACache default block_size
DSV4_DEFAULT_BLOCK = 256          # compressor.py: "KV block shape [256//4, head_dim]"


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


def _geometry(hf: dict, kv_dtype: str, block_size: int | None) -> dict:
    """Page bytes of each cache kind (vLLM's per-spec formulas, alignment padding included)."""
    ds = resolve_kv_dtype(kv_dtype) == "fp8_ds_mla"
    head_dim = int(hf.get("head_dim", 512))
    idx_dim = int(hf.get("index_head_dim", 128))
    state = DSV4_FP8_DS_MLA_BYTES if ds else head_dim * 2
    align = DSV4_PAGE_ALIGN_FP8_DS_MLA if ds else DSV4_PAGE_ALIGN_DENSE
    block = block_size or DSV4_DEFAULT_BLOCK
    g = {"block": block, "window": int(hf.get("sliding_window", 128)),
         "swa": paged(DSV4_SWA_BLOCK, state, align), "idx": paged(block // 4, idx_dim + idx_dim // 128 * 4, align)}
    for ratio in (4, 128):
        coff = 1 + (ratio == 4)
        cblock = 4 if ratio == 4 else 8                      # compressor.py block sizes
        g[ratio] = {"kv": paged(block // ratio, state, align), "cblock": cblock, "cwindow": coff * ratio,
                    "state": paged(cblock, 2 * coff * head_dim * 4, align),        # f32 kv_state + score_state
                    "idx_state": paged(cblock, 2 * coff * idx_dim * 4, align)}
    return g


def dsv4_cache_lines(hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int) -> list[CacheLine]:
    """Per cache kind: layers, page bytes, stored bytes per token and per sequence on one GPU."""
    g = _geometry(hf, kv_dtype, block_size)
    block, window = g["block"], g["window"]
    ratios = [max(1, r) for r in compress_ratios(hf)]
    lines: list[CacheLine] = []

    n_all = len(ratios) + mtp_layers
    lines.append(CacheLine("swa (sliding window, every layer)", n_all, g["swa"], DSV4_SWA_BLOCK,
                           bytes_per_seq=n_all * window_pages(window, DSV4_SWA_BLOCK) * g["swa"]))
    for ratio in sorted(set(r for r in ratios if r > 1)):
        n, r = ratios.count(ratio), g[ratio]
        lines.append(CacheLine(f"compressed kv (ratio {ratio})", n, r["kv"], block, bytes_per_token=n * r["kv"] / block))
        lines.append(CacheLine(f"compressor state (ratio {ratio})", n, r["state"], r["cblock"],
                               bytes_per_seq=n * window_pages(r["cwindow"], r["cblock"]) * r["state"]))
        if ratio == 4:  # only C4A layers have the lightning indexer
            lines.append(CacheLine("indexer k (ratio 4, fp8)", n, g["idx"], block, bytes_per_token=n * g["idx"] / block))
            lines.append(CacheLine("indexer compressor state", n, r["idx_state"], r["cblock"],
                                   bytes_per_seq=n * window_pages(r["cwindow"], r["cblock"]) * r["idx_state"]))
    return lines


def dsv4_layer_specs(hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int) -> list[KVLayerSpec]:
    """Every cache layer vLLM 0.26 registers, in model order: per layer its SWA cache; with compress
    ratio 4 or 128 its compressed KV (full attention) and compressor state; with ratio 4 also the
    indexer K cache (full attention) and the indexer's compressor state. The MTP layer (ratio 1)
    has a SWA cache only."""
    g = _geometry(hf, kv_dtype, block_size)
    out: list[KVLayerSpec] = []
    for ratio in [max(1, r) for r in compress_ratios(hf)] + [1] * mtp_layers:
        out.append(KVLayerSpec(g["swa"], DSV4_SWA_BLOCK, g["window"]))
        if ratio == 1:
            continue
        r = g[ratio]
        out.append(KVLayerSpec(r["kv"], g["block"]))
        out.append(KVLayerSpec(r["state"], r["cblock"], r["cwindow"]))
        if ratio == 4:
            out.append(KVLayerSpec(g["idx"], g["block"]))
            out.append(KVLayerSpec(r["idx_state"], r["cblock"], r["cwindow"]))
    return out
