"""The engine's view of the plan: role -> (scheme, kernel), serialised into the quantization config.

This dict travels as ``quantization_config["nvfp4stack"]`` inside vLLM's ``--hf-overrides``, so
the engine config itself carries it to the API server, the engine core and every worker (the
old monkey-patches never reached the workers). No vLLM import here: args.py and tests use it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nvfp4stack.kernels.linear  # noqa: F401  (registers the linear backends; light imports)
import nvfp4stack.kernels.moe  # noqa: F401  (registers the MoE backends; light imports)
from nvfp4stack.arch import resolve
from nvfp4stack.kernels.base import LINEAR_BACKENDS, MOE_BACKENDS
from nvfp4stack.kernels.select import select_backend
from nvfp4stack.plan.planner import check_moe_fp8_prefill
from nvfp4stack.plan.roles import role_of
from nvfp4stack.schemes import Scheme

SECTION_KEY = "nvfp4stack"
QUANT_METHOD = "nvfp4stack"  # the name registered with vLLM's register_quantization_config
VERSION = 1
MOE_ROLES = ("routed_experts",)
# The MTP draft's experts: vLLM gives the draft its own --speculative-config moe_backend.
MTP_EXPERTS = "mtp:routed_experts"


@dataclass
class EnginePlan:
    """Per module role: the scheme the kernel computes and the kernel backend name."""

    # role -> {"scheme": str, "kernel": str[, "fp8_prefill": bool]}
    roles: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for role, entry in self.roles.items():
            where = f"{SECTION_KEY}.roles.{role}"
            if not {"scheme", "kernel"} <= set(entry) <= {"scheme", "kernel", "fp8_prefill"}:
                raise ValueError(f"{where}: expected keys scheme, kernel (and fp8_prefill for routed experts), "
                                 f"found {sorted(entry)}; regenerate the engine args from the recipe")
            Scheme.parse(entry["scheme"], where=f"{where}.scheme")

    def entry_for(self, prefix: str) -> dict | None:
        """The plan entry of a vLLM module prefix (e.g. ``model.layers.1.mlp.experts``), or None."""
        role = role_of(prefix)
        return None if role is None else self.roles.get(role)

    def own_kernel(self, prefix: str, kind: str) -> str | None:
        """The nvfp4stack-implemented kernel the plan puts on this module, or None (vLLM's own)."""
        entry = self.entry_for(prefix)
        if entry is None or not Scheme(entry["scheme"]).is_nvfp4:
            return None
        reg = MOE_BACKENDS if kind == "moe" else LINEAR_BACKENDS
        name = entry["kernel"]
        if name in reg and reg.get(name).provider == "nvfp4stack":
            return name
        return None

    def needs_plugin(self) -> bool:
        """True when any NVFP4 role runs on a kernel this package implements."""
        for role, e in self.roles.items():
            if not Scheme(e["scheme"]).is_nvfp4:
                continue
            reg = MOE_BACKENDS if role in (*MOE_ROLES, MTP_EXPERTS) else LINEAR_BACKENDS
            if e["kernel"] in reg and reg.get(e["kernel"]).provider == "nvfp4stack":
                return True
        return False

    def to_dict(self) -> dict:
        return {"version": VERSION, "roles": self.roles}

    @classmethod
    def from_dict(cls, d: dict) -> "EnginePlan":
        if d.get("version") != VERSION:
            raise ValueError(f"{SECTION_KEY}.version: expected {VERSION}, found {d.get('version')!r}; "
                             "regenerate the engine args with this nvfp4stack version")
        return cls(roles=dict(d.get("roles", {})))


def engine_plan_from_plan(plan) -> EnginePlan:
    """Collapse a planner ``Plan`` (per tensor group) to role -> (served scheme, kernel).

    Raises when two groups of one role disagree: vLLM picks methods per module class and prefix,
    and this table is per role.
    """
    roles: dict[str, dict] = {}
    for g in plan.groups:
        if g.mtp:
            continue  # MTP modules are planned on their own; vLLM builds them from the same roles
        entry = {"scheme": g.served.value, "kernel": g.kernel}
        old = roles.setdefault(g.role, entry)
        if old != entry:
            raise ValueError(f"plan: role {g.role!r} has two decisions ({old} and {entry}, e.g. at "
                             f"{g.name}); the engine applies one per role: make the precision rules agree")
    return EnginePlan(roles)


def engine_plan_from_config(cfg) -> EnginePlan:
    """Role table straight from the recipe (precision per role + backend per kind), no checkpoint scan.

    Backends are resolved (``auto`` included) and validated by the planner's ``select_backend``
    for ``cfg.arch``; NVFP4 on a weight-only kernel is recorded as served W4A16.
    Only NVFP4 roles are listed: the others (bf16, fp8_block, passthrough) keep whatever method
    vLLM gives the checkpoint, and their kernels are vLLM's own choice.
    """
    arch = resolve(cfg.arch.name)
    roles = {}
    for role, scheme in cfg.precision.role_schemes().items():
        if not Scheme.parse(scheme, f"precision.{role}").is_nvfp4:
            continue
        kind = "moe" if role in MOE_ROLES else "linear"
        sel = select_backend(kind, getattr(cfg.backend, kind), arch, Scheme.parse(scheme, f"precision.{role}"))
        roles[role] = {"scheme": sel.served_scheme.value, "kernel": sel.backend}
        if kind == "moe" and cfg.backend.moe_fp8_prefill:
            check_moe_fp8_prefill(sel.backend, arch)
            roles[role]["fp8_prefill"] = True
    mtp = mtp_expert_scheme(cfg)
    if cfg.engine.speculative.method == "mtp" and mtp not in (Scheme.BF16, Scheme.PASSTHROUGH):
        sel = select_backend("moe", cfg.backend.mtp_moe, arch, mtp, key="backend.mtp_moe")
        roles[MTP_EXPERTS] = {"scheme": sel.served_scheme.value, "kernel": sel.backend}
    return EnginePlan(roles)


def mtp_expert_scheme(cfg) -> Scheme:
    """What the MTP draft's routed experts are stored as when served (MTP untouched = as released)."""
    setting = cfg.precision.mtp
    if setting == "inherit":
        return Scheme.parse(cfg.precision.routed_experts, "precision.routed_experts")
    if setting != "passthrough":
        return Scheme.parse(setting, "precision.mtp")
    return {"official": Scheme.MXFP4, "modelopt": Scheme.NVFP4}.get(cfg.model.source_format, Scheme.BF16)


def quantization_config_with_plan(checkpoint: Path, plan: EnginePlan) -> dict:
    """The checkpoint's own quantization_config plus the plan section: the --hf-overrides payload."""
    cfg_path = Path(checkpoint) / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path}: missing; model.path must be a HF checkpoint dir")
    qcfg = json.loads(cfg_path.read_text()).get("quantization_config")
    if qcfg is None:
        raise ValueError(f"{cfg_path}: no quantization_config; the plan puts NVFP4 on "
                         f"{sorted(plan.roles)} but the checkpoint is unquantized: run quantize first")
    return {**qcfg, SECTION_KEY: plan.to_dict()}
