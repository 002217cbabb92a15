"""Layer test: each module's output under its planned precision vs BF16, on captured real inputs.

Weights are the plan's (``eval.weights.PlannedWeights``): a BF16 source quantized like modelopt's
DSV4 export, a quantized source (the release) converted from its own bytes.

Linears and routers: the module itself with its weight swapped for the emulated one (NVFP4 W4A4
also fake-quantizes the input with a static scale calibrated on the same inputs). Routed experts,
two rows:

- ``routed_experts``: each expert projection (w1, w3, w2) as a module, like the linears: its GEMM on
  the expert's captured tokens (w2 on the reference SwiGLU output), W4A4 inputs fake-quantized with
  the expert's static scales;
- ``routed_experts.mlp``: each expert's whole SwiGLU MLP through the MoE kernel backend's own forward
  (torch_emulation on CPU, triton_w4a16 on a GPU when ``backend.moe`` says so; w1/w3 share a
  global scale), against transformers' ``DeepseekV4Experts.forward``; also per MoE layer.
"""
from __future__ import annotations

import copy
from collections import defaultdict

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nvfp4stack.arch import KNOWN_ARCHS, detect
from nvfp4stack.eval.emulate import fake_quant_act
from nvfp4stack.eval.metrics import compare
from nvfp4stack.eval.precision import EvalPrecision
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, fake_quantize_nvfp4_activation
from nvfp4stack.kernels.base import MOE_BACKENDS, MoeWeights, RunnableMoeBackend, load_backends
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import dequantize_expert
from nvfp4stack.models.deepseek_v4.capture import Captures, expert_act_amax, experts_modules, weight_modules
from nvfp4stack.models.deepseek_v4.layouts import native_expert_name
from nvfp4stack.schemes import Scheme

_W = ("w1", "w2", "w3")


