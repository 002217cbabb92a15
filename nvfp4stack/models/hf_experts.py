"""transformers' fused routed experts (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj``
[E, H, I]: DeepseekV3, Qwen3-MoE) carrying a modelopt NVFP4 export of them: the reference forward
that ``eval`` and the serve tests hold a served model against, shared by the families built on them.

The expert weights are the export's packed NVFP4 dequantized with ``formats.nvfp4``; with ``w4a4``
each expert GEMM input is NVFP4 fake-quantized with the export's calibrated ``input_scale``
(modelopt's W4A4 semantics), W4A16 keeps the activations. Everything else is transformers'.
"""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.schemes import Scheme

ROLE = "routed_experts"
W4A4 = {Scheme.NVFP4: True, Scheme.NVFP4_W4A16: False}  # served scheme -> fake-quantized activations
_PROJ = ("gate_proj", "up_proj", "down_proj")


def expert_tensors(nvfp4_dir: Path) -> dict:
    """Every routed-expert tensor (``*.mlp.experts.*``) of the export's safetensors shards."""
    from safetensors import safe_open

    files = sorted(Path(nvfp4_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{nvfp4_dir}: no *.safetensors; expected the modelopt NVFP4 export serve runs")
    tensors = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            tensors.update({k: sf.get_tensor(k) for k in sf.keys() if ".mlp.experts." in k})
    return tensors


def with_nvfp4_experts(model, nvfp4_dir: str | Path, *, w4a4: bool):
    """``model`` (a transformers CausalLM, changed in place and returned) with every MoE layer's
    experts replaced by the NVFP4 experts stored in ``nvfp4_dir``."""
    import torch

    from nvfp4stack.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4_activation

    tensors = expert_tensors(Path(nvfp4_dir))
    # W4A16 needs the weights alone; W4A4 also the calibrated activation scales (a data-free convert has none)
    needed = [f"{proj}.weight_scale" for proj in _PROJ] + (["gate_proj.input_scale", "down_proj.input_scale"] if w4a4 else [])

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
        dtype = experts.gate_up_proj.dtype
        in_scales = []
        with torch.no_grad():
            for e in range(experts.num_experts):
                p = f"model.layers.{li}.mlp.experts.{e}"
                missing = [n for n in needed if f"{p}.{n}" not in tensors]
                if missing:
                    fix = ("calibrate with quantize (W4A4 needs input scales; a data-free convert has none)"
                           if missing[0].endswith("input_scale") else "re-run quantize without per-layer BF16 rules")
                    raise KeyError(f"{nvfp4_dir}: {p}.{missing[0]} missing; expected a modelopt NVFP4 export of every "
                                   f"routed expert; {fix}")
                experts.gate_up_proj[e] = torch.cat([deq(f"{p}.gate_proj"), deq(f"{p}.up_proj")]).to(dtype)
                experts.down_proj[e] = deq(f"{p}.down_proj").to(dtype)
                if w4a4:
                    in_scales.append((tensors[f"{p}.gate_proj.input_scale"], tensors[f"{p}.down_proj.input_scale"]))
        if w4a4:
            experts.forward = _w4a4_experts_forward(experts, in_scales, fake_quant)
    return model


def _w4a4_experts_forward(experts, in_scales, fake_quant):
    """transformers' fused experts' forward loop with NVFP4 activation fake-quant before each GEMM."""
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


def routed_scheme(plan, model_name: str, num_layers: int, moe_layers: range) -> Scheme:
    """The one scheme the plan gives every MoE layer's routed experts, where only they are quantized
    (what serve exports with modelopt); mixed plans are refused, naming ``model_name``."""
    from nvfp4stack.engine.plan_section import layers_with_scheme

    found = {s: [i for i in layers_with_scheme(plan, ROLE, s, num_layers) if i in moe_layers]
             for s in (Scheme.BF16, *W4A4)}
    used = [s for s, layers in found.items() if layers]
    if len(used) != 1 or len(found[used[0]]) != len(moe_layers):
        raise ValueError(f"eval.level=e2e on {model_name}: precision.routed_experts must give every MoE layer "
                         f"({list(moe_layers)}) one of bf16, nvfp4, nvfp4_w4a16; found "
                         f"{ {s.value: v for s, v in found.items() if v} }; drop the per-layer precision.rules")
    others = {r: e["scheme"] for r, e in plan.roles.items()
              if r != ROLE and e is not None and e["scheme"] not in (Scheme.BF16.value, Scheme.PASSTHROUGH.value)}
    if others:
        raise ValueError(f"eval.level=e2e on {model_name}: only the routed experts are quantized on this model (what "
                         f"serve exports with modelopt); found {others}; set those precision keys to bf16")
    return used[0]
