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
    swa_page = paged(DSV4_SWA_BLOCK, state, align)
    lines.append(CacheLine("swa (sliding window, every layer)", n_all, swa_page, DSV4_SWA_BLOCK,
                           bytes_per_seq=n_all * window_pages(window, DSV4_SWA_BLOCK) * swa_page))
    for ratio in sorted(set(r for r in ratios if r > 1)):
        n = ratios.count(ratio)
        page = paged(block // ratio, state, align)
        lines.append(CacheLine(f"compressed kv (ratio {ratio})", n, page, block, bytes_per_token=n * page / block))
        coff = 1 + (ratio == 4)
        cblock = 4 if ratio == 4 else 8                      # compressor.py block sizes
        cstate = 2 * coff * head_dim * 4                     # f32 kv_state + score_state
        cpage = paged(cblock, cstate, align)
        lines.append(CacheLine(f"compressor state (ratio {ratio})", n, cpage, cblock,
                               bytes_per_seq=n * window_pages(coff * ratio, cblock) * cpage))
        if ratio == 4:  # only C4A layers have the lightning indexer
            ipage = paged(block // ratio, idx_dim + idx_dim // 128 * 4, align)
            lines.append(CacheLine("indexer k (ratio 4, fp8)", n, ipage, block, bytes_per_token=n * ipage / block))
            icstate = 2 * coff * idx_dim * 4
            icpage = paged(cblock, icstate, align)
            lines.append(CacheLine("indexer compressor state", n, icpage, cblock,
                                   bytes_per_seq=n * window_pages(coff * ratio, cblock) * icpage))
    return lines
