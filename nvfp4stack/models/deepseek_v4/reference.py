"""Reference forward for DeepSeek-V4: transformers' own implementation, plus a precision-swap hook.

``load_reference`` loads a layout-(a) directory (BF16, DeepSeek-native names; transformers renames
them through its conversion mapping) into ``DeepseekV4ForCausalLM``. ``apply_emulated_precision``
then replaces each linear / routed-expert weight by the dequantized value of its planned scheme
(NVFP4, FP8 block, MXFP4 via nvfp4stack.formats), optionally fake-quantizing NVFP4 W4A4 inputs.

What runs on the CPU: all of it. transformers 5.19's V4 is eager-only on every device (no SDPA /
flash / flex: head_dim 512 and the learned attention sinks rule them out), and its compressor,
indexer, hash router, mHC Sinkhorn and experts are plain torch. What does *not* run on the CPU is
modelopt's own fake-quant forward of the calibrated model (``amax must be a CUDA tensor for dynamic
block quantization``), which is why emulation goes through nvfp4stack.formats instead.
"""
from __future__ import annotations

import types
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from nvfp4stack.eval.emulate import emulate_weight, fake_quant_act
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR
from nvfp4stack.models.deepseek_v4.layouts import hf_to_native, native_expert_name
from nvfp4stack.schemes import Scheme


def load_reference(model_dir: str | Path, dtype: torch.dtype = torch.float32):
    """transformers' ``DeepseekV4ForCausalLM`` from a layout-(a) directory, in eval mode."""
    from transformers import DeepseekV4ForCausalLM

    model, info = DeepseekV4ForCausalLM.from_pretrained(model_dir, dtype=dtype, output_loading_info=True)
    missing = info.get("missing_keys") or []
    if missing:
        raise ValueError(f"load_reference({model_dir}): transformers found no checkpoint tensor for "
                         f"{sorted(missing)[:5]} ({len(missing)} in all); expected a BF16 DeepSeek-native "
                         "checkpoint (layout a): check its names with nvfp4stack.models.deepseek_v4.layouts")
    # transformers keeps norms / mHC / sinks in fp32 (_keep_in_fp32_modules_strict); in bf16 the fp32
    # norm output then meets bf16 linear weights and F.linear fails on dtype. Cast everything.
    return model.to(dtype).eval()


def _experts_forward_emulated(self, hidden_states, top_k_index, top_k_weights):
    """transformers' DeepseekV4Experts.forward with NVFP4 input fake-quant per expert GEMM."""
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in hit:
        e = int(expert_idx[0])
        if e == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(mask[e])
        x = hidden_states[token_idx]
        if self._nvfp4_act[e][0]:
            x = fake_quant_act(x, self._nvfp4_act[e][1], f"{self._native_prefix}.{e}.w1.input")
        cur = self._apply_gate(F.linear(x, self.gate_up_proj[e]))
        if self._nvfp4_act[e][2]:
            cur = fake_quant_act(cur, self._nvfp4_act[e][3], f"{self._native_prefix}.{e}.w2.input")
        cur = F.linear(cur, self.down_proj[e]) * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, cur.to(final.dtype))
    return final


