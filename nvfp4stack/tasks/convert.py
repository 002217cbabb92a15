"""``convert`` command: stream the source checkpoint through the plan's converters."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from nvfp4stack.schemes import Scheme

log = logging.getLogger(__name__)


def _plain(x):
    """OmegaConf containers -> plain dict/list (this module never imports Hydra/OmegaConf)."""
    if hasattr(x, "items"):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or (hasattr(x, "__iter__") and not isinstance(x, (str, bytes))):
        return [_plain(v) for v in x]
    return x


def chooser_from_plan(plan):
    """A stream chooser from a plan: group name (module prefix) -> its converter or passthrough.

    Parameters stored without a suffix (e.g. a learned position bias) are groups of their own
    in the plan, while the stream asks for their parent module: a parent whose every such child
    group passes through passes through too. Anything else is unknown (None).
    """
    from nvfp4stack.convert.stream import PASSTHROUGH

    by_group = {g.name: (g.converter or PASSTHROUGH) for g in plan.groups}
    by_parent: dict[str, set] = {}
    for name, conv in by_group.items():
        by_parent.setdefault(name.rpartition(".")[0], set()).add(conv)

    def choose(module: str):
        if module in by_group:
            return by_group[module]
        return PASSTHROUGH if by_parent.get(module) == {PASSTHROUGH} else None

    return choose


def chooser_for(cfg, src: Path):
    """(chooser, config.json to write or None, group -> source scheme or None, plan or None):
    convert.rules when given (config copied as is, each rule's converter says what it reads);
    otherwise the plan of this config, with the config fix-ups its targets need and the source
    format of every group."""
    from nvfp4stack.convert.stream import chooser_from_rules

    rules = _plain(cfg.convert.rules)
    if rules:  # a list of 'glob=converter' (or a mapping, from Python callers)
        return chooser_from_rules(rules), None, None, None
    from nvfp4stack.plan.build import plan_for_config

    plan = plan_for_config(cfg)
    sources = {g.name: g.source for g in plan.groups}
    return chooser_from_plan(plan), planned_config(cfg, plan, src), sources, plan


def activation_scale_gap(plan) -> str | None:
    """One line when the plan serves routed experts W4A4 from a source that carries no activation
    scales (BF16, the release's MXFP4): a data-free convert cannot write the input_scale that W4A4
    needs, so doctor and serve will refuse the output. None otherwise."""
    gaps = [g for g in plan.groups if g.role == "routed_experts" and g.converter and g.served is Scheme.NVFP4
            and g.source in (Scheme.BF16, Scheme.MXFP4)]
    if not gaps:
        return None
    return (f"the plan serves {len(gaps)} routed-expert group(s) W4A4 (nvfp4, e.g. {gaps[0].name}) from a "
            f"{gaps[0].source.value} source, and a data-free convert writes no activation scales (input_scale): "
            "doctor and serve refuse this output. Fix: precision.routed_experts=nvfp4_w4a16 (weight-only), or "
            "python main.py ... quantize (modelopt calibration)")


def planned_config(cfg, plan, src: Path) -> dict | None:
    """config.json for the converted checkpoint: the model family's fix-ups for what the plan
    converts to (None: the source's config.json is copied as it is)."""
    from nvfp4stack.checkpoint.safetensors_io import check_inside
    from nvfp4stack.families.registry import get_family

    if not (src / "config.json").exists():
        return None
    path = check_inside(src, src / "config.json", "config.json")
    return get_family(cfg.model.family).served_config(json.loads(path.read_text()), plan.groups)


def default_dst(cfg, src: Path, choose) -> Path:
    """Where ``convert`` writes when convert.dst is unset: one stable directory per (recipe, source,
    plan), ``outputs/converted/<recipe>-<digest>``, so rerunning the same command resumes or finds
    its output complete instead of starting a new timestamped directory."""
    import hashlib

    from nvfp4stack.checkpoint.safetensors_io import ShardedReader
    from nvfp4stack.convert.stream import plan_units

    units, _ = plan_units(ShardedReader(src).names(), choose)
    h = hashlib.sha256(str(src.resolve()).encode())
    for u in units:
        h.update(f"{u.converter}|{u.prefix}".encode())
    return Path("outputs") / "converted" / f"{cfg.recipe}-{h.hexdigest()[:10]}"


def run(cfg) -> int:
    from nvfp4stack.convert.stream import REPORT, convert_checkpoint

    c = cfg.convert
    if c.src or getattr(cfg.model, "path", None):
        from nvfp4stack.checkpoint.location import checkpoint_dir

        key, value = ("convert.src", c.src) if c.src else ("model.path", cfg.model.path)
        src = checkpoint_dir(key, value, needs_config=False)
    else:  # a factory model: built on first use
        from nvfp4stack.families.resolve import model_dir

        src = model_dir(cfg.model, cfg.cache_dir) or Path("")
    if not str(src) or not src.is_dir():
        raise FileNotFoundError(f"convert.src: expected a checkpoint directory, found {str(src)!r}; set "
                                "convert.src=DIR (or model.path)")
    choose, config, sources, plan = chooser_for(cfg, src)
    dst = Path(c.dst).expanduser() if c.dst else default_dst(cfg, src, choose)
    print(f"convert: {src} -> {dst}", flush=True)
    report = convert_checkpoint(
        src, dst, choose, config=config, unknown_tensors=c.unknown_tensors, sources=sources,
        overwrite=c.overwrite, max_shard_bytes=int(c.max_shard_bytes), device=c.device,
        workers=int(c.workers), hf_quant_config=_plain(c.hf_quant_config) or None)
    gap = activation_scale_gap(plan) if plan is not None else None
    if gap:
        print(f"convert: warning: {gap}", file=sys.stderr, flush=True)
    if report.get("already_complete"):
        return 0
    print(f"convert: wrote {dst}: {report['shards']} shard(s), {len(report['unknown_tensors'])} unknown "
          f"tensor(s) kept unchanged", flush=True)
    log.info("converter report %s", clip(json.dumps(report["converters"]), 500, dst / REPORT))
    return 0


def clip(text: str, limit: int, full: Path) -> str:
    """``text`` cut to ``limit`` characters, the cut marked and pointing at the whole of it."""
    return text if len(text) <= limit else f"{text[:limit]}... (truncated; full report in {full})"
