"""A synthetic DeepseekV3-architecture checkpoint with DeepSeek-V4-Flash expert shapes, for engine
benchmarks: random weights, built where it runs (it is GBs: the GPU host builds it
itself), routed experts either NVFP4 (quantized like modelopt by ``formats.nvfp4``, w1/w3 under one
global scale, modelopt's unified-export names and config) or BF16.

``python -m nvfp4stack.models.deepseek_v3.bench_model --out DIR --experts nvfp4|bf16 [--tokenizer DIR]``
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, quantize_nvfp4


@dataclass(frozen=True)
class EngineModelSpec:
    """Flash's expert shapes (hidden 4096, 64 local experts of 2048, top-6, one shared expert);
    MLA at DeepSeek's own head sizes (the GPU attention kernels need them); a few layers."""

    hidden_size: int = 4096
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 64
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    num_hidden_layers: int = 3          # layer 0 dense, then MoE
    first_k_dense_replace: int = 1
    intermediate_size: int = 8192
    num_attention_heads: int = 32
    q_lora_rank: int = 1024
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    vocab_size: int = 1024              # the project's trained tokenizer
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 1.5
    max_position_embeddings: int = 4096


def hf_config(spec: EngineModelSpec) -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **asdict(spec),
            "num_key_value_heads": spec.num_attention_heads, "hidden_act": "silu", "norm_topk_prob": True,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "bos_token_id": 1, "eos_token_id": 2,
            "pad_token_id": 0, "attention_bias": False, "initializer_range": 0.02}


def tensor_shapes(spec: EngineModelSpec):
    """(name, shape, role) of every tensor, in DeepseekV3's HF checkpoint names."""
    h, s = spec.hidden_size, spec
    qk = s.qk_nope_head_dim + s.qk_rope_head_dim
    yield "model.embed_tokens.weight", (s.vocab_size, h), "dense"
    yield "lm_head.weight", (s.vocab_size, h), "dense"
    yield "model.norm.weight", (h,), "norm"
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", (h,), "norm"
        yield f"{p}.post_attention_layernorm.weight", (h,), "norm"
        yield f"{p}.self_attn.q_a_proj.weight", (s.q_lora_rank, h), "dense"
        yield f"{p}.self_attn.q_a_layernorm.weight", (s.q_lora_rank,), "norm"
        yield f"{p}.self_attn.q_b_proj.weight", (s.num_attention_heads * qk, s.q_lora_rank), "dense"
        yield f"{p}.self_attn.kv_a_proj_with_mqa.weight", (s.kv_lora_rank + s.qk_rope_head_dim, h), "dense"
        yield f"{p}.self_attn.kv_a_layernorm.weight", (s.kv_lora_rank,), "norm"
        yield (f"{p}.self_attn.kv_b_proj.weight",
               (s.num_attention_heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank), "dense")
        yield f"{p}.self_attn.o_proj.weight", (h, s.num_attention_heads * s.v_head_dim), "dense"
        if i < s.first_k_dense_replace:
            for proj, shape in (("gate_proj", (s.intermediate_size, h)), ("up_proj", (s.intermediate_size, h)),
                                ("down_proj", (h, s.intermediate_size))):
                yield f"{p}.mlp.{proj}.weight", shape, "dense"
            continue
        yield f"{p}.mlp.gate.weight", (s.n_routed_experts, h), "dense"
        yield f"{p}.mlp.gate.e_score_correction_bias", (s.n_routed_experts,), "bias"
        si = s.moe_intermediate_size * s.n_shared_experts
        for proj, shape in (("gate_proj", (si, h)), ("up_proj", (si, h)), ("down_proj", (h, si))):
            yield f"{p}.mlp.shared_experts.{proj}.weight", shape, "dense"
        for e in range(s.n_routed_experts):
            for proj, shape in (("gate_proj", (s.moe_intermediate_size, h)), ("up_proj", (s.moe_intermediate_size, h)),
                                ("down_proj", (h, s.moe_intermediate_size))):
                yield f"{p}.mlp.experts.{e}.{proj}.weight", shape, "expert"