@torch.no_grad()
def apply_emulated_precision(model, scheme_for: Callable[[str], Scheme], *, act_fake_quant: bool = False,
                             input_amax: dict[str, float] | None = None,
                             weight_fn: Callable[..., torch.Tensor] = emulate_weight) -> dict[str, Scheme]:
    """Swap every linear / router / routed-expert weight for its emulated ``scheme_for(native_group)``.

    Args:
        scheme_for: native group name (``layers.1.attn.wq_a``, ``layers.1.ffn.experts.3.w1``, ``head``)
            -> Scheme. Routed experts' w1/w3 share one NVFP4 global scale (their max), like modelopt's
            DSV4 export and vLLM's fused w13.
        act_fake_quant: also fake-quantize the inputs of NVFP4 (W4A4) weights; NVFP4_W4A16 never does.
        input_amax: native group -> calibrated activation amax; missing groups use the dynamic amax.
        weight_fn: ``(w, scheme, name, global_scale=None) -> emulated w``; the default quantizes the
            model's own (BF16) weight, ``eval.weights.PlannedWeights.emulate`` starts from the source
            checkpoint's bytes.
    Returns:
        native group -> scheme applied.
    """
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
        DeepseekV4Experts,
        DeepseekV4HashRouter,
        DeepseekV4TopKRouter,
    )

    input_amax = input_amax or {}
    applied: dict[str, Scheme] = {}
    for hf_name, mod in list(model.named_modules()):
        if isinstance(mod, (torch.nn.Linear, DeepseekV4TopKRouter, DeepseekV4HashRouter)):
            group = hf_to_native(hf_name + ".weight")[: -len(".weight")]
            scheme = scheme_for(group)
            mod.weight.copy_(weight_fn(mod.weight, scheme, group))
            applied[group] = scheme
            if act_fake_quant and scheme is Scheme.NVFP4 and isinstance(mod, torch.nn.Linear):
                amax = input_amax.get(group)
                mod.register_forward_pre_hook(
                    lambda m, args, g=group, a=amax: (fake_quant_act(args[0], a, g + ".input"),) + args[1:])
        elif isinstance(mod, DeepseekV4Experts):
            layer = hf_name.split(".")[2]  # model.layers.L.mlp.experts
            flags = []
            for e in range(mod.num_experts):
                g1, g2, g3 = (native_expert_name(layer, e, w) for w in ("w1", "w2", "w3"))
                s1, s2, s3 = scheme_for(g1), scheme_for(g2), scheme_for(g3)
                w1, w3 = mod.gate_up_proj[e].chunk(2, dim=0)  # [2I, H] -> gate rows, up rows
                gs13 = None
                if s1.is_nvfp4 and s3.is_nvfp4:  # shared global scale for the fused w13 GEMM
                    gs13 = torch.maximum(w1.abs().amax(), w3.abs().amax()).float() / GLOBAL_DIVISOR
                mod.gate_up_proj[e].copy_(torch.cat(
                    [weight_fn(w1, s1, g1, gs13), weight_fn(w3, s3, g3, gs13)], dim=0))
                mod.down_proj[e].copy_(weight_fn(mod.down_proj[e], s2, g2))
                applied.update({g1: s1, g2: s2, g3: s3})
                flags.append((act_fake_quant and s1 is Scheme.NVFP4, input_amax.get(g1),
                              act_fake_quant and s2 is Scheme.NVFP4, input_amax.get(g2)))
            if any(f[0] or f[2] for f in flags):
                mod._nvfp4_act = flags
                mod._native_prefix = f"layers.{layer}.ffn.experts"
                mod.forward = types.MethodType(_experts_forward_emulated, mod)
    return applied


def served_reference(bf16_dir: str | Path, served_dir: str | Path):
    """transformers' DeepSeek-V4 (fp32) carrying the weights ``served_dir`` stores."""
    from nvfp4stack.eval.served_reference import stored_schemes
    from nvfp4stack.eval.weights import PlannedWeights

    model = load_reference(bf16_dir)
    sources = stored_schemes(served_dir)
    if not sources:
        raise ValueError(f"{served_dir}: no weight matrices found; expected the served DeepSeek-V4 checkpoint")
    weights = PlannedWeights(sources, served_dir)
    applied = apply_emulated_precision(model, lambda g: sources.get(g, Scheme.BF16), weight_fn=weights.emulate)
    missing = sorted(g for g, s in applied.items() if g not in sources)
    if missing:
        raise ValueError(f"{served_dir}: the served checkpoint has no tensor for {missing[:5]} ({len(missing)} "
                         f"in all) that the BF16 model {bf16_dir} has; expected both layouts of one model "
                         "(native DeepSeek names, the same layer count)")
    return model
