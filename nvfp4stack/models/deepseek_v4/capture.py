"""Real activations from the BF16 reference forward: module inputs captured with hooks.

Every linear, router and routed-experts module of transformers' DeepSeek-V4 gets a forward
pre-hook that keeps its inputs, so the layer test feeds each module what it sees in the model,
not random noise. The same captures give the static activation amax (W4A4 input scales).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from nvfp4stack.models.deepseek_v4.layouts import hf_to_native, native_expert_name


def _router_types():
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter, DeepseekV4TopKRouter

    return (DeepseekV4TopKRouter, DeepseekV4HashRouter)


def weight_modules(model):
    """(native group, hf module name, module) for every linear and router of the model."""
    routers = _router_types()
    for hf_name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, *routers)):
            yield hf_to_native(hf_name + ".weight")[: -len(".weight")], hf_name, mod


def experts_modules(model):
    """(layer index str, hf name, DeepseekV4Experts) for every routed-experts module."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    for hf_name, mod in model.named_modules():
        if isinstance(mod, DeepseekV4Experts):
            yield hf_name.split(".")[2], hf_name, mod  # model.layers.L.mlp.experts


@dataclass
class Captures:
    """Inputs seen by each module over the evaluated prompts."""

    linear: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))
    experts: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(
        default_factory=lambda: defaultdict(list))

    def experts_cat(self, layer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden [T, H], top_k_index [T, k], top_k_weights [T, k]) over all prompts."""
        parts = self.experts[layer]
        return tuple(torch.cat([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


@torch.no_grad()
def capture(model, batches: list[torch.Tensor], desc: str = "reference forward") -> Captures:
    """Run ``model`` on ``batches`` with hooks; returns every module's inputs."""
    caps = Captures()
    handles = []
    for group, _, mod in weight_modules(model):
        handles.append(mod.register_forward_pre_hook(
            lambda m, args, g=group: caps.linear[g].append(args[0].detach().clone())))
    for layer, _, mod in experts_modules(model):
        handles.append(mod.register_forward_pre_hook(
            lambda m, args, L=layer: caps.experts[L].append(tuple(a.detach().clone() for a in args[:3]))))
    try:
        for ids in tqdm(batches, desc=desc, leave=False):
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return caps


@torch.no_grad()
def expert_act_amax(mod, hidden: torch.Tensor, top_k_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert amax [E] of the w13 input and of the w2 input (the SwiGLU output), as calibrated
    on these tokens (modelopt calibrates each expert's input quantizers on the tokens routed to it)."""
    e_n = mod.num_experts
    a13, a2 = torch.zeros(e_n), torch.zeros(e_n)
    for e in range(e_n):
        tok = (top_k_index == e).any(-1)
        if not tok.any():
            continue
        x = hidden[tok].float()
        a13[e] = x.abs().amax()
        a2[e] = mod._apply_gate(x @ mod.gate_up_proj[e].float().T).abs().amax()
    return a13, a2


@torch.no_grad()
def activation_amax(model, caps: Captures) -> dict[str, float]:
    """native group -> static input amax: linears over all tokens, routed experts per expert."""
    out = {g: max(float(x.abs().amax()) for x in xs) for g, xs in caps.linear.items() if xs}
    for layer, _, mod in experts_modules(model):
        if layer not in caps.experts:
            continue
        hidden, idx, _ = caps.experts_cat(layer)
        a13, a2 = expert_act_amax(mod, hidden, idx)
        for e in range(mod.num_experts):
            if a13[e] > 0:
                out[native_expert_name(layer, e, "w1")] = out[native_expert_name(layer, e, "w3")] = float(a13[e])
                out[native_expert_name(layer, e, "w2")] = float(a2[e])
    return out
