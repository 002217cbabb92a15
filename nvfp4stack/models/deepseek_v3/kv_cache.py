"""DeepseekV3 MLA KV cache per GPU, from vLLM's own cache spec.

vLLM 0.32 (site-packages) ``model_executor/layers/attention/mla_attention.py``: every MLA layer caches
one latent per token, ``head_size = kv_lora_rank + qk_rope_head_dim`` elements (the compressed KV and
the shared RoPE key; no separate V: ``MLAAttentionSpec.head_size_v = 0``), one KV head with
``max_tp_shards=1``, so every TP rank holds the whole cache. The element is the model dtype for
``--kv-cache-dtype auto``, 1 byte for fp8 (per-tensor scaled). The MTP draft
(``engine.speculative.method=mtp``) caches its own MLA layers the same way.

Block size: ``--block-size`` when given, else vLLM's default 16, which is also what the CPU_MLA
backend forces (platforms/cpu.py). GPU MLA backends may pick another (FlashMLA 64, CUTLASS MLA 128):
that changes the page size, not the bytes per token.
"""
from __future__ import annotations

from nvfp4stack.plan.kv_cache import DEFAULT_BLOCK, CacheLine, kv_bytes_per_element
from nvfp4stack.plan.kv_cache import model_dtype as auto_dtype


def mla_latent_elements(hf: dict) -> int:
    """Elements cached per token per layer: ``kv_lora_rank + qk_rope_head_dim``."""
    return int(hf["kv_lora_rank"]) + int(hf["qk_rope_head_dim"])


def mla_cache_lines(hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int,
                    model_dtype: str | None = None) -> tuple[str, list[CacheLine]]:
    """``(stored dtype, [CacheLine])`` per GPU: one paged latent row per token per MLA layer."""
    stored, elem = kv_bytes_per_element(kv_dtype, model_dtype or auto_dtype("auto", hf))
    layers = int(hf["num_hidden_layers"]) + mtp_layers
    latent = mla_latent_elements(hf)
    per_layer = latent * elem
    block = block_size or DEFAULT_BLOCK
    return stored, [CacheLine(f"mla latent (kv_lora+rope {latent})", layers, block * per_layer,
                              block, bytes_per_token=float(layers * per_layer))]