EXPERTS = ("nvfp4", "bf16")   # the routed experts' formats a checkpoint is built or drawn in
DTYPE_BYTES = {"U8": 1, "F8_E4M3": 1, "BF16": 2, "F32": 4}   # the safetensors dtypes ``headers`` names


def check_experts(experts: str) -> None:
    """Refuse a routed-expert format the model is not built or drawn in."""
    if experts not in EXPERTS:
        raise ValueError(f"experts: expected nvfp4 or bf16, found {experts!r}")


def checkpoint_bytes(spec: EngineModelSpec, experts: str) -> int:
    """The tensor bytes ``build`` writes for ``spec`` (safetensors headers aside), from its ``headers``: BF16
    weights and norms, FP32 biases; NVFP4 experts as packed codes (half a byte an element), one e4m3 scale per
    16, and two FP32 scalars (``weight_scale_2``, ``input_scale``)."""
    return sum(math.prod(h["shape"]) * DTYPE_BYTES[h["dtype"]] for h in headers(spec, experts).values())


def headers(spec: EngineModelSpec, experts: str) -> dict[str, dict]:
    """name -> {'dtype', 'shape'} of every tensor ``build`` writes (safetensors dtypes): what a plan reads from a
    checkpoint's headers, known here from the spec alone."""
    out: dict[str, dict] = {}
    for name, shape, role in tensor_shapes(spec):
        if role == "expert" and experts == "nvfp4":
            n, k = shape
            base = name[: -len(".weight")]
            out |= {f"{base}.weight": {"dtype": "U8", "shape": (n, k // 2)},
                    f"{base}.weight_scale": {"dtype": "F8_E4M3", "shape": (n, k // 16)},
                    f"{base}.weight_scale_2": {"dtype": "F32", "shape": ()},
                    f"{base}.input_scale": {"dtype": "F32", "shape": ()}}
        else:
            out[name] = {"dtype": "F32" if role == "bias" else "BF16", "shape": tuple(shape)}
    return out


def spec_mismatch(hf: dict) -> list[str]:
    """What keeps ``hf`` from being a config.json ``write_model_files`` wrote ("key: expected X, found Y"); [] for
    the benchmark model's (any depth: its keys are read from ``hf``). A DeepseekV3 config of another model (other
    heads, vocabulary, routing or MTP layers) is not drawn or planned from config.json alone."""
    keys = [f.name for f in fields(EngineModelSpec)]
    missing = [f"{k}: missing" for k in keys if hf.get(k) is None]
    if missing:
        return missing
    want = {**hf_config(EngineModelSpec(**{k: hf[k] for k in keys})), "num_nextn_predict_layers": 0}
    found = {"num_nextn_predict_layers": 0, **hf}   # absent: no MTP layers
    return [f"{k}: expected {v!r}, found {found.get(k)!r}" for k, v in want.items() if found.get(k) != v]


def spec_from_config(hf: dict) -> EngineModelSpec | None:
    """The spec of a config.json ``write_model_files`` wrote (``spec_mismatch`` finds nothing), else None."""
    if spec_mismatch(hf):
        return None
    return EngineModelSpec(**{f.name: hf[f.name] for f in fields(EngineModelSpec)})


def experts_of(hf: dict, where: str = "config.json") -> str:
    """nvfp4 (a modelopt NVFP4 quantization_config, as ``build`` writes it) or bf16 (none)."""
    q = hf.get("quantization_config")
    if not q:
        return "bf16"
    if q.get("quant_method") == "modelopt" and q.get("quant_algo") == "NVFP4":
        return "nvfp4"
    raise ValueError(f"{where}: quantization_config {q.get('quant_method')!r}/{q.get('quant_algo')!r}: the synthetic "
                     "benchmark model is drawn with BF16 experts (no quantization_config) or modelopt NVFP4 ones; "
                     "fix: serve a checkpoint from files (engine.load_format unset)")


def check_free_space(out: Path, experts: str, spec: EngineModelSpec) -> None:
    """Refuse a build that cannot fit on ``out``'s file system before it writes anything (it would fill the
    disk and fail part way)."""
    need = checkpoint_bytes(spec, experts)
    need += need // 50 + (64 << 20)   # safetensors headers, config and tokenizer files: a margin
    if out.exists():   # atomic_dir keeps the old copy until the new one is in place
        need += sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and not f.is_symlink())
    probe = out.parent
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free >= need:
        return
    dense = spec.first_k_dense_replace
    per_layer = (checkpoint_bytes(replace(spec, num_hidden_layers=dense + 1), experts)
                 - checkpoint_bytes(replace(spec, num_hidden_layers=dense), experts))
    drop = " or leave bf16 out of bench.engine_settings" if experts == "bf16" else ""
    raise ValueError(
        f"the synthetic {experts} checkpoint of {spec.num_hidden_layers} layers needs {need / 1e9:.1f} GB at {out} "
        f"(a margin for headers included; {per_layer / 1e9:.2f} GB a MoE layer), and {probe} has {free / 1e9:.1f} GB "
        f"free; fix: fewer layers (bench.engine_model_layers, or --layers){drop}, or a cache_dir on a larger disk")


def _random(shape, role, gen, device) -> torch.Tensor:
    if role == "norm":
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    if role == "bias":
        return torch.zeros(shape, dtype=torch.float32, device=device)
    fan_in = shape[-1]
    return (torch.randn(shape, generator=gen, device=device) / fan_in ** 0.5).to(torch.bfloat16)


def stream(spec: EngineModelSpec, experts: str, device, seed: int = 0):
    """(name, tensor) of every tensor of the checkpoint, drawn on ``device`` in ``tensor_shapes`` order from one
    generator seeded ``seed``: what ``build`` writes, and what the synthetic load format hands vLLM. A value depends
    on every tensor drawn before it (not on (seed, name) alone, as DeepSeek-V4's stream does): every rank draws the
    whole stream. The same values for the same seed on the CPU, or on the same kind of GPU (CUDA's generator
    depends on the GPU's SM count)."""
    check_experts(experts)
    gen = torch.Generator(device=device).manual_seed(seed)
    act_scale = torch.tensor(8.0 / GLOBAL_DIVISOR, device=device)   # weight-only serving never reads it
    pending = {}
    for name, shape, role in tensor_shapes(spec):
        t = _random(shape, role, gen, device)
        if role != "expert" or experts == "bf16":
            yield name, t
            continue
        prefix, proj = name.rsplit(".", 2)[0], name.rsplit(".", 2)[1]
        if proj == "gate_proj":
            pending[prefix] = t
            continue
        if proj == "up_proj":  # w1/w3 under one global scale (vLLM fuses them), as modelopt exports
            gate = pending.pop(prefix)
            gs = torch.maximum(gate.float().abs().amax(), t.float().abs().amax()) / GLOBAL_DIVISOR
            pairs = (("gate_proj", gate), ("up_proj", t))
        else:
            gs, pairs = None, (("down_proj", t),)
        for pname, w in pairs:
            q = quantize_nvfp4(w, gs, name=f"{prefix}.{pname}")
            base = f"{prefix}.{pname}"
            yield f"{base}.weight", q.data
            yield f"{base}.weight_scale", q.scale
            yield f"{base}.weight_scale_2", q.global_scale.float().reshape(())
            yield f"{base}.input_scale", act_scale


def write_model_files(out: Path, spec: EngineModelSpec, experts: str, tokenizer: str | Path | None) -> None:
    """config.json (with modelopt's quantization config for NVFP4 experts) and the tokenizer files into ``out``."""
    cfg = hf_config(spec)
    if experts == "nvfp4":
        ignore = ["lm_head", "model.embed_tokens", "model.layers.0*"] + [
            f"model.layers.{i}.{m}" for i in range(spec.first_k_dense_replace, spec.num_hidden_layers)
            for m in ("mlp.gate", "mlp.shared_experts*", "self_attn*")]
        quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ignore}
        (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"},
                                                              "quantization": quant}, indent=1))
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ignore,
                                      "config_groups": {"group_0": {
                                          "targets": ["Linear"],
                                          "weights": {"dynamic": False, "group_size": 16, "num_bits": 4, "type": "float"},
                                          "input_activations": {"dynamic": False, "group_size": 16, "num_bits": 4,
                                                                "type": "float"}}}}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    if tokenizer:
        for f in Path(tokenizer).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
                shutil.copy2(f, out / f.name)


