"""Per tensor group precision for evaluation, from the plan's own resolution rules.

Emulation needs only each group's *target* scheme (what the recipe stores) and its weight bytes;
kernel choice and converters do not change the numbers being emulated. So the scheme map comes from
the planner's ``resolve_target`` and hard rules directly, and the full plan (kernels, served scheme)
is attached when it builds; when it does not (no kernel for this host, say), the reason is recorded.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from nvfp4stack.models.resolve import model_dir
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

    def scheme_for(self, group: str) -> Scheme:
        """Target of a native group; groups the plan does not know (none expected) stay bf16."""
        return self.targets.get(group, Scheme.BF16)

    def role_schemes(self) -> dict[str, str]:
        """role -> scheme ('mixed' when rules give one role several schemes)."""
        out: dict[str, set[str]] = {}
        for name, role in self.roles.items():
            out.setdefault(role, set()).add(self.targets[name].value)
        return {r: (s.pop() if len(s) == 1 else "mixed") for r, s in sorted(out.items())}


def bf16_checkpoint_dir(cfg) -> Path:
    """The directory holding the BF16 checkpoint's config.json (tiny_dsv4 keeps it under bf16/)."""
    d = model_dir(cfg.model, cfg.cache_dir)
    if d is None:
        raise FileNotFoundError(
            f"model {cfg.model.name}: eval needs weights, but the model is a weight-free descriptor; "
            "set model.path=<BF16 checkpoint dir> or use recipe=tiny_dsv4"
        )
    if not (d / "config.json").exists() and (d / "bf16" / "config.json").exists():
        d = d / "bf16"
    if not (d / "config.json").exists():
        raise FileNotFoundError(f"{d}: no config.json; model.path must be a BF16 checkpoint dir")
    return d


def with_checkpoint(cfg, ckpt: Path):
    """``cfg`` with model.path pointing at ``ckpt`` (so the planner reads that checkpoint's headers)."""
    return replace(cfg, model=replace(cfg.model, path=str(ckpt)))


def eval_precision(cfg, ckpt: Path) -> EvalPrecision:
    """Target scheme per tensor group for ``cfg.precision``, resolved like the plan does."""
    from nvfp4stack.arch import resolve
    from nvfp4stack.plan.build import plan_for_config, plan_groups
    from nvfp4stack.plan.planner import check_hard_rules, resolve_target

    cfg = with_checkpoint(cfg, ckpt)
    p = cfg.precision
    _, groups = plan_groups(cfg)
    targets, roles, nbytes = {}, {}, 0
    rules, role_schemes = list(p.rules), p.role_schemes()
    for g, source in groups:
        if not g.is_matrix:
            continue
        target = resolve_target(g, source, rules, role_schemes, p.mtp)
        check_hard_rules(g, source, target, cfg.model.family)
        # MTP groups keep their own row: transformers' forward has no MTP block to evaluate them in
        targets[g.name], roles[g.name] = target, ("mtp" if g.mtp else g.role)
        nbytes += group_bytes(g, target, p.fp8_scale_fmt == "ue8m0")
    nbytes += sum(group_bytes(g, s) for g, s in groups if not g.is_matrix)
    out = EvalPrecision(targets, roles, nbytes)
    try:
        plan = plan_for_config(cfg, arch=resolve(cfg.arch.name))
        out.plan_gpu_bytes = plan.gpu_bytes
        out.served = {g.role: g.served.value for g in plan.groups if g.name in targets}
    except Exception as e:  # noqa: BLE001 - a plan that cannot build still has emulatable targets
        out.plan_error = f"{type(e).__name__}: {e}"
    return out
