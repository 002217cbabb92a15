"""``convert`` command: stream the source checkpoint through the plan's converters."""
from __future__ import annotations

import json
import logging
from pathlib import Path

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

    Parameters stored without a suffix (e.g. ``attn.compressor.ape``) are groups of their own
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
    """(chooser, config.json to write or None): convert.rules when given (config copied as is);
    otherwise the plan of this config, with the config fix-ups its targets need."""
    from nvfp4stack.convert.stream import chooser_from_rules

    rules = _plain(cfg.convert.rules)
    if rules:  # a list of 'glob=converter' (or a mapping, from Python callers)
        return chooser_from_rules(rules), None
    from nvfp4stack.plan.build import plan_for_config

    plan = plan_for_config(cfg)
    return chooser_from_plan(plan), planned_config(cfg, plan, src)


def planned_config(cfg, plan, src: Path) -> dict | None:
    """config.json for the converted DeepSeek-V4 checkpoint: what vLLM needs to read its formats."""
    from nvfp4stack.checkpoint.config_fixups import SERVE_FIXUPS, apply_fixups
    from nvfp4stack.schemes import Scheme

    if cfg.model.family != "deepseek_v4" or not (src / "config.json").exists():
        return None
    targets = {(g.role, g.target) for g in plan.groups if g.converter}
    fixups = list(SERVE_FIXUPS)
    if any(t is Scheme.FP8_BLOCK for _, t in targets):
        fixups.append("fp8_block_ue8m0")
    if any(r == "routed_experts" and t.is_nvfp4 for r, t in targets):
        fixups.append("moe_nvfp4")
    return apply_fixups(json.loads((src / "config.json").read_text()), fixups)


def run(cfg) -> int:
    from nvfp4stack.convert.stream import convert_checkpoint

    c = cfg.convert
    if c.src or getattr(cfg.model, "path", None):
        src = Path(c.src or cfg.model.path)
    else:  # a factory model (e.g. tiny_dsv4): built on first use
        from nvfp4stack.models.resolve import model_dir

        src = model_dir(cfg.model, cfg.cache_dir) or Path("")
    if not str(src) or not src.is_dir():
        log.error("convert.src: expected a checkpoint directory, found %r; set convert.src=DIR "
                  "(or model.path)", str(src))
        return 2
    dst = Path(c.dst) if c.dst else Path(cfg.run_dir) / "checkpoint"
    try:
        choose, config = chooser_for(cfg, src)
        report = convert_checkpoint(
            src, dst, choose, config=config, unknown_tensors=c.unknown_tensors,
            overwrite=c.overwrite, max_shard_bytes=int(c.max_shard_bytes), device=c.device,
            hf_quant_config=_plain(c.hf_quant_config) or None)
    except (FileExistsError, ValueError, KeyError) as e:
        log.error("convert failed: %s", e)
        return 1
    log.info("wrote %s: %d shard(s), %d unknown tensor(s) passed through; report %s",
             dst, report["shards"], len(report["unknown_tensors"]), json.dumps(report["converters"])[:500])
    return 0
