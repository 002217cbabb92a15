"""Precision rules + arch + backends -> a plan: per tensor group, source -> target, converter, kernel."""
from __future__ import annotations

import functools
import math
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from nvfp4stack.arch import Arch
from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.families.family import ModelFamily
from nvfp4stack.families.roles import SupportsRoles
from nvfp4stack.kernels.base import backends_with
from nvfp4stack.kernels.select import BackendError, Selection, select_backend
from nvfp4stack.plan.memory import Layout, group_bytes, shard_factor
from nvfp4stack.plan.roles import ROLES
from nvfp4stack.plan.rules import PrecisionRule, first_match, unmatched_target
from nvfp4stack.schemes import Scheme
from nvfp4stack.usage import ConfigWarning


class PlanError(ValueError):
    """The requested precision/backend/arch combination breaks a rule; the message says which and the fix."""


@dataclass
class GroupPlan:
    """The decision for one tensor group."""

    name: str
    role: str
    mtp: bool
    source: Scheme
    target: Scheme
    served: Scheme          # what the kernel computes (NVFP4 checkpoints run W4A16 on Hopper)
    converter: str | None
    kernel: str
    params: int
    bytes: int
    gpu_bytes: float        # bytes on one GPU under the layout
    dtype: str = "bf16"     # logical dtype, shown for groups kept as stored (norms, mHC, ...)


@dataclass
class PlanRow:
    """Groups aggregated by (role, mtp, decision), for printing and plan.json."""

    role: str
    mtp: bool
    source: str
    target: str
    served: str
    converter: str
    kernel: str
    count: int = 0
    params: int = 0
    bytes: int = 0
    gpu_bytes: float = 0.0


@dataclass
class Plan:
    model: str
    family: str
    arch: str
    source_format: str
    layout: Layout
    groups: list[GroupPlan]
    selections: dict[str, dict] = field(default_factory=dict)   # "moe:nvfp4" -> selection
    backend_checks: dict[str, dict] = field(default_factory=dict)  # requested backend validity
    warnings: list[str] = field(default_factory=list)
    kv_cache: dict | None = None   # nvfp4stack.plan.kv_cache report, when the model has one
    # decoder layers of the main model; vLLM numbers the MTP layers after them (model.layers.N...)
    num_hidden_layers: int | None = None

    @property
    def rows(self) -> list[PlanRow]:
        agg: dict[tuple, PlanRow] = {}
        for g in self.groups:
            src = g.dtype if g.source is Scheme.PASSTHROUGH else g.source.value
            dst = g.dtype if g.target is Scheme.PASSTHROUGH else g.target.value
            served = g.dtype if g.served is Scheme.PASSTHROUGH else g.served.value
            key = (g.role, g.mtp, src, dst, served, g.converter or "-", g.kernel)
            row = agg.setdefault(key, PlanRow(*key))
            row.count += 1
            row.params += g.params
            row.bytes += g.bytes
            row.gpu_bytes += g.gpu_bytes
        return sorted(agg.values(), key=lambda r: (r.mtp, -r.bytes))

    @property
    def total_params(self) -> int:
        return sum(g.params for g in self.groups)

    @property
    def total_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def gpu_bytes(self) -> float:
        return sum(g.gpu_bytes for g in self.groups)

    def by_name(self) -> dict[str, GroupPlan]:
        return {g.name: g for g in self.groups}

    def to_json(self) -> dict:
        by_role: dict[str, int] = defaultdict(int)
        for g in self.groups:
            by_role["mtp" if g.mtp else g.role] += g.bytes
        return {
            "model": self.model, "family": self.family, "arch": self.arch,
            "source_format": self.source_format, "layout": asdict(self.layout),
            "total_params": self.total_params, "total_bytes": self.total_bytes,
            "bytes_by_role": dict(by_role), "gpu_bytes": self.gpu_bytes,
            "selections": self.selections, "backend_checks": self.backend_checks,
            "warnings": self.warnings, "kv_cache": self.kv_cache,
            "rows": [asdict(r) for r in self.rows],
        }


