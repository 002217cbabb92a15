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
    """convert.rules when given; otherwise the plan of this config (nvfp4stack.plan)."""
    from nvfp4stack.convert.stream import chooser_from_rules

    rules = _plain(cfg.convert.rules)
    if rules:  # a list of 'glob=converter' (or a mapping, from Python callers)
        return chooser_from_rules(rules)
    from nvfp4stack.plan.build import plan_for_config

    return chooser_from_plan(plan_for_config(cfg))


def run(cfg) -> int:
    from nvfp4stack.convert.stream import convert_checkpoint

    c = cfg.convert
    src = Path(c.src or getattr(cfg.model, "path", "") or "")
    if not str(src) or not src.is_dir():
        log.error("convert.src: expected a checkpoint directory, found %r; set convert.src=DIR "
                  "(or model.path)", str(src))
        return 2
    dst = Path(c.dst) if c.dst else Path(cfg.run_dir) / "checkpoint"
    try:
        report = convert_checkpoint(
            src, dst, chooser_for(cfg, src), unknown_tensors=c.unknown_tensors,
            overwrite=c.overwrite, max_shard_bytes=int(c.max_shard_bytes), device=c.device,
            hf_quant_config=_plain(c.hf_quant_config) or None)
    except (FileExistsError, ValueError, KeyError) as e:
        log.error("convert failed: %s", e)
        return 1
    log.info("wrote %s: %d shard(s), %d unknown tensor(s) passed through; report %s",
             dst, report["shards"], len(report["unknown_tensors"]), json.dumps(report["converters"])[:500])
    return 0
