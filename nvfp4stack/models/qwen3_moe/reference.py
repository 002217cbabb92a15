"""Reference forwards of the tiny Qwen3-MoE: transformers' ``Qwen3MoeForCausalLM`` in fp32, with the
routed experts of an NVFP4 export, and the ``eval`` fidelity table of what ``serve`` serves.

Only the routed experts are quantized on this family (modelopt ``NVFP4_EXPERTS_ONLY_CFG``), so the
reference is the BF16 build in fp32 and the compared model is the same forward carrying the served
export's experts, dequantized with ``formats.nvfp4``: W4A4 fake-quantizes each expert GEMM input
with the export's calibrated ``input_scale``, W4A16 keeps the activations.
"""
from __future__ import annotations

import copy
from pathlib import Path

from nvfp4stack.schemes import Scheme

ROLE = "routed_experts"
W4A4 = {Scheme.NVFP4: True, Scheme.NVFP4_W4A16: False}
_PROJ = ("gate_proj", "up_proj", "down_proj")


def _expert_tensors(nvfp4_dir: Path) -> dict:
    from safetensors import safe_open

    files = sorted(Path(nvfp4_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{nvfp4_dir}: no *.safetensors; expected the modelopt NVFP4 export serve runs")
    tensors = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            tensors.update({k: sf.get_tensor(k) for k in sf.keys() if ".mlp.experts." in k})
    return tensors


def reference_model(bf16_dir: str | Path, nvfp4_dir: str | Path, *, w4a4: bool, dtype=None):
    """transformers' Qwen3-MoE forward of ``bf16_dir`` with the routed experts stored in ``nvfp4_dir``."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    from nvfp4stack.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4_activation

    dtype = dtype or torch.float32
    model = Qwen3MoeForCausalLM.from_pretrained(bf16_dir, dtype=dtype).eval()
    tensors = _expert_tensors(Path(nvfp4_dir))

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
                missing = [s for s in _PROJ if f"{p}.{s}.weight_scale" not in tensors]
                if missing:
                    raise KeyError(f"{nvfp4_dir}: {p}.{missing[0]}.weight_scale missing; expected a modelopt NVFP4 "
                                   "export of every routed expert (re-run quantize without per-layer BF16 rules)")
                experts.gate_up_proj[e] = torch.cat([deq(f"{p}.gate_proj"), deq(f"{p}.up_proj")]).to(dtype)
                experts.down_proj[e] = deq(f"{p}.down_proj").to(dtype)
                in_scales.append((tensors[f"{p}.gate_proj.input_scale"], tensors[f"{p}.down_proj.input_scale"]))
        if w4a4:
            experts.forward = _w4a4_experts_forward(experts, in_scales, fake_quant)
    return model


def _w4a4_experts_forward(experts, in_scales, fake_quant):
    """transformers' Qwen3MoeExperts.forward loop with NVFP4 activation fake-quant before each GEMM."""
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


def prompt_batches(tokenizer, num_prompts: int, max_tokens: int, seed: int) -> list:
    """``num_prompts`` bundled corpus texts (seeded order), each cut to ``max_tokens`` tokens: ``[1, T]`` ids."""
    from nvfp4stack.models.corpus import calibration_texts

    if max_tokens < 2:
        raise ValueError(f"eval.max_tokens={max_tokens}: expected >= 2 (next-token metrics need two tokens); "
                         "set eval.max_tokens=64")
    out = [ids for ids in (tokenizer(t, return_tensors="pt").input_ids[:, :max_tokens]
                           for t in calibration_texts(num_prompts, seed)) if ids.shape[1] >= 2]
    if not out:
        raise ValueError(f"eval: no prompt of >= 2 tokens among {num_prompts} texts; raise eval.num_prompts")
    return out


def routed_scheme(plan, num_layers: int) -> Scheme:
    """The one scheme the plan gives every layer's routed experts (mixed plans are refused)."""
    from nvfp4stack.engine.plan_section import layers_with_scheme

    found = {s: layers_with_scheme(plan, ROLE, s, num_layers) for s in (Scheme.BF16, *W4A4)}
    used = [s for s, layers in found.items() if layers]
    if len(used) != 1 or len(found[used[0]]) != num_layers:
        raise ValueError(f"eval.level=e2e on qwen3_moe: precision.routed_experts must give every MoE layer "
                         f"(0..{num_layers - 1}) one of bf16, nvfp4, nvfp4_w4a16; found "
                         f"{ {s.value: v for s, v in found.items() if v} }; drop the per-layer precision.rules")
    others = {r: e["scheme"] for r, e in plan.roles.items()
              if r != ROLE and e is not None and e["scheme"] not in (Scheme.BF16.value, Scheme.PASSTHROUGH.value)}
    if others:
        raise ValueError(f"eval.level=e2e on qwen3_moe: only the routed experts are quantized on this family (what "
                         f"serve exports with modelopt); found {others}; set those precision keys to bf16")
    return used[0]


def fidelity_e2e(cfg, seed: int) -> dict:
    """The ``eval`` metrics of the recipe's tiny Qwen3-MoE: its served export against its BF16 build."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeForCausalLM

    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.eval.e2e import compare_models
    from nvfp4stack.models.qwen3_moe.pipeline import bf16_source, serve_checkpoint

    if cfg.model.path:
        raise ValueError(f"eval.level=e2e for model.family=qwen3_moe: expected the tiny factory model (no "
                         f"model.path), found model.path={cfg.model.path!r}; use recipe=tiny_qwen3_moe")
    plan = engine_plan_for(cfg)
    bf16 = bf16_source(cfg)
    layers = int(Qwen3MoeForCausalLM.config_class.from_pretrained(bf16).num_hidden_layers)
    scheme = routed_scheme(plan, layers)
    served = Path(serve_checkpoint(cfg, plan))        # the export serve runs (the BF16 build for bf16 experts)
    ref = Qwen3MoeForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    quant = copy.deepcopy(ref) if scheme is Scheme.BF16 else reference_model(bf16, served, w4a4=W4A4[scheme])
    batches = prompt_batches(AutoTokenizer.from_pretrained(bf16), cfg.eval.num_prompts, cfg.eval.max_tokens, seed)
    return {"precision": {ROLE: scheme.value}, "checkpoint": str(served), "e2e": compare_models(ref, quant, batches)}
