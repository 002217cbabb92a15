"""Give an expert's gate and up projections one global scale, as fused gate_up kernels need.

The projection names come from the model families (``ModelFamily.gate_up_pairs``): the converter
gets the expert's sub-modules and takes the one registered pair among them.

The shared scale is max(gs1, gs3) (and max of the input scales). From BF16 both are quantized
once with it. From NVFP4, the tensor that already has the max keeps its bytes; the other has
the ratio folded into its block scales, and only blocks whose new E4M3 scale does not
reproduce the old one exactly get their codes re-rounded (from their exact dequantized values).
"""
from __future__ import annotations

import torch

from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import input_scale_of, nvfp4_from_group, nvfp4_to_group
from nvfp4stack.families.registry import gate_up_pairs
from nvfp4stack.formats.e2m1 import e2m1_decode, e2m1_encode, pack_e2m1, unpack_e2m1
from nvfp4stack.formats.nvfp4 import BLOCK, E4M3_MAX, SCALE_MIN, Nvfp4Tensor, nvfp4_global_scale, quantize_nvfp4
from nvfp4stack.schemes import Scheme


def gate_up_parts(tensors: dict, name: str, pairs: tuple[tuple[str, str], ...] | None = None) -> tuple[str, str]:
    """The (gate, up) sub-module names among ``tensors``' keys ('w1.weight', 'gate_proj.weight_scale', ...);
    ``pairs``: the candidate (gate, up) names (default: every registered family's ``gate_up_pairs``)."""
    if pairs is None:
        pairs = gate_up_pairs()
    heads = {k.split(".", 1)[0] for k in tensors}
    found = [pair for pair in pairs if heads & set(pair)]
    if len(found) != 1 or not set(found[0]) <= heads:
        want = " or ".join(f"{name}.{g} and {name}.{u}" for g, u in pairs)
        raise KeyError(f"{name}: w13_shared_global_scale needs both projections of one (gate, up) pair ({want}); "
                       f"found {sorted(heads)}. Route the down projection and other modules to another converter, "
                       "or declare the model's pair in its family's gate_up_pairs")
    return found[0]


def refold_global_scale(q: Nvfp4Tensor, new_gs: torch.Tensor) -> tuple[Nvfp4Tensor, int]:
    """Re-express ``q`` under global scale ``new_gs`` (>= its own); returns (tensor, blocks re-rounded).

    ``q`` 2-D with a 0-dim ``new_gs``, or stacked [E, N, K] with per-expert [E] scales (the load-time
    cast, engine/moe_cast_method.py): each expert gets exactly the bytes of its own 2-D call."""
    per_expert = q.global_scale.ndim == 1
    gs_old = q.global_scale.reshape(-1, 1, 1) if per_expert else q.global_scale
    gs_new = new_gs.reshape(-1, 1, 1) if per_expert else new_gs
    old = q.scale.float() * gs_old                                      # [..., N, K/16] fp32
    scale = (old / gs_new).clamp(SCALE_MIN, E4M3_MAX).to(torch.float8_e4m3fn)
    same = scale.float() * gs_new == old
    n = int((~same).sum())
    data = q.data
    if n:
        codes = unpack_e2m1(q.data)
        vals = e2m1_decode(codes).reshape(*codes.shape[:-1], -1, BLOCK) * old.unsqueeze(-1)
        requant = e2m1_encode(vals / (scale.float() * gs_new).unsqueeze(-1))
        cb = codes.reshape(requant.shape)
        data = pack_e2m1(torch.where(same.unsqueeze(-1), cb, requant).reshape(codes.shape))
    return Nvfp4Tensor(data, scale, new_gs.reshape(-1) if per_expert else new_gs.reshape(()), q.shape), n


def _max_input_scale(groups: dict) -> torch.Tensor | None:
    scales = [input_scale_of(g) for g in groups.values()]
    if all(s is None for s in scales):
        return None
    if any(s is None for s in scales):
        raise KeyError("gate/up input_scale: present on one of the pair only; calibrate both or neither")
    return torch.maximum(*scales)


@CONVERTERS.register("w13_shared_global_scale")
class W13SharedGlobalScale(Converter):
    source, target = Scheme.NVFP4, Scheme.NVFP4
    spans_modules = True  # gets the expert's sub-modules: keys 'w1.weight', 'w3.weight_scale', ...

    def convert(self, tensors: dict, name: str) -> dict:
        parts = gate_up_parts(tensors, name)
        groups = {p: {k[len(p) + 1:]: v for k, v in tensors.items() if k.startswith(p + ".")} for p in parts}
        missing = [p for p in parts if "weight" not in groups[p]]
        if missing:
            raise KeyError(f"{name}: w13_shared_global_scale needs {name}.{parts[0]}.weight and "
                           f"{name}.{parts[1]}.weight; missing {missing}")
        out = {k: v for k, v in tensors.items() if not k.startswith(tuple(f"{p}." for p in parts))}
        input_scale = _max_input_scale(groups)
        gate = groups[parts[0]]["weight"]
        if gate.is_floating_point() and gate.dtype.itemsize > 1:
            ws = {p: groups[p]["weight"] for p in parts}
            gs = torch.maximum(*(nvfp4_global_scale(w, f"{name}.{p}.weight") for p, w in ws.items()))
            qs = {p: quantize_nvfp4(w, gs, name=f"{name}.{p}.weight") for p, w in ws.items()}
            self.report = {"requantized_blocks": 0}
        else:
            src = {p: nvfp4_from_group(groups[p], f"{name}.{p}") for p in parts}
            gs = torch.maximum(*(q.global_scale for q in src.values()))
            qs, n = {}, 0
            for p, q in src.items():
                if torch.equal(q.global_scale, gs):
                    qs[p] = q  # already at the shared scale: bytes untouched
                else:
                    qs[p], n = refold_global_scale(q, gs)
            self.report = {"requantized_blocks": n}
        for p in parts:
            out.update({f"{p}.{k}": v for k, v in nvfp4_to_group(qs[p], input_scale).items()})
        return out