def requested_scheme(group: TensorGroup, rules: list[PrecisionRule], role_schemes: dict[str, str],
                     mtp_scheme: str) -> Scheme:
    """What the recipe asks for this group: rules first (first match wins), then the MTP setting,
    then the role's field; PASSTHROUGH means "keep the stored format"."""
    rule = first_match(rules, group.name, group.role, group.mtp)
    if rule is not None:
        return Scheme(rule.scheme)
    if group.mtp and mtp_scheme != "inherit":
        return Scheme(mtp_scheme)
    if not group.is_matrix:
        return Scheme.PASSTHROUGH
    return Scheme(role_schemes.get(group.role, "passthrough"))




def converter_for(source: Scheme, target: Scheme, where: str) -> str | None:
    """The registered converter from ``source``'s storage to ``target``'s (None when the stored
    tensors stay: same storage, e.g. nvfp4 served W4A4 or W4A16, or a pass-through source)."""
    if source.storage == target.storage or source is Scheme.PASSTHROUGH:
        return None
    import nvfp4stack.convert  # noqa: F401  (registers every converter)
    from nvfp4stack.convert.base import CONVERTERS

    names = tuple(CONVERTERS.names())
    name = _converter_between(source.storage, target.storage, names)
    if name is not None:
        return name
    raise PlanError(
        f"{where}: no converter from {source.value} to {target.value}; available: "
        + ", ".join(f"{CONVERTERS.get(n).source.value}->{CONVERTERS.get(n).target.value}"
                    for n in names if hasattr(CONVERTERS.get(n), "source"))
        + ". Fix: choose a target reachable from the source format, or passthrough"
    )


@functools.cache
def _converter_between(source_storage, target_storage, names: tuple[str, ...]) -> str | None:
    """The first of the registered converters ``names`` reading ``source_storage`` and writing
    ``target_storage``. A plan asks once per group (35,000 times for a 290B-parameter MoE): the walk
    is cached, keyed by the registry's names so a converter registered later is seen."""
    from nvfp4stack.convert.base import CONVERTERS

    for name in names:
        conv = CONVERTERS.get(name)
        reads, writes = getattr(conv, "source", None), getattr(conv, "target", None)
        if reads is not None and writes is not None and (reads.storage, writes.storage) == (source_storage,
                                                                                             target_storage):
            return name
    return None


def check_hard_rules(group: TensorGroup, source: Scheme, target: Scheme, family: ModelFamily) -> None:
    """The rules learned the hard way, as errors rather than comments: the generic ones here, then
    the model family's (``ModelFamily.unquantized_roles`` and ``check_hard_rules``)."""
    where = f"{group.name} (role {group.role})"
    if group.role == "routed_experts" and source.is_nvfp4 and target is Scheme.MXFP4:
        raise PlanError(
            f"{where}: routed experts stored as NVFP4 are never turned into MXFP4 (UE4M3/16 -> UE8M0/32 "
            "loses 3 mantissa bits per scale; it garbled the MegaMoE output). Fix: precision.routed_experts=nvfp4"
        )
    if group.role in family.unquantized_roles and group.is_matrix and target is not Scheme.BF16:
        raise PlanError(
            f"{where}: vLLM builds the {group.role} weights with quant_config=None, so they must be bf16, "
            f"found {target.value}. Fix: precision.{group.role}=bf16 (or passthrough from a bf16 source)"
        )
    family.check_hard_rules(group, source, target)


def is_gate_or_up(name: str, family: SupportsRoles) -> bool:
    """True when ``name`` ends in a gate or up projection of one of ``family``'s
    ``ModelFamily.gate_up_pairs`` ('layers.3.ffn.experts.5.w1' under w1/w3)."""
    return name.endswith(tuple(f".{p}" for pair in family.gate_up_pairs for p in pair))


def fp8_prefill_kernels() -> list[str]:
    """The MoE backends whose capabilities include the FP8 prefill mode (``backend.moe_fp8_prefill``)."""
    return backends_with("moe", lambda caps: caps.fp8_prefill)


