"""KV-cache bytes per token and per sequence on one GPU, and the context / batch that fits.

A model family computes its own cache kinds (``ModelFamily.kv_cache``: one ``CacheLine`` per kind);
this module sums them per GPU and fits them next to the weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from nvfp4stack.families.registry import family_for_config
from nvfp4stack.plan.kv_pool import PackedPool, decode_blocks, in_flight_tokens, packed_pool, pool_capacity
from nvfp4stack.plan.memory import draft_loaded

DEFAULT_GPU_UTIL = 0.92           # vLLM CacheConfig.gpu_memory_utilization default
DECODE_IN_FLIGHT = 1              # tokens in flight per decoding sequence (sliding-window pages)
DEFAULT_BLOCK = 16                # vLLM CacheConfig.DEFAULT_BLOCK_SIZE, when --block-size is not given
GB = 1e9
VLLM_POOL_VERSION = "0.26"        # the vLLM whose packed-pool accounting kv_pool.py mirrors


@dataclass
class CacheLine:
    """One cache kind across the layers that allocate it."""

    cache: str
    layers: int
    page_bytes: int
    tokens_per_page: int
    bytes_per_token: float = 0.0     # grows with context (per GPU, all such layers)
    bytes_per_seq: float = 0.0       # fixed per sequence (sliding windows, per-sequence state)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def paged(states_per_page: int, state_bytes: int, align: int) -> int:
    return _round_up(states_per_page * state_bytes, align)


def window_pages(window: int, block: int) -> int:
    # kv_cache_interface.SlidingWindowSpec.max_admission_blocks_per_request at decode
    return -(-(window - 1 + DECODE_IN_FLIGHT) // block) + 1


def kv_bytes_per_element(kv_dtype: str | None, model_dtype: str = "bfloat16") -> tuple[str, int]:
    """(stored dtype, bytes) of one element of a dense paged cache (K/V rows, an MLA latent) for
    ``--kv-cache-dtype``; auto stores the dtype the engine runs the model in, ``model_dtype``
    (vllm/utils/torch_utils.py ``kv_cache_dtype_str_to_dtype``; fp8 is per-tensor scaled, 1 byte)."""
    if kv_dtype in ("auto", None):
        kv_dtype = model_dtype
    if kv_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return kv_dtype, 1
    if kv_dtype in ("bfloat16", "float16", "half"):
        return kv_dtype, 2
    if kv_dtype == "float32":
        return kv_dtype, 4
    raise ValueError(f"engine.kv_cache_dtype={kv_dtype!r}: this model's paged KV cache is stored as auto (the model "
                     "dtype), bfloat16, float16, fp8, fp8_e4m3 or fp8_e5m2 (fp8_ds_mla is a sparse-MLA layout); "
                     "pick one of those")


def model_dtype(engine_dtype: str | None, hf_config: dict) -> str:
    """The dtype vLLM runs the model in, which ``--kv-cache-dtype auto`` caches
    (vllm/utils/torch_utils.py ``kv_cache_dtype_str_to_dtype``: auto -> model_config.dtype).

    ``engine.dtype`` when set; for ``auto`` config.json's ``torch_dtype`` (``dtype`` in newer
    configs), bfloat16 when it names none, and a float32 config runs as bfloat16: vLLM downcasts it
    to the platform's first supported dtype, bfloat16 on Ampere and later GPUs and on x86 CPUs
    (vllm/config/model.py ``_resolve_auto_dtype``).
    """
    if engine_dtype and engine_dtype != "auto":
        return engine_dtype
    config = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16").removeprefix("torch.")
    return "bfloat16" if config in ("float32", "float") else config


def kv_cache_report(hf_config: dict, engine_cfg, arch_cfg, weight_bytes_per_gpu: float, family=None) -> dict | None:
    """KV bytes per token / per sequence on one GPU and what fits after the weights.

    Args:
        hf_config: the model's config.json.
        engine_cfg: ``cfg.engine`` (kv_cache_dtype, dtype, block_size, max_model_len, tp, speculative, ...).
        arch_cfg: ``cfg.arch`` (gpu_memory_gb, decimal GB per GPU; 0 = unknown, nothing to fit).
        weight_bytes_per_gpu: the plan's per-GPU weight bytes.
        family: the model's ``ModelFamily`` (default: the one config.json names).
    Returns:
        a JSON-able dict (``format_kv_report`` prints it), or None when the family computes no KV plan.
    """
    kv_dtype = getattr(engine_cfg, "kv_cache_dtype", "auto")
    block = getattr(engine_cfg, "block_size", None)
    if family is None:
        family = family_for_config(hf_config)
    # an MTP draft caches its own layers next to the model's
    mtp_layers = family.mtp_layers(hf_config) if draft_loaded(engine_cfg) else 0
    dtype = model_dtype(getattr(engine_cfg, "dtype", "auto"), hf_config)
    found = family.kv_cache(hf_config, kv_dtype, block, mtp_layers, tp=int(getattr(engine_cfg, "tp", 1) or 1),
                            model_dtype=dtype)
    if found is None:
        return None
    stored, lines = found
    per_token = sum(c.bytes_per_token for c in lines)
    per_seq = sum(c.bytes_per_seq for c in lines)
    util = getattr(engine_cfg, "gpu_memory_utilization", None) or DEFAULT_GPU_UTIL
    gpu_bytes = float(getattr(arch_cfg, "gpu_memory_gb", 0.0) or 0.0) * GB
    reserve = float(getattr(arch_cfg, "runtime_reserve_gb", 0.0) or 0.0) * GB
    max_len = getattr(engine_cfg, "max_model_len", None) or int(hf_config.get("max_position_embeddings", 0)) or None
    out = {
        "kv_cache_dtype": kv_dtype, "stored_as": stored, "model_dtype": dtype, "block_size": block,
        "mtp_layers_cached": mtp_layers,
        "caches": [vars(c) for c in lines],
        "bytes_per_token": per_token, "bytes_per_seq": per_seq,
        "gpu_memory_bytes": gpu_bytes, "gpu_memory_utilization": util, "runtime_reserve_bytes": reserve,
        "weight_bytes_per_gpu": float(weight_bytes_per_gpu), "max_model_len": max_len,
        "kv_budget_bytes": None, "max_kv_tokens": None, "max_context_one_seq": None, "max_batch_at_max_len": None,
    }
    layers = family.kv_pool_layers(hf_config, kv_dtype, block, mtp_layers) if max_len else None
    pool = packed_pool(layers) if layers else None
    in_flight = in_flight_tokens(max_len, getattr(engine_cfg, "max_num_seqs", None)) if pool else 0
    if pool:
        charged = pool_capacity(pool, 0, max_len, in_flight)
        out["vllm"] = {
            "version": VLLM_POOL_VERSION, "bytes_per_block": pool.bytes_per_block,
            "groups": [[b, w, len(p)] for b, w, p in pool.groups], "in_flight_tokens": in_flight,
            "blocks_per_request": charged.blocks_per_request,
            "bytes_per_token": charged.blocks_per_request * pool.bytes_per_block / max_len,
            "one_request_bytes": charged.one_request_bytes,
            "decode_blocks_at_max_len": decode_blocks(pool, max_len),
            "num_blocks": None, "max_concurrency": None, "decode_batch_at_max_len": None,
        }
    if gpu_bytes <= 0:
        return out
    budget = gpu_bytes * util - weight_bytes_per_gpu - reserve
    out["kv_budget_bytes"] = budget
    if pool:
        return _fit_pool(out, pool, budget, max_len, in_flight)
    if budget <= per_seq:
        return out  # the weights (plus one sequence's fixed state) do not fit: nothing to plan
    out["max_kv_tokens"] = int(budget // per_token)
    one = int((budget - per_seq) // per_token)
    out["max_context_one_seq"] = min(one, max_len) if max_len else one
    if max_len:
        out["max_batch_at_max_len"] = int(budget // (max_len * per_token + per_seq))
    return out


def _fit_pool(out: dict, pool: PackedPool, budget: float, max_len: int, in_flight: int) -> dict:
    """Tokens and batch as vLLM 0.26 logs them at start (``pool_capacity``); nothing fits where its
    start-up check would refuse one max_model_len request."""
    v = out["vllm"]
    if budget < v["one_request_bytes"]:
        return out
    cap = pool_capacity(pool, int(budget), max_len, in_flight)
    v.update(num_blocks=cap.num_blocks, max_concurrency=cap.max_concurrency,
             decode_batch_at_max_len=cap.num_blocks // v["decode_blocks_at_max_len"])
    out.update(max_kv_tokens=cap.tokens, max_context_one_seq=max_len, max_batch_at_max_len=int(cap.max_concurrency))
    return out


def nothing_fits(d: dict | None) -> str | None:
    """Why nothing fits beside the weights on a GPU of known size (``plan`` exits 1, ``serve``
    refuses), in one line; None when the KV cache fits or no GPU size is given."""
    if not d or d["kv_budget_bytes"] is None or d["max_kv_tokens"] is not None:
        return None
    v = d.get("vllm")
    if v and d["kv_budget_bytes"] > 0:
        return (f"NOTHING FITS at engine.max_model_len={d['max_model_len']}: vLLM {v['version']} needs "
                f"{v['one_request_bytes'] / GB:,.2f} GB of KV cache for one such request, the budget is "
                f"{d['kv_budget_bytes'] / GB:,.2f} GB per GPU{_reserve_note(d)}; lower engine.max_model_len, add GPUs "
                f"(engine.tp/ep) or shrink the weights (precision.*)")
    return (f"NOTHING FITS on this layout: the weights leave no room for KV cache "
            f"({d['weight_bytes_per_gpu'] / GB:,.2f} GB of weights per GPU, budget {d['gpu_memory_bytes'] / GB:,.1f} GB "
            f"x {d['gpu_memory_utilization']:.2f}{_reserve_note(d)}); add GPUs (engine.tp/ep) or shrink the weights "
            "(precision.*)")


def _reserve_note(d: dict) -> str:
    """How much of the budget vLLM's runtime reserve took, where the recipe sets one."""
    r = d.get("runtime_reserve_bytes") or 0.0
    return f", after vLLM's runtime reserve of {r / GB:,.2f} GB (arch.runtime_reserve_gb)" if r else ""


