"""``plan``: print what every tensor group becomes and where it runs; write plan.json."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from nvfp4stack.arch import resolve
from nvfp4stack.engine.plan_section import engine_plan_from_plan
from nvfp4stack.kernels.select import BackendError
from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.families.registry import get_family
from nvfp4stack.plan.build import kv_cache_for_config, plan_for_config
from nvfp4stack.plan.kv_cache import format_kv_report, nothing_fits
from nvfp4stack.plan.planner import Plan, check_backend, write_plan
from nvfp4stack.schemes import Scheme

GB, GiB = 1e9, 2**30


def _fmt_bytes(n: float) -> str:
    """GB from 0.1 GB up, MiB below that, KiB below 0.1 MiB: tiny models show real figures."""
    if n >= 0.1 * GB:
        return f"{n / GB:,.2f} GB"
    if n >= 0.1 * 2**20:
        return f"{n / 2**20:,.2f} MiB"
    return f"{n / 2**10:,.2f} KiB"


def _fmt_params(n: int) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= 0.1 * div:
            return f"{n / div:.3f}{unit}"
    return f"{n / 1e3:.1f}K"


def format_plan(plan: Plan) -> str:
    """A readable table: one row per (role, decision), then totals and the per-GPU footprint."""
    head = f"{'role':<22}{'mtp':<5}{'count':>7}  {'source -> target (served)':<38}{'converter':<24}{'kernel':<20}{'params':>10}{'bytes':>14}"
    lines = [f"plan for {plan.model} ({plan.family}) on {plan.arch}, source format {plan.source_format}",
             head, "-" * len(head)]
    for r in plan.rows:
        served = f" ({r.served})" if r.served != r.target else ""
        lines.append(
            f"{r.role:<22}{'yes' if r.mtp else '':<5}{r.count:>7}  {r.source + ' -> ' + r.target + served:<38}"
            f"{r.converter:<24}{r.kernel:<20}{_fmt_params(r.params):>10}{_fmt_bytes(r.bytes):>14}"
        )
    lo = plan.layout
    lines += [
        "-" * len(head),
        f"total parameters: {plan.total_params:,} ({_fmt_params(plan.total_params)})",
        f"total weight bytes: {_fmt_bytes(plan.total_bytes)}"
        + (f" = {plan.total_bytes / GiB:,.1f} GiB" if plan.total_bytes >= 0.1 * GB else ""),
        f"per-GPU weight bytes (tp={lo.tp} dp={lo.dp} ep={lo.ep}, {lo.num_gpus} GPUs): "
        f"{_fmt_bytes(plan.gpu_bytes)}" + (f" = {plan.gpu_bytes / GiB:,.2f} GiB" if plan.gpu_bytes >= 0.1 * GB else ""),
    ]
    by_role = plan.to_json()["bytes_by_role"]
    lines.append("bytes by role: " + ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in sorted(by_role.items(), key=lambda kv: -kv[1])))
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def expert_scheme(cfg) -> Scheme:
    """The scheme routed experts are planned to (what the MoE backend must run)."""
    s = Scheme(cfg.precision.routed_experts)
    if s is Scheme.PASSTHROUGH:  # kept as stored: the family says how its source format stores them
        experts = TensorGroup("routed_experts", (1, 1), "routed_experts")
        return get_family(cfg.model.family).source_scheme(experts, cfg.model.source_format)
    return s


def _write_summary(cfg, plan: Plan, checks: dict) -> None:
    """metrics.json: the plan's headline figures, one row of a multirun's sweep report."""
    from pathlib import Path

    from nvfp4stack.io_atomic import atomic_write_text

    moe = checks["moe"]
    kv = plan.kv_cache or {}
    row = {"moe_backend_requested": moe["backend"], "moe_backend_valid": "yes" if moe["valid"] else "REFUSED",
           "moe_backend_planned": plan.selections.get(f"moe:{expert_scheme(cfg).value}", {}).get("backend", "-"),
           "experts_served": moe.get("served_scheme", "-"), "total_params": plan.total_params,
           "weight_bytes": plan.total_bytes, "gpu_weight_bytes": plan.gpu_bytes}
    if kv.get("max_kv_tokens") is not None:
        row["max_kv_tokens"] = kv["max_kv_tokens"]
    atomic_write_text(Path(cfg.run_dir) / "metrics.json", json.dumps(row, indent=2))


def run(cfg) -> int:
    """Print and write the plan. Exit 0; 2 when an explicit backend is refused (the plan written
    beside it is the ``auto`` fallback, for comparison); 1 when the weights leave no room for KV
    cache (``NOTHING FITS``)."""
    arch = resolve(cfg.arch.name)
    checks = {"moe": check_backend("moe", cfg.backend.moe, arch, expert_scheme(cfg))}
    refusal = None
    try:
        plan = plan_for_config(cfg, arch=arch)
    except BackendError as e:
        if not cfg.backend.moe or checks["moe"]["valid"]:
            raise  # not the MoE choice (linear, mtp_moe): nothing to fall back to
        # Show what auto would do next to the refusal, then exit 2 with the refusal itself: the
        # same error `serve` gives for the same overrides.
        refusal = e
        plan = plan_for_config(cfg, arch=arch, backend=replace(cfg.backend, moe="auto"))
        chosen = plan.selections.get(f"moe:{expert_scheme(cfg).value}", {}).get("backend")
        checks["moe"]["fallback"] = chosen
        plan.warnings.append(f"REFUSED backend.moe={cfg.backend.moe} on {arch}; shown: backend.moe=auto -> {chosen}")
    plan.backend_checks = checks
    # what `serve` will run: the same planner output in the engine's terms (refusals raise here too)
    engine = engine_plan_from_plan(plan, fp8_prefill=cfg.backend.moe_fp8_prefill,
                                   mtp_draft=cfg.engine.speculative.method == "mtp")
    print(format_plan(plan))
    if cfg.backend.moe_fp8_prefill:
        print("backend.moe_fp8_prefill=true: the routed experts' FP8 prefill copy (+1 byte/weight, built at load) "
              "is included in the per-GPU bytes")
    plan.kv_cache = kv_cache_for_config(cfg, plan)
    if plan.kv_cache is not None:
        print(format_kv_report(plan.kv_cache))
    path = write_plan(plan, cfg.run_dir, engine=engine.to_dict())
    _write_summary(cfg, plan, checks)
    print(f"plan written to {path}")
    print(json.dumps({"backend_checks": checks}, indent=None))
    if refusal is not None:
        raise refusal
    too_big = nothing_fits(plan.kv_cache)
    if too_big:
        print(f"plan: {too_big}", file=sys.stderr)
        return 1
    return 0
