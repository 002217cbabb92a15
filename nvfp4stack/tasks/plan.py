"""``plan``: print what every tensor group becomes and where it runs; write plan.json."""
from __future__ import annotations

import json
from dataclasses import replace

from nvfp4stack.arch import resolve
from nvfp4stack.kernels.select import BackendError
from nvfp4stack.models.resolve import config_json_path
from nvfp4stack.plan.build import plan_for_config
from nvfp4stack.plan.groups import load_config_json
from nvfp4stack.plan.kv_cache import format_kv_report, kv_cache_report
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
    if s is Scheme.PASSTHROUGH:
        return {"official": Scheme.MXFP4, "modelopt": Scheme.NVFP4}.get(cfg.model.source_format, Scheme.BF16)
    return s


def run(cfg) -> int:
    arch = resolve(cfg.arch.name)
    checks = {"moe": check_backend("moe", cfg.backend.moe, arch, expert_scheme(cfg))}
    backend = cfg.backend
    if not checks["moe"]["valid"]:
        print(f"REFUSED backend.moe={cfg.backend.moe} on {arch}: {checks['moe']['reason']}")
        backend = replace(cfg.backend, moe="auto")
    try:
        plan = plan_for_config(cfg, arch=arch, backend=backend)
    except BackendError as e:
        print(f"error: {e}")
        return 2
    plan.backend_checks = checks
    if backend is not cfg.backend:
        chosen = plan.selections.get(f"moe:{expert_scheme(cfg).value}", {}).get("backend")
        msg = f"backend.moe={cfg.backend.moe} refused on {arch}; planned with backend.moe=auto -> {chosen}"
        print(msg)
        plan.warnings.append(msg)
        checks["moe"]["fallback"] = chosen
    print(format_plan(plan))
    if cfg.backend.moe_fp8_prefill:
        print("backend.moe_fp8_prefill=true: the routed experts' FP8 prefill copy (+1 byte/weight, built at load) "
              "is included in the per-GPU bytes")
    hf = load_config_json(config_json_path(cfg.model, cfg.cache_dir))
    if cfg.model.family == "deepseek_v4":
        plan.kv_cache = kv_cache_report(hf, cfg.engine, cfg.arch, plan.gpu_bytes)
        print(format_kv_report(plan.kv_cache))
    path = write_plan(plan, cfg.run_dir)
    print(f"plan written to {path}")
    print(json.dumps({"backend_checks": checks}, indent=None))
    return 0