def check_moe_fp8_prefill(kernel: str, arch: Arch) -> None:
    """``backend.moe_fp8_prefill=true`` needs a MoE kernel with the FP8 prefill mode, on sm90 or later."""
    able = fp8_prefill_kernels()
    if kernel not in able:
        raise PlanError(f"backend.moe_fp8_prefill=true: the FP8 prefill mode belongs to the {' / '.join(able)} "
                        f"MoE kernel, but the routed experts run on {kernel!r}. "
                        f"Fix: {' or '.join(f'backend.moe={n}' for n in able)}, or backend.moe_fp8_prefill=false")
    if not arch.at_least(9, 0):
        raise PlanError(f"backend.moe_fp8_prefill=true on {arch.name}: its grouped FP8 GEMM "
                        "(torch._scaled_grouped_mm) needs sm90 or later. Fix: backend.moe_fp8_prefill=false")


def fp8_prefill_bytes(group: TensorGroup) -> int:
    """The FP8 copy of one routed-expert group: 1 byte per weight + one fp32 scale per output row."""
    *lead, rows, _ = group.shape
    return group.numel + 4 * rows * (math.prod(lead) if lead else 1)


def stored_scheme(group: TensorGroup, source: Scheme, requested: Scheme, family: ModelFamily) -> Scheme:
    """The stored half of :func:`decide`: the requested scheme (the source's for PASSTHROUGH), hard
    rules enforced. Kernel choice never changes it."""
    stored = source if requested is Scheme.PASSTHROUGH else requested
    check_hard_rules(group, source, stored, family)
    return stored


def stored_schemes(groups: Iterable[tuple[TensorGroup, Scheme]], precision,
                   family: ModelFamily) -> list[tuple[TensorGroup, Scheme, Scheme]]:
    """(group, source, stored) for every group, as :func:`build_plan` decides them but choosing no
    kernel: what stays decided where a kernel is refused (``eval`` emulates it all the same)."""
    rules, role_schemes = list(precision.rules), precision.role_schemes()
    return [(g, source, stored_scheme(g, source, requested_scheme(g, rules, role_schemes, precision.mtp), family))
            for g, source in groups]


@dataclass(frozen=True)
class Decision:
    """What one tensor group becomes: stored in the checkpoint, computed by the kernel, and how."""

    stored: Scheme           # the converted checkpoint's format (the plan's target)
    served: Scheme           # what the kernel computes (NVFP4 runs W4A16 on Hopper)
    kernel: str              # backend name; 'unquantized' for BF16 matrices, '-' without a GEMM
    converter: str | None    # registered converter source -> stored, None when bytes are kept
    fp8_copy: bool = False   # routed experts carry the FP8 prefill copy (backend.moe_fp8_prefill)


def decide(group: TensorGroup, source: Scheme, requested: Scheme, *, family: ModelFamily, arch: Arch, backend,
           selections: dict[tuple[str, Scheme], Selection] | None = None) -> Decision:
    """The one decision: (source format, requested scheme, arch, backend) -> stored scheme,
    served scheme, kernel and converter, hard rules enforced. The planner calls it for every
    group; the converter (plan.converter), the engine plan (plan.served / plan.kernel) and the
    doctor read what it returned. ``selections`` caches one backend choice per (kind, scheme).
    Raises PlanError / BackendError naming the group or key, what was expected and the fix."""
    selections = {} if selections is None else selections
    stored = stored_scheme(group, source, requested, family)
    if not group.is_matrix:
        return Decision(stored, stored, "-", None)
    converter = converter_for(source, stored, group.name)
    if converter == "bf16_to_nvfp4" and group.role == "routed_experts" and is_gate_or_up(group.name, family):
        # Fused gate_up kernels read one global scale for gate and up (vLLM keeps gate's and
        # warns otherwise): quantize the pair together under max(gs_gate, gs_up).
        converter = "w13_shared_global_scale"
    if stored is Scheme.BF16:
        return Decision(stored, stored, "unquantized", converter)
    kind = "moe" if group.role == "routed_experts" else "linear"
    # The MTP draft has its own MoE backend in vLLM (speculative_config.moe_backend):
    # an untouched MXFP4 MTP block next to NVFP4 experts needs a second kernel.
    cfg_key = "mtp_moe" if kind == "moe" and group.mtp else kind
    key = (cfg_key, stored)
    if key not in selections:
        selections[key] = select_backend(kind, getattr(backend, cfg_key), arch, stored, key=f"backend.{cfg_key}")
        if cfg_key == "moe" and backend.moe_fp8_prefill:
            check_moe_fp8_prefill(selections[key].backend, arch)
    sel = selections[key]
    # the routed experts' FP8 prefill copy, built at load next to the NVFP4 bytes decode reads
    return Decision(stored, sel.served_scheme, sel.backend, converter, cfg_key == "moe" and backend.moe_fp8_prefill)


