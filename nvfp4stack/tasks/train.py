"""``train``: train the recipe's tiny model on the stdlib corpus (cached like the factories' builds).

Each model family trains its own trainable factories (``ModelFamily.train``). recipe tiny_cpu: the
embedded default that ``serve`` runs; with conf/train's defaults this is the very cache entry
``serve`` uses.
Writes the training manifest into the run directory too.
"""
from __future__ import annotations

import json
from pathlib import Path


def trained_dir(cfg) -> tuple[Path, bool]:
    """Train (or find in the cache) the model of ``cfg.model.factory``: (the dir with its manifest,
    whether this call trained it)."""
    from nvfp4stack.families.registry import families, get_factory
    from nvfp4stack.families.resolve import cache_root

    factory = cfg.model.factory
    trainable = [n for f in families() for n in f.trainable]
    if cfg.model.path or factory not in trainable:
        raise ValueError(f"train: model.factory={factory!r}"
                         f"{' with model.path set' if cfg.model.path else ''}: expected one of the tiny "
                         f"factories ({', '.join(trainable)}) and no model.path; use the default recipe "
                         "or a recipe whose model is a trainable factory")
    return get_factory(factory)[0].train(factory, cache_root(cfg.cache_dir), cfg.train)


def run(cfg) -> int:
    from nvfp4stack.io_atomic import atomic_write_text
    from nvfp4stack.train.cache import MANIFEST, print_summary, read_manifest

    out, trained = trained_dir(cfg)
    manifest = read_manifest(out)
    copy = atomic_write_text(Path(cfg.run_dir) / MANIFEST, (out / MANIFEST).read_text())
    if not trained:  # a fresh run printed its summary as it finished
        print_summary(manifest["model"], manifest)
    print(f"train: {'' if trained else 'cached, '}{out} (manifest: {copy})")
    print(json.dumps({k: manifest[k] for k in ("seed", "steps", "tokens_seen", "final_train_loss",
                                               "heldout_ppl_bf16_weights", "uniform_ppl", "wall_s")}))
    return 0
