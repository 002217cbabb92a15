"""Per tensor group precision for evaluation: the planner's own decisions.

Emulation needs each group's *source* scheme (what the checkpoint stores) and *target* scheme (what
the recipe stores); kernel choice does not change the numbers being emulated. So the scheme map is
the planner's stored decision per group (``stored_schemes``, the half of ``decide`` that picks no
kernel), and the full plan (kernels, served scheme) is attached when it builds; when it does not (no
kernel for this host, say), the reason is recorded. The reference is always BF16: the checkpoint itself for a BF16 source, else
``eval.reference_path`` (a tiny factory's own BF16 layout for ``model.source_format=official``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from nvfp4stack.eval.weights import PlannedWeights
from nvfp4stack.families.registry import get_family
from nvfp4stack.families.resolve import model_dir
from nvfp4stack.plan.memory import group_bytes
from nvfp4stack.schemes import Scheme


@dataclass
class EvalPrecision:
    """group name -> target scheme, plus what the plan says about bytes and serving."""

    targets: dict[str, Scheme]
    roles: dict[str, str]
    weight_bytes: int
    plan_gpu_bytes: float | None = None
    served: dict[str, str] = field(default_factory=dict)   # role -> served scheme, when the plan built
    plan_error: str | None = None
    weights: PlannedWeights = field(default_factory=lambda: PlannedWeights({}, None))

    def scheme_for(self, group: str) -> Scheme:
        """Target of a native group; groups the plan does not know (none expected) stay bf16."""
        return self.targets.get(group, Scheme.BF16)

    def role_schemes(self) -> dict[str, str]:
        """role -> scheme ('mixed' when rules give one role several schemes)."""
        out: dict[str, set[str]] = {}
        for name, role in self.roles.items():
            out.setdefault(role, set()).add(self.targets[name].value)
        return {r: (s.pop() if len(s) == 1 else "mixed") for r, s in sorted(out.items())}


def _checkpoint_dir(d: Path, key: str) -> Path:
    if not (d / "config.json").exists() and (d / "bf16" / "config.json").exists():
        d = d / "bf16"
    if not (d / "config.json").exists():
        raise FileNotFoundError(f"{key}={d}: no config.json; point it at a BF16 checkpoint dir")
    return d


def bf16_checkpoint_dir(cfg) -> Path:
    """The BF16 reference checkpoint (the directory holding its config.json)."""
    ref = getattr(cfg.eval, "reference_path", None)
    if ref:
        return _checkpoint_dir(Path(ref).expanduser(), "eval.reference_path")
    if cfg.model.source_format != "bf16":
        if cfg.model.factory and not cfg.model.path:  # a factory model builds its BF16 layout too
            return bf16_checkpoint_dir(replace(cfg, model=replace(cfg.model, source_format="bf16")))
        raise FileNotFoundError(
            f"model.source_format={cfg.model.source_format}: eval compares against BF16, and this checkpoint "
            "is quantized; set eval.reference_path=<BF16 checkpoint dir of the same model>")
    d = model_dir(cfg.model, cfg.cache_dir)
    if d is None:
        raise FileNotFoundError(
            f"model {cfg.model.name}: eval needs weights, but the model is a weight-free descriptor; "
            "set model.path=<BF16 checkpoint dir> or use a recipe whose model is a tiny factory"
        )
    return _checkpoint_dir(d, "model.path")


def source_checkpoint_dir(cfg, reference: Path) -> Path:
    """Where the plan reads its source tensors: the model's checkpoint, or the reference when BF16."""
    if cfg.model.source_format == "bf16":
        return reference
    d = model_dir(cfg.model, cfg.cache_dir)
    if d is None:
        raise FileNotFoundError(f"model {cfg.model.name}: model.source_format={cfg.model.source_format} needs "
                                "the quantized checkpoint; set model.path=<its directory>")
    return d


def with_checkpoint(cfg, ckpt: Path):
    """``cfg`` with model.path pointing at ``ckpt`` (so the planner reads that checkpoint's headers)."""
    return replace(cfg, model=replace(cfg.model, path=str(ckpt)))


def eval_precision(cfg, ckpt: Path) -> EvalPrecision:
    """Source and target scheme per tensor group for ``cfg.precision``, as the plan decides them
    (``ckpt``: the BF16 reference)."""
    from nvfp4stack.arch import resolve
    from nvfp4stack.plan.build import plan_for_config, plan_groups
    from nvfp4stack.plan.planner import stored_schemes

    source_dir = source_checkpoint_dir(cfg, ckpt)
    cfg = with_checkpoint(cfg, source_dir)
    family = get_family(cfg.model.family)
    groups = plan_groups(cfg, family)
    decided = stored_schemes(groups[1], cfg.precision, family)  # hard-rule refusals raise here
    ue8m0 = cfg.precision.fp8_scale_fmt == "ue8m0"
    targets, roles, sources = {}, {}, {}
    for g, source, target in decided:
        if g.is_matrix:
            # MTP groups keep their own row: transformers' forward has no MTP block to evaluate them in
            targets[g.name], roles[g.name], sources[g.name] = target, ("mtp" if g.mtp else g.role), source
    nbytes = sum(group_bytes(g, target, ue8m0) for g, _, target in decided)
    out = EvalPrecision(targets, roles, nbytes, weights=PlannedWeights(sources, source_dir))
    try:
        plan = plan_for_config(cfg, arch=resolve(cfg.arch.name), groups=groups)
        out.plan_gpu_bytes = plan.gpu_bytes
        out.served = {g.role: g.served.value for g in plan.groups if g.name in targets}
    except Exception as e:  # noqa: BLE001 - a plan that cannot build still has emulatable targets
        out.plan_error = f"{type(e).__name__}: {e}"
    return out