def _run_weight_module(mod, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The module's own forward with ``weight`` in place (routers: their logits F.linear)."""
    if not isinstance(mod, torch.nn.Linear):
        return F.linear(x.reshape(-1, weight.shape[1]), weight)
    orig = mod.weight.data
    mod.weight.data = weight
    try:
        return mod(x)
    finally:
        mod.weight.data = orig


@torch.no_grad()
def linear_metrics(model, caps: Captures, prec: EvalPrecision) -> dict[str, dict]:
    """group -> {role, scheme, cosine, sqnr_db, max_rel_err} for every linear / router with inputs."""
    out = {}
    mods = [m for m in weight_modules(model) if caps.linear.get(m[0])]
    for group, _, mod in tqdm(mods, desc="layertest linears", leave=False):
        xs = caps.linear[group]
        scheme = prec.scheme_for(group)
        wq = prec.weights.emulate(mod.weight.detach(), scheme, group)
        amax = max(float(x.abs().amax()) for x in xs)
        refs, outs = [], []
        for x in xs:
            refs.append(_run_weight_module(mod, mod.weight.data, x).flatten())
            xq = fake_quant_act(x, amax, group + ".input") if scheme is Scheme.NVFP4 else x
            outs.append(_run_weight_module(mod, wq, xq).flatten())
        out[group] = {"role": prec.roles.get(group, "unknown"), "scheme": scheme.value,
                      **compare(torch.cat(refs), torch.cat(outs), group)}
    return out


def _moe_backend(moe_backend: str, scheme: Scheme) -> tuple[type[RunnableMoeBackend], torch.device]:
    """The MoE backend to run ``scheme`` experts with on this host, and its device: ``backend.moe`` where
    nvfp4stack runs it and this host supports it, else torch_emulation; on CPU where the backend runs there."""
    load_backends()
    arch = detect()
    backend = MOE_BACKENDS.get(moe_backend) if moe_backend in MOE_BACKENDS else None
    if backend is None or not issubclass(backend, RunnableMoeBackend) or not backend.is_supported(arch, scheme)[0]:
        backend = MOE_BACKENDS.get("torch_emulation")
    on_cpu = backend.is_supported(KNOWN_ARCHS["cpu"], scheme)[0]
    return backend, torch.device("cpu" if on_cpu else "cuda")


def _act_scales(mod, hidden, idx) -> dict[str, torch.Tensor]:
    """W4A4 static per-expert input scales (= calibrated amax / 2688) of w13 and w2."""
    a13, a2 = expert_act_amax(mod, hidden, idx)
    return {"a13_scale": torch.where(a13 > 0, a13, torch.ones_like(a13)) / GLOBAL_DIVISOR,
            "a2_scale": torch.where(a2 > 0, a2, torch.ones_like(a2)) / GLOBAL_DIVISOR}


def _nvfp4_experts_fn(mod, prec: EvalPrecision, scheme: Scheme, scales: dict, moe_backend: str):
    """(kernel name, forward(x, ids, weights), per-expert (w13, w2) getter) through the NVFP4 MoE backend."""
    w13, w2 = prec.weights.experts_nvfp4(mod._eval_prefix, mod.num_experts, mod.gate_up_proj, mod.down_proj,
                                         proj=("w1", "w3", "w2"))

    def expert_weights(e: int) -> tuple[torch.Tensor, torch.Tensor]:
        return dequantize_expert(w13, e), dequantize_expert(w2, e)

    backend, dev = _moe_backend(moe_backend, scheme)
    if dev.type == "cpu":
        prepared = backend.prepare(MoeWeights(w13, w2, scales.get("a13_scale"), scales.get("a2_scale")))

        def fn(x, ids, wts):
            return backend.apply(prepared, x, wts, ids, swiglu_limit=mod.limit)
    else:  # a weight-only GPU kernel: no activation scales, bf16 activations in, fp32 metrics out
        w13_d, w2_d = (type(t)(t.data.to(dev), t.scale.to(dev), t.global_scale.to(dev), t.shape) for t in (w13, w2))
        prepared = backend.prepare(MoeWeights(w13_d, w2_d))

        def fn(x, ids, wts):
            return backend.apply(prepared, x.to(dev), wts.to(dev), ids.to(dev), swiglu_limit=mod.limit).float().cpu()
    return backend.name, fn, expert_weights


def _emulated_experts_fn(mod, layer: str, prec: EvalPrecision):
    """forward and per-expert (w13, w2) getter of a copy of the experts module with each expert's
    weights emulated per its scheme."""
    q = copy.deepcopy(mod)
    emulate = prec.weights.emulate
    for e in range(mod.num_experts):
        s1, s2, s3 = (prec.scheme_for(native_expert_name(layer, e, w)) for w in _W)
        w1, w3 = mod.gate_up_proj[e].detach().chunk(2, dim=0)
        q.gate_up_proj.data[e] = torch.cat([emulate(w1, s1, native_expert_name(layer, e, "w1")),
                                            emulate(w3, s3, native_expert_name(layer, e, "w3"))])
        q.down_proj.data[e] = emulate(mod.down_proj[e].detach(), s2, native_expert_name(layer, e, "w2"))
    return q.forward, lambda e: (q.gate_up_proj[e].detach().float(), q.down_proj[e].detach().float())


def _projection_metrics(mod, e: int, x: torch.Tensor, weights, scales: dict, prefix: str) -> dict[str, dict]:
    """w1 / w3 / w2 of expert ``e`` as modules: the emulated GEMM against the reference one."""
    q13, q2 = weights(e)
    w13, w2 = mod.gate_up_proj[e].detach().float(), mod.down_proj[e].detach().float()
    gu = x @ w13.T
    h = mod._apply_gate(gu)
    xq, hq = x, h
    if scales:  # W4A4: static per-expert input scales, dynamic block scales
        xq = fake_quantize_nvfp4_activation(x, scales["a13_scale"][e], name=f"{prefix}.{e}.w1.input")
        hq = fake_quantize_nvfp4_activation(h, scales["a2_scale"][e], name=f"{prefix}.{e}.w2.input")
    gu_q, inter = xq @ q13.T, w13.shape[0] // 2
    return {"w1": compare(gu[:, :inter], gu_q[:, :inter], f"{prefix}.{e}.w1"),
            "w3": compare(gu[:, inter:], gu_q[:, inter:], f"{prefix}.{e}.w3"),
            "w2": compare(h @ w2.T, hq @ q2.T, f"{prefix}.{e}.w2")}


@torch.no_grad()
def experts_metrics(model, caps: Captures, prec: EvalPrecision, moe_backend: str,
                    layers: tuple[str, ...] | None = None) -> dict[str, dict]:
    """layer -> {scheme, kernel, layer: metrics, per_expert: {e: MLP metrics + tokens + gemm: {w1, w3,
    w2: metrics}}} (``layers``: a subset)."""
    out = {}
    for layer, hf_name, mod in experts_modules(model):
        if layer not in caps.experts or (layers is not None and layer not in layers):
            continue
        hidden, idx, wts = caps.experts_cat(layer)
        schemes = {prec.scheme_for(native_expert_name(layer, e, w)) for e in range(mod.num_experts) for w in _W}
        scheme = schemes.pop() if len(schemes) == 1 else None
        mod._eval_prefix = prefix = f"layers.{layer}.ffn.experts"
        scales = _act_scales(mod, hidden, idx) if scheme is Scheme.NVFP4 else {}
        if scheme is not None and scheme.is_nvfp4:
            kernel, q_fn, weights = _nvfp4_experts_fn(mod, prec, scheme, scales, moe_backend)
        else:
            kernel, (q_fn, weights) = "emulated_weights", _emulated_experts_fn(mod, layer, prec)
        entry = {"scheme": scheme.value if scheme else "mixed", "kernel": kernel,
                 "layer": compare(mod.forward(hidden, idx, wts), q_fn(hidden, idx, wts), hf_name), "per_expert": {}}
        for e in range(mod.num_experts):
            tok = (idx == e).any(-1)
            n = int(tok.sum())
            if n == 0:
                continue
            x = hidden[tok]
            ids, ones = torch.full((n, 1), e, dtype=idx.dtype), torch.ones((n, 1), dtype=wts.dtype)
            entry["per_expert"][str(e)] = {"tokens": n, **compare(mod.forward(x, ids, ones), q_fn(x, ids, ones),
                                                                  f"{prefix}.{e}"),
                                           "gemm": _projection_metrics(mod, e, x.float(), weights, scales, prefix)}
        out[layer] = entry
    return out


def role_summary(linears: dict[str, dict], experts: dict[str, dict]) -> dict[str, dict]:
    """role -> scheme, modules, cosine min/mean, SQNR min/mean, max_rel_err max (routed experts: per
    expert projection, and per expert MLP as ``routed_experts.mlp``)."""
    rows: dict[str, list[dict]] = defaultdict(list)
    for m in linears.values():
        rows[m["role"]].append(m)
    for entry in experts.values():
        for m in entry["per_expert"].values():
            rows["routed_experts"] += [{**g, "scheme": entry["scheme"]} for g in m["gemm"].values()]
            rows["routed_experts.mlp"].append({**m, "scheme": entry["scheme"]})
    out = {}
    for role, ms in sorted(rows.items()):
        schemes = sorted({m["scheme"] for m in ms})
        out[role] = {
            "scheme": schemes[0] if len(schemes) == 1 else "mixed", "modules": len(ms),
            "cosine_min": min(m["cosine"] for m in ms), "cosine_mean": sum(m["cosine"] for m in ms) / len(ms),
            "sqnr_db_min": min(m["sqnr_db"] for m in ms), "sqnr_db_mean": sum(m["sqnr_db"] for m in ms) / len(ms),
            "max_rel_err_max": max(m["max_rel_err"] for m in ms),
        }
    return out


def layertest(model, caps: Captures, prec: EvalPrecision, moe_backend: str) -> dict:
    """Every module's fidelity on captured inputs; ``roles`` aggregates them."""
    linears = linear_metrics(model, caps, prec)
    experts = experts_metrics(model, caps, prec, moe_backend)
    return {"roles": role_summary(linears, experts), "modules": linears, "experts": experts}