def build_plan(groups: Iterable[tuple[TensorGroup, Scheme]], *, model: str, family: ModelFamily, arch: Arch,
               source_format: str, precision, backend, layout: Layout, fp8_ue8m0: bool = True,
               num_hidden_layers: int | None = None, draft_loaded: bool = True) -> Plan:
    """Resolve every group through :func:`decide`. Raises PlanError / BackendError with the fix on a
    broken combination. ``draft_loaded``: whether the engine loads the MTP draft (speculative decoding
    with it on); without it vLLM's main model drops the MTP tensors, so they take no GPU bytes."""
    rules = list(precision.rules)
    role_schemes = precision.role_schemes()
    selections: dict[tuple[str, Scheme], Selection] = {}
    used_targets: set[str] = set()
    out: list[GroupPlan] = []
    for group, source in groups:
        requested = requested_scheme(group, rules, role_schemes, precision.mtp)
        for rule in rules:
            used_targets.update(rule.targets_matching(group.name, group.role, group.mtp))
        d = decide(group, source, requested, family=family, arch=arch, backend=backend, selections=selections)
        nbytes = group_bytes(group, d.stored, fp8_ue8m0)
        gpu_bytes = nbytes + (fp8_prefill_bytes(group) if d.fp8_copy else 0)
        if group.mtp and not draft_loaded:
            gpu_bytes = 0
        out.append(GroupPlan(group.name, group.role, group.mtp, source, d.stored, d.served, d.converter, d.kernel,
                             group.numel, nbytes, gpu_bytes / shard_factor(group, layout, family.tp_sharded_roles),
                             group.dtype))
    plan = Plan(model, family.name, arch.name, source_format, layout, out,
                selections={f"{k}:{s.value}": asdict(v) | {"served_scheme": v.served_scheme.value}
                            for (k, s), v in selections.items()},
                num_hidden_layers=num_hidden_layers)
    for key, value in precision.foreign_keys(family).items():
        msg = (f"precision.{key}={value}: model family {family.name} has no role {key!r}, so it selects nothing "
               f"(its roles: {', '.join(family.precision_roles)})")
        plan.warnings.append(msg)
        warnings.warn(msg, ConfigWarning, stacklevel=2)
    for i, rule in enumerate(rules):
        for t in rule.targets:
            if t not in used_targets:
                msg = unmatched_target(i, t, model, [*ROLES, "mtp"])
                plan.warnings.append(msg)
                warnings.warn(msg, ConfigWarning, stacklevel=2)
    return plan


def check_backend(kind: str, name: str, arch: Arch, scheme: Scheme) -> dict:
    """Whether one named backend could run ``scheme`` on ``arch``, with the reason (for sweeps)."""
    try:
        sel = select_backend(kind, name, arch, scheme)
        return {"backend": name, "valid": True, "reason": sel.reason, "served_scheme": sel.served_scheme.value}
    except BackendError as e:
        return {"backend": name, "valid": False, "reason": str(e)}


def write_plan(plan: Plan, run_dir: Path, engine: dict | None = None) -> Path:
    """plan.json; ``engine``: the engine plan section `serve` passes to vLLM for this plan."""
    import json

    from nvfp4stack.io_atomic import atomic_write_text

    path = Path(run_dir) / "plan.json"
    body = plan.to_json() | ({"engine": engine} if engine is not None else {})
    atomic_write_text(path, json.dumps(body, indent=2, default=str))
    return path