def _pool_lines(d: dict) -> list[str]:
    v, n = d["vllm"], d["max_model_len"]
    groups = ", ".join(f"{k} layers/{b}{'' if w is None else f' (window {w})'}" for b, w, k in v["groups"])
    return [f"  vLLM {v['version']} pool: {v['bytes_per_block']:,} B per block on every TP rank; groups (layers/tokens per "
            f"page): {groups}",
            f"  vLLM {v['version']} charges a {n:,}-token request {v['blocks_per_request']:,} blocks = "
            f"{v['bytes_per_token']:,.0f} B/token (every group's most pages at once, {v['in_flight_tokens']:,} tokens "
            "in flight): its 'GPU KV cache size' and 'Maximum concurrency' below"]


def _over_conservative(d: dict) -> str:
    v, n = d["vllm"], d["max_model_len"]
    fit = f", so {v['decode_batch_at_max_len']:,} would fit" if v["decode_batch_at_max_len"] is not None else ""
    return (f"  over-conservative: a decoding {n:,}-token sequence holds {v['decode_blocks_at_max_len']:,} blocks "
            f"(the sliding-window groups keep only their windows){fit}; vLLM's concurrency figure charges "
            f"{v['blocks_per_request']:,}")


def format_kv_report(d: dict) -> str:
    """The KV section of ``plan``'s printout."""
    lines = [f"KV cache per GPU ({d['kv_cache_dtype']} -> stored as {d['stored_as']}, block {d['block_size'] or 'default'})"]
    for c in d["caches"]:
        grow = f"{c['bytes_per_token']:10.2f} B/token" if c["bytes_per_token"] else " " * 17
        fixed = f"{c['bytes_per_seq'] / 2**20:8.2f} MiB/seq" if c["bytes_per_seq"] else ""
        lines.append(f"  {c['cache']:<36}{c['layers']:>4} layers  page {c['page_bytes']:>7} B  {grow}  {fixed}")
    pool = d.get("vllm")
    lines.append(f"  {'stored' if pool else 'total'}: {d['bytes_per_token']:,.2f} bytes per token + "
                 f"{d['bytes_per_seq'] / 2**20:,.2f} MiB per sequence" + (" (what the pages hold)" if pool else ""))
    if pool:
        lines += _pool_lines(d)
    if d["kv_budget_bytes"] is None:
        lines.append("  no GPU memory given (arch.gpu_memory_gb=0): set it to get the tokens that fit")
        return "\n".join(lines)
    reserve = d.get("runtime_reserve_bytes") or 0.0
    lines.append(
        f"  budget: {d['gpu_memory_bytes'] / GB:,.1f} GB x {d['gpu_memory_utilization']:.2f} - weights "
        f"{d['weight_bytes_per_gpu'] / GB:,.2f} GB"
        + (f" - vLLM's runtime reserve {reserve / GB:,.2f} GB (arch.runtime_reserve_gb)" if reserve else "")
        + f" = {d['kv_budget_bytes'] / GB:,.2f} GB for KV cache per GPU")
    if d["max_kv_tokens"] is None:
        lines.append("  " + nothing_fits(d))
        return "\n".join(lines)
    if pool:
        lines.append(f"  vLLM {pool['version']} at start: {pool['num_blocks']:,} blocks; GPU KV cache size "
                     f"{d['max_kv_tokens']:,} tokens; maximum concurrency {pool['max_concurrency']:,.2f}x "
                     f"at {d['max_model_len']:,} tokens per request")
    lines.append(f"  max KV tokens that fit: {d['max_kv_tokens']:,} "
                 f"(one sequence: {d['max_context_one_seq']:,} tokens of context"
                 + (f"; at max_model_len {d['max_model_len']:,}: batch {d['max_batch_at_max_len']:,})" if d["max_model_len"] else ")"))
    if pool:
        lines.append(_over_conservative(d))
    return "\n".join(lines)
