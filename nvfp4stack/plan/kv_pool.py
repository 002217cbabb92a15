"""vLLM 0.26's packed KV-cache pool for a hybrid-attention family: blocks, "GPU KV cache size" and "Maximum concurrency".

vLLM 0.26 (``v1/core/kv_cache_utils.py``) sizes a hybrid cache (the family's ``kv_pool_layers``) like this:

- ``group_and_unify_kv_cache_specs``: full-attention layers (compressed KV, top-k selection keys) form one
  group; sliding-window layers (SWA, compression states) are grouped by (block_size, window).
- ``_get_kv_cache_groups_uniform_groups``: each group counts its "layer tuples" (the commonest
  page size's layer count); ``_approximate_gcd`` picks one tuple count ``d`` (>= the full group's)
  and every sliding group is split into ``cdiv(n, d)`` groups, its pages padded up to the nearest
  full-group page size.
- ``_get_kv_cache_config_packed``: one block id owns, per page size, as many slots as the most
  any group has; ``num_blocks = available // bytes_per_block``, the same on every TP rank (the
  cache has one latent head, so each rank holds all of it).
- ``get_max_concurrency_for_kv_cache_config``: a request is charged, in every group at once, its
  most pages at max_model_len (full: ``cdiv(L, block)``; sliding: ``cdiv(min(window - 1 +
  in_flight, L), block) + 1``, with in_flight = concurrent batches x max_num_batched_tokens), in
  bytes over the full group's page bytes; "GPU KV cache size" = int(concurrency x max_model_len).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

# vLLM 0.26 engine/arg_utils.py get_batch_defaults: GPUs of >= 70 GiB (H100, H200, B200) serving
# the OpenAI API; async scheduling (on by default, MTP included) keeps 2 batches in flight.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
ASYNC_CONCURRENT_BATCHES = 2


@dataclass(frozen=True)
class KVLayerSpec:
    """One cache layer as vLLM's allocator sees its KVCacheSpec."""

    page_bytes: int              # page_size_bytes (alignment padding included)
    block_size: int              # tokens per page
    window: int | None = None    # sliding_window; None: full attention, every token kept


@dataclass(frozen=True)
class PackedPool:
    """The KV cache groups and the bytes one block id owns across them."""

    groups: tuple[tuple[int, int | None, tuple[int, ...]], ...]   # (block_size, window, page bytes per layer)
    bytes_per_block: int

    @property
    def full_page_bytes(self) -> int:
        return sum(self.groups[0][2])


@dataclass(frozen=True)
class PoolCapacity:
    """What vLLM 0.26 logs at start for ``available`` bytes (per GPU)."""

    num_blocks: int
    blocks_per_request: int      # charged to one max_model_len request (the concurrency divisor)
    max_concurrency: float       # "Maximum concurrency for L tokens per request"
    tokens: int                  # "GPU KV cache size: N tokens"
    one_request_bytes: int       # what its start-up check needs for one max_model_len request


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    # kv_cache_utils._approximate_gcd: least total round-up padding, ties to the larger d
    best_d, best_pad = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best_d):
            best_d, best_pad = d, pad
    return best_d


def _tuples(pages: list[int]) -> int:
    return Counter(pages).most_common(1)[0][1]


def packed_pool(layers: list[KVLayerSpec]) -> PackedPool | None:
    """vLLM 0.26's groups and per-block bytes for a hybrid family's layer list (model order), or None
    where vLLM would not take the packed path (no full-attention layer, one page size, or a
    sliding page larger than every full-attention page, which vLLM asserts against)."""
    full = [s.page_bytes for s in layers if s.window is None]
    sliding: dict[tuple[int, int], list[int]] = {}
    for s in layers:
        if s.window is not None:
            sliding.setdefault((s.block_size, s.window), []).append(s.page_bytes)
    if not full or not sliding or len({s.page_bytes for s in layers}) <= 1:
        return None
    full_block = next(s.block_size for s in layers if s.window is None)
    sizes = sorted(set(full))
    counts = [_tuples(full)] + [_tuples(p) for p in sliding.values()]
    d = _approximate_gcd(counts, lower_bound=counts[0])
    groups: list[tuple[int, int | None, tuple[int, ...]]] = [(full_block, None, tuple(full))]
    for (block, window), pages in sliding.items():
        if max(pages) > sizes[-1]:
            return None
        per_size = Counter(min(x for x in sizes if x >= p) for p in pages)   # padded up to a full page size
        if len(set(per_size.values())) != 1:
            return None
        n = next(iter(per_size.values()))
        split = _cdiv(n, d)
        for i in range(split):
            k = len(range(i, n, split))   # layer_tuples[i::split]
            groups.append((block, window, tuple(ps for ps in per_size for _ in range(k))))
    slots: dict[int, int] = {}
    for _, _, pages in groups:
        for ps, k in Counter(pages).items():
            slots[ps] = max(slots.get(ps, 0), k)
    return PackedPool(tuple(groups), sum(ps * k for ps, k in slots.items()))


def in_flight_tokens(max_model_len: int, max_num_seqs: int | None = None) -> int:
    """``VllmConfig.max_in_flight_tokens`` under vLLM 0.26's defaults on an H100/H200/B200 API server."""
    batched = DEFAULT_MAX_NUM_BATCHED_TOKENS
    if max_num_seqs:
        batched = min(max_num_seqs * max_model_len, batched)
    return ASYNC_CONCURRENT_BATCHES * batched


def _pages_per_request(block: int, window: int | None, max_model_len: int, in_flight: int) -> int:
    if window is None:
        return _cdiv(max_model_len, block)
    return _cdiv(min(window - 1 + in_flight, max_model_len), block) + 1


def pool_capacity(pool: PackedPool, available_bytes: int, max_model_len: int, in_flight: int) -> PoolCapacity:
    """vLLM 0.26's ``num_blocks``, concurrency and "GPU KV cache size" tokens for ``available_bytes``."""
    pages = [(_pages_per_request(b, w, max_model_len, in_flight), p) for b, w, p in pool.groups]
    charged = sum(n * sum(p) for n, p in pages)
    blocks_per_request = _cdiv(charged, pool.full_page_bytes)
    num_blocks = max(int(available_bytes) // pool.bytes_per_block, 0)
    concurrency = num_blocks / blocks_per_request
    # _max_memory_usage_bytes_from_groups: every group reserves the common tuple count x tuple bytes
    tuple_bytes = sum(set(pool.groups[0][2]))
    n_tuples = max(_tuples(list(p)) for _, _, p in pool.groups)
    one = sum(n_tuples * n * tuple_bytes for n, _ in pages)
    return PoolCapacity(num_blocks, blocks_per_request, concurrency, int(concurrency * max_model_len), one)


def decode_blocks(pool: PackedPool, context: int) -> int:
    """Blocks one decoding sequence of ``context`` tokens really holds: the full group's pages plus
    each sliding group's window pages (out-of-window blocks are freed as decoding goes on)."""
    return sum(_pages_per_request(b, w, context, 1) for b, w, _ in pool.groups)