def build(out: str | Path, experts: str = "nvfp4", spec: EngineModelSpec = EngineModelSpec(),
          tokenizer: str | Path | None = None, device: str | None = None, seed: int = 0) -> Path:
    """Write the checkpoint into ``out`` (atomically); returns it."""
    from nvfp4stack.checkpoint.safetensors_io import save_sharded
    from nvfp4stack.io_atomic import atomic_dir

    check_experts(experts)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(out)
    check_free_space(out, experts, spec)
    with atomic_dir(out) as tmp:
        save_sharded(((n, t.cpu()) for n, t in stream(spec, experts, device, seed)), tmp, max_shard_bytes=2 << 30)
        write_model_files(tmp, spec, experts, tokenizer)
    return out


def synthetic_weights(config: dict, seed: int, device):
    """``stream`` for a config.json ``write_model_files`` wrote (engine.load_format=synthetic): the checkpoint's
    tensors drawn on ``device``, no files."""
    spec = spec_from_config(config)
    if spec is None:
        raise ValueError(f"engine.load_format=synthetic: this DeepseekV3 config.json is not the synthetic benchmark "
                         f"model's ({'; '.join(spec_mismatch(config)[:5])}), the only DeepseekV3 model drawn at load; "
                         "fix: serve it from its checkpoint files (engine.load_format unset)")
    return stream(spec, experts_of(config), device, seed)


