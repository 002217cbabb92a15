"""DeepSeek-V4's sparse-attention indexer: its DeepGEMM metadata kernel compiled at start for every decode batch.

The indexer's decode steps call vLLM 0.26's ``get_paged_mqa_logits_metadata(context_lens, block_size, num_sms)``,
and DeepGEMM specializes that kernel (``smxx_paged_mqa_logits_metadata``) on the batch rounded up to 32 and on the
SM count, so each new such batch compiled a kernel while serving (3-4 in one client run at Flash's size, two
H200s, bench/RESULTS.md, 2026-11-27). ``register()`` adds these calls to the plugin's DeepGEMM warm-up
(``nvfp4stack.engine.deepgemm_warmup.add_child_work``), whose child processes compile them with the GEMMs, into
DeepGEMM's cache, where the server's own call finds them.
"""
from __future__ import annotations

from typing import Callable

BATCH_CAP = 1024   # vLLM's largest default max_num_seqs: a decode batch past it is not warmed
ENTRY = "nvfp4stack.models.deepseek_v4.indexer_warmup:run"


def batches(model, max_tokens: int, is_indexer: Callable | None = None, num_sms: Callable | None = None) -> list[dict]:
    """One item per batch size a decode step rounds to (multiples of 32, up to ``max_tokens``, at most
    ``BATCH_CAP``), with this GPU's SM count (the indexer's own ``num_compute_units``); none without an indexer."""
    if is_indexer is None:
        try:
            from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
        except Exception:   # a vLLM without the layer has nothing to warm
            return []

        def is_indexer(m):
            return isinstance(m, SparseAttnIndexer)
    if not any(is_indexer(m) for m in model.modules()):
        return []
    if num_sms is None:
        import torch
        from vllm.utils.platform_utils import num_compute_units

        sms = int(num_compute_units(torch.cuda.current_device()))
    else:
        sms = int(num_sms())
    top = -(-min(max_tokens, BATCH_CAP) // 32) * 32
    return [{"batch": b, "num_sms": sms} for b in range(32, top + 1, 32)]


def run(items: list[dict], device: str = "cuda", metadata: Callable | None = None) -> None:
    """In a warm-up child: vLLM's metadata call at each item's batch ((batch, 1) context lengths, next_n 1; the KV
    block size only has to divide DeepGEMM's split of 256 and is not in the kernel's key)."""
    import torch

    if metadata is None:
        from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata as metadata
    for item in items:
        metadata(torch.ones((item["batch"], 1), dtype=torch.int32, device=device), 64, item["num_sms"])


def register() -> None:
    from nvfp4stack.engine.deepgemm_warmup import add_child_work

    add_child_work(ENTRY, batches)
