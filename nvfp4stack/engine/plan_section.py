"""The engine's view of the plan: role -> (scheme, kernel) plus per-layer exceptions, serialised
into the quantization config. It is derived from the planner's ``Plan`` only (one decision).

This dict travels as ``quantization_config["nvfp4stack"]`` inside vLLM's ``--hf-overrides``, so
the engine config itself carries it to the API server, the engine core and every worker
(a patch of the parent process would reach none of them). No vLLM import here: args.py and tests use it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import nvfp4stack.kernels.linear  # noqa: F401  (registers the linear backends; light imports)
import nvfp4stack.kernels.moe  # noqa: F401  (registers the MoE backends; light imports)
from nvfp4stack.families.registry import get_family
from nvfp4stack.families.roles import SupportsRoles
from nvfp4stack.kernels.base import LINEAR_BACKENDS, MOE_BACKENDS
from nvfp4stack.plan.planner import PlanError, fp8_prefill_kernels
from nvfp4stack.plan.roles import role_of
from nvfp4stack.schemes import Scheme

SECTION_KEY = "nvfp4stack"
QUANT_METHOD = "nvfp4stack"  # the name registered with vLLM's register_quantization_config
VERSION = 1
MOE_ROLES = ("routed_experts",)
# Converters the plugin runs while vLLM loads the checkpoint (engine/moe_cast_method.py), so `serve`
# takes the source checkpoint as it is: the release's MXFP4 experts, cast to NVFP4 on each rank's GPU.
# The plan entry names it ("cast"); `convert` writes the same bytes to disk for those who want a copy.
LOAD_TIME_CASTS = ("mxfp4_to_nvfp4",)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(name: str) -> str | None:
    """The decoder layer index in a native, HF or vLLM name ('model.layers.3.mlp.experts' -> '3')."""
    m = _LAYER.search(name)
    return m.group(1) if m else None


@dataclass
class EnginePlan:
    """The planner's decisions in the engine's terms: per module role the scheme its kernel
    computes and the kernel backend name, plus per-layer exceptions where precision rules split
    a role (``layers[role][layer index]``), plus the MTP draft's own roles (``mtp``), which vLLM
    numbers after the main model's layers (``model.layers.<mtp_first_layer + k>.``). vLLM asks per
    module prefix; :meth:`entry_for` answers from the MTP section, the exception, then the role's
    default."""

    # role -> {"scheme": str, "kernel": str[, "fp8_prefill": bool][, "cast": a LOAD_TIME_CASTS name]}
    roles: dict[str, dict] = field(default_factory=dict)
    layers: dict[str, dict[str, dict]] = field(default_factory=dict)
    mtp: dict[str, dict] = field(default_factory=dict)
    mtp_first_layer: int | None = None
    family: str | None = None   # the model family whose names the prefixes are (None: any family's)

    def __post_init__(self) -> None:
        entries = [(f"{SECTION_KEY}.roles.{r}", e) for r, e in self.roles.items()]
        entries += [(f"{SECTION_KEY}.layers.{r}.{i}", e) for r, by in self.layers.items() for i, e in by.items()]
        entries += [(f"{SECTION_KEY}.mtp.roles.{r}", e) for r, e in self.mtp.items()]
        for where, entry in entries:
            if not {"scheme", "kernel"} <= set(entry) <= {"scheme", "kernel", "fp8_prefill", "cast"}:
                raise ValueError(f"{where}: expected keys scheme, kernel (and fp8_prefill, cast for routed experts), "
                                 f"found {sorted(entry)}; regenerate the engine args from the recipe")
            Scheme.parse(entry["scheme"], where=f"{where}.scheme")
            if entry.get("cast", LOAD_TIME_CASTS[0]) not in LOAD_TIME_CASTS:
                raise ValueError(f"{where}.cast: expected one of {', '.join(LOAD_TIME_CASTS)} (the converters the "
                                 f"plugin runs at load), found {entry['cast']!r}; regenerate the engine args")
        if self.mtp and self.mtp_first_layer is None:
            raise ValueError(f"{SECTION_KEY}.mtp: roles given without first_layer (the main model's "
                             "num_hidden_layers); regenerate the engine args from the recipe")

    @cached_property
    def model_family(self) -> SupportsRoles | None:
        """The family ``family`` names, looked up once (None: any family's names)."""
        return get_family(self.family, f"{SECTION_KEY}.family") if self.family else None

    def entry_for(self, prefix: str) -> dict | None:
        """The plan entry of a vLLM module prefix (e.g. ``model.layers.1.mlp.experts``), or None."""
        role = role_of(prefix, self.model_family)
        if role is None:
            return None
        idx = layer_index(prefix)
        if self.mtp_first_layer is not None and idx is not None and int(idx) >= self.mtp_first_layer:
            return self.mtp.get(role)
        exception = self.layers.get(role, {}).get(idx) if idx is not None else None
        return exception or self.roles.get(role)

    def entries(self):
        """(role, entry, is_mtp) for every decision the section holds."""
        for role, e in self.roles.items():
            yield role, e, False
        for role, by in self.layers.items():
            for e in by.values():
                yield role, e, False
        for role, e in self.mtp.items():
            yield role, e, True

    def own_kernel(self, prefix: str, kind: str) -> str | None:
        """The nvfp4stack-implemented kernel the plan puts on this module, or None (vLLM's own)."""
        entry = self.entry_for(prefix)
        return None if entry is None else _own(entry, kind)

    def own_mtp_roles(self) -> list[str]:
        """The MTP draft's roles the plan puts on a kernel this package implements."""
        return sorted(r for r, e in self.mtp.items() if _own_role(r, e))

    def needs_plugin(self) -> bool:
        """True when any NVFP4 module runs on a kernel this package implements."""
        return any(_own_role(role, e) for role, e, _ in self.entries())

    def to_dict(self) -> dict:
        d = {"version": VERSION, "roles": self.roles}
        if self.family:
            d["family"] = self.family
        if self.layers:
            d["layers"] = self.layers
        if self.mtp:
            d["mtp"] = {"first_layer": self.mtp_first_layer, "roles": self.mtp}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EnginePlan":
        if d.get("version") != VERSION:
            raise ValueError(f"{SECTION_KEY}.version: expected {VERSION}, found {d.get('version')!r}; "
                             "regenerate the engine args with this nvfp4stack version")
        mtp = d.get("mtp") or {}
        return cls(roles=dict(d.get("roles", {})), layers={r: dict(by) for r, by in d.get("layers", {}).items()},
                   mtp=dict(mtp.get("roles", {})), mtp_first_layer=mtp.get("first_layer"), family=d.get("family"))


def _own_role(role: str, entry: dict) -> str | None:
    """``_own`` with the kind a role's modules are: MoE for the routed-expert roles, linear for the rest."""
    return _own(entry, "moe" if role in MOE_ROLES else "linear")


def _own(entry: dict, kind: str) -> str | None:
    # MoE: the NVFP4 experts (the plugin's methods take those only); linear: any quantized format our
    # linear method loads (engine/linear_method.py), e.g. the FP8 block projections on torch_emulation
    if kind == "moe" and not Scheme(entry["scheme"]).is_nvfp4:
        return None
    reg = MOE_BACKENDS if kind == "moe" else LINEAR_BACKENDS
    name = entry["kernel"]
    return name if name in reg and reg.get(name).capabilities.provider == "nvfp4stack" else None


def _agree(seen: dict, key, entry: dict, name: str, role: str, where: str) -> None:
    """Record ``entry`` under ``key``; vLLM builds one method per module, so a second, different
    decision for the same module (the experts of one MoE layer, w1 next to w3) is refused."""
    old = seen.setdefault(key, (entry, name))
    if old[0] != entry:
        raise PlanError(
            f"plan: role {role!r} has two decisions in {where} ({old[0]} at {old[1]}, {entry} at "
            f"{name}); vLLM builds one method per module, so every group of a role in one layer "
            "must agree. Fix: make the precision rules match whole layers (e.g. "
            "'re:^layers\\.(0|1)\\.ffn\\.experts\\.')")


def engine_plan_from_plan(plan, *, fp8_prefill: bool = False, mtp_draft: bool = False) -> EnginePlan:
    """The planner's ``Plan`` (per tensor group) in the engine's terms: one default per role (the
    decision most of its groups got) and per-layer exceptions for the rest.

    vLLM builds one quantization method per module, so the groups of one role inside one layer
    must agree; when they do not this raises, naming the group. ``mtp_draft``: the MTP block is
    served as a speculative draft; its decisions form the ``mtp`` section (vLLM numbers its layers
    from the plan's ``num_hidden_layers``; its routed experts get vLLM's speculative moe_backend).
    """
    from collections import Counter

    per_layer: dict[str, dict[str | None, tuple[dict, str]]] = {}
    mtp: dict[str, tuple[dict, str]] = {}
    fp8_kernels = fp8_prefill_kernels() if fp8_prefill else []
    for g in plan.groups:
        if not g.name or g.kernel == "-":
            continue  # norms, biases, tables: no kernel decision
        entry = {"scheme": g.served.value, "kernel": g.kernel}
        if g.role in MOE_ROLES and g.kernel in fp8_kernels and not g.mtp:
            entry["fp8_prefill"] = True
        if cast_at_load(g):   # W4A4 needs activation scales: load_time_refusal
            entry["cast"] = g.converter
        if g.mtp:
            if mtp_draft:
                _agree(mtp, g.role, entry, g.name, g.role, "the MTP block")
            continue
        idx = layer_index(g.name)
        _agree(per_layer.setdefault(g.role, {}), idx, entry, g.name, g.role,
               f"layer {idx}" if idx is not None else "the model")
    roles: dict[str, dict] = {}
    layers: dict[str, dict[str, dict]] = {}
    for role, by in per_layer.items():
        counts = Counter(_key(e) for e, _ in by.values())
        default_key = max(counts, key=lambda k: (counts[k], k))
        roles[role] = dict(default_key)
        for idx, (e, _) in sorted(by.items(), key=lambda kv: int(kv[0]) if kv[0] is not None else -1):
            if _key(e) != default_key and idx is not None:
                layers.setdefault(role, {})[idx] = e
    first = getattr(plan, "num_hidden_layers", None)
    if mtp_draft and not mtp:
        family = getattr(plan, "family", None) or "this model"
        raise PlanError(f"engine.speculative.method=mtp: {family} has no multi-token-prediction layers (no "
                        "tensor group of the checkpoint or descriptor is MTP), so vLLM's MTP draft has nothing "
                        "to load and the engine would stop at start. Fix: engine.speculative.method=null")
    if mtp and first is None:
        raise PlanError("plan: the MTP draft has decisions but the plan does not know num_hidden_layers "
                        "(config.json), which vLLM numbers the MTP layers after. Fix: give the model's "
                        "config.json num_hidden_layers, or engine.speculative.method=null")
    return EnginePlan(roles, layers, {r: e for r, (e, _) in mtp.items()}, first if mtp else None,
                      family=getattr(plan, "family", None))


def _cast_at_load(g) -> bool:
    """Routed experts stored in a format the plugin casts at load, served on one of our kernels (vLLM's
    own kernels load what their own methods take)."""
    served, kernel = getattr(g, "served", None), getattr(g, "kernel", None)
    return (g.role in MOE_ROLES and getattr(g, "converter", None) in LOAD_TIME_CASTS and served is not None
            and kernel is not None and _own({"scheme": served.value, "kernel": kernel}, "moe") is not None)


def cast_at_load(g) -> str | None:
    """The converter the plugin runs on this group while vLLM loads it (so `serve` takes the source as
    it is), or None."""
    return g.converter if _cast_at_load(g) and g.served is Scheme.NVFP4_W4A16 else None


def load_time_refusal(plan) -> str | None:
    """Why `serve` cannot take the planned source checkpoint as it is, or None: routed experts stored in a
    format the plugin casts at load (LOAD_TIME_CASTS) but served W4A4, which needs calibrated activation
    scales (input_scale) that the release's MXFP4 experts do not carry. `plan` shows such a plan (its
    offline path, quantize with calibration or convert, is valid); only serving the source refuses."""
    for g in plan.groups:
        if _cast_at_load(g) and g.served is not Scheme.NVFP4_W4A16:
            return (f"{g.name} (role {g.role}): serving the source's {g.source.value} experts as {g.served.value} needs "
                    "calibrated activation scales (input_scale), which a load-time cast cannot make. Fix: "
                    f"precision.{g.role}=nvfp4_w4a16 (weight-only, no activation scales), or quantize with "
                    "calibration (python main.py quantize) and serve its output")
    return None


def _key(entry: dict) -> tuple:
    return tuple(sorted(entry.items()))


def engine_plan_for(cfg, planned=None) -> EnginePlan:
    """The engine plan of a recipe: the planner's own ``Plan`` (precision rules, hard rules, backend
    validation) over the model's tensor groups (its checkpoint, else its descriptor), so ``plan``
    and ``serve`` accept and refuse the same things. ``planned``: that ``Plan``, when the caller
    has it already (``plan_for_config(cfg)``)."""
    from nvfp4stack.plan.build import plan_for_config

    return engine_plan_from_plan(plan_for_config(cfg) if planned is None else planned, fp8_prefill=cfg.backend.moe_fp8_prefill,
                                 mtp_draft=cfg.engine.speculative.method == "mtp")


def layers_with_scheme(plan: EnginePlan, role: str, scheme: Scheme, num_layers: int) -> list[int]:
    """Decoder layers whose ``role`` modules the plan serves as ``scheme``."""
    default = plan.roles.get(role)
    out = []
    for i in range(num_layers):
        entry = plan.layers.get(role, {}).get(str(i), default)
        if entry is not None and entry["scheme"] == scheme.value:
            out.append(i)
    return out


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