def synthetic_checkpoint(root: Path, experts: str, num_layers: int, max_position: int, drawn: bool = False) -> Path:
    """The synthetic model with ``experts`` (nvfp4 or bf16) routed experts under ``root`` (built once); ``drawn``:
    its config.json and tokenizer only, the weights drawn at load (engine.load_format=synthetic: no disk, any
    depth)."""
    from nvfp4stack.io_atomic import atomic_dir
    from nvfp4stack.models.tokenizer import train_tokenizer

    check_experts(experts)
    spec = EngineModelSpec(num_hidden_layers=num_layers, max_position_embeddings=max_position)
    tok = root / f"tokenizer-{spec.vocab_size}"
    if not (tok / "tokenizer.json").exists():
        train_tokenizer(tok, spec.vocab_size)
    d = root / (f"{experts}-L{spec.num_hidden_layers}-h{spec.hidden_size}-e{spec.n_routed_experts}x"
                f"{spec.moe_intermediate_size}" + (f"-p{max_position}-drawn" if drawn else ""))
    if not (d / "config.json").exists():
        if drawn:
            with atomic_dir(d) as tmp:
                write_model_files(tmp, spec, experts, tok)
        else:
            print(f"[bench engine] building the synthetic {experts} checkpoint -> {d}", flush=True)
            build(d, experts, spec, tokenizer=tok)
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--experts", default="nvfp4", choices=EXPERTS)
    ap.add_argument("--tokenizer", help="a dir with tokenizer.json (e.g. a tiny model's)")
    ap.add_argument("--layers", type=int, default=3)
    args = ap.parse_args(argv)
    build(args.out, args.experts, EngineModelSpec(num_hidden_layers=args.layers), args.tokenizer)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
