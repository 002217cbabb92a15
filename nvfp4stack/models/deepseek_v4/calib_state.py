"""The saved calibration state: routed-expert amax on CPU, in modelopt's DSV4 amax-dump key format.

Keys are ``layers.L.ffn.experts.E.wK_{weight,input}_quantizer._amax`` (0-dim float32), the format of
modelopt's examples/deepseek/deepseek_v4/ptq.py dump that its quantize_to_nvfp4.py consumes. The
state is written right after calibration (tensors copied off the calibration device) so a crash in
export never costs the calibration: ``quantize.export_only=true`` re-exports from it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from nvfp4stack.io_atomic import atomic_dir

AMAX_FILE = "amax.safetensors"
META_FILE = "meta.json"
AMAX_KEY = re.compile(
    r"^(?P<block>(?:mtp\.\d+|layers\.\d+))\.ffn\.experts\.(?P<eid>\d+)\.(?P<proj>w[123])"
    r"_(?P<which>weight|input)_quantizer\._amax$")
# modelopt's fused-experts wrapper (_QuantFusedExperts) on transformers' DeepseekV4Experts.
_HF_WEIGHT_Q = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)_weight_quantizers\.(\d+)$")
_HF_INPUT_Q = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)_input_quantizer$")
_PROJS = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}


def amax_key(block: str, expert: int, proj: str, which: str) -> str:
    return f"{block}.ffn.experts.{expert}.{proj}_{which}_quantizer._amax"


def native_amax_from_snapshot(snapshot: dict[str, torch.Tensor], n_experts: int) -> dict[str, torch.Tensor]:
    """modelopt quantizer amax of the transformers model -> native DSV4 amax keys.

    gate_up_proj's per-expert weight amax covers w1 and w3 together, so both get it (the shared
    w13 global scale). Input quantizers are one per layer and projection in modelopt's fused-experts
    wrapper, so every expert of the layer gets the layer's input amax.
    """
    out: dict[str, torch.Tensor] = {}
    for name, amax in snapshot.items():
        a = amax.detach().to("cpu", torch.float32).reshape(())
        if m := _HF_WEIGHT_Q.match(name):
            layer, proj, e = m.group(1), m.group(2), int(m.group(3))
            for w in _PROJS[proj]:
                out[amax_key(f"layers.{layer}", e, w, "weight")] = a.clone()
        elif m := _HF_INPUT_Q.match(name):
            layer, proj = m.groups()
            for e in range(n_experts):
                for w in _PROJS[proj]:
                    out[amax_key(f"layers.{layer}", e, w, "input")] = a.clone()
    return dict(sorted(out.items()))


def save_state(state_dir: str | Path, amax: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write amax + meta into a temporary sibling directory, then rename over ``state_dir``."""
    from safetensors.torch import save_file

    bad = [k for k in amax if not AMAX_KEY.match(k)]
    if bad:
        raise ValueError(f"calibration state: keys {bad[:3]} are not modelopt DSV4 amax keys "
                         "(layers.L.ffn.experts.E.wK_{weight,input}_quantizer._amax)")
    state_dir = Path(state_dir)
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(state_dir) as tmp:
        save_file({k: v.detach().cpu().float().contiguous() for k, v in sorted(amax.items())},
                  str(tmp / AMAX_FILE), metadata={"format": "pt"})
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return state_dir


def load_state(state_dir: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors.torch import load_file

    state_dir = Path(state_dir)
    for f in (AMAX_FILE, META_FILE):
        if not (state_dir / f).exists():
            raise FileNotFoundError(
                f"quantize.state_dir={state_dir}: no {f}; expected a calibration state written by "
                "quantize.method=modelopt: run it once without export_only/validate_only")
    return load_file(str(state_dir / AMAX_FILE)), json.loads((state_dir / META_FILE).read_text())


def validate_state(amax: dict[str, torch.Tensor], meta: dict, expert_groups: list[str]) -> list[str]:
    """Problems of a saved state against the checkpoint's routed-expert groups (empty = valid).

    ``expert_groups``: native ``layers.L.ffn.experts.E.wK`` prefixes that must have an input amax.
    """
    problems: list[str] = []
    for k, v in amax.items():
        if not AMAX_KEY.match(k):
            problems.append(f"{k}: not a modelopt DSV4 amax key")
        elif v.numel() != 1 or not torch.isfinite(v).all() or float(v) <= 0:
            problems.append(f"{k}: amax must be one finite value > 0, found {v.flatten()[:4].tolist()}")
    for g in expert_groups:
        if f"{g}_input_quantizer._amax" not in amax:
            problems.append(f"{g}: no input amax (calibration never reached this expert's layer)")
    if meta.get("n_amax") != len(amax):
        problems.append(f"meta.json n_amax={meta.get('n_amax')} but {AMAX_FILE} holds {len(amax)} "
                        "entries: the state is from another run; recalibrate")
    return problems
