"""DeepSeek-V4 weights with no checkpoint: the release's layout at any size, drawn where they are used.

``release_stream(config, seed, device)`` yields (native name, tensor) for every tensor the release
stores (MTP included), in the release's formats: FP8 E4M3 + UE8M0 128x128 for the attention /
shared-expert / MTP projections, MXFP4 (I8 codes, F8_E8M0 scales per 32) for the routed experts, BF16
compressor / gate / embeddings, F32 mHC, sinks and biases, I64 tid2eid. Values follow the tiny
model's recipe (``tiny.py``: heavy-tailed matrices with outlier input channels, norms near 1), each
tensor from its own generator seeded by (seed, tensor name), on ``device``: the same stream on every
rank, whatever it keeps of it, and under any MoE backend. vLLM's own ``load_weights`` takes it as it
would take the files, so its TP/EP split, name mapping and, for our kernels, the load-time NVFP4
cast apply unchanged. A CUDA generator draws other values than the CPU one (each is the same on
every device of its kind).
"""
from __future__ import annotations

from typing import Iterator

import torch

from nvfp4stack.models.deepseek_v4.spec import dsv4_tensor_groups
from nvfp4stack.models.deepseek_v4.tiny import _matrix, non_matrix_tensor, release_tensors


def release_stream(config: dict, seed: int, device: str | torch.device,
                   mtp_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Every release tensor of ``config`` (a DeepSeek-V4 config.json), drawn on ``device``; ``mtp_only``: the MTP
    block's alone (what vLLM's draft model loads: it skips the rest), each with the values of the whole stream."""
    for tg in dsv4_tensor_groups(config):
        if mtp_only and not tg.mtp:
            continue
        if not tg.is_matrix:
            yield non_matrix_tensor(tg, config, seed, device)
            continue
        w = _matrix(tg, seed, device)
        if tg.role not in ("routed_experts",):
            w = w.to(torch.bfloat16)   # FP8 roles quantize from the BF16 value, like the tiny release
        yield from release_tensors(tg.name + ".weight", w, tg.role).items()
