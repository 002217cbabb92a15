"""``train``: train the recipe's tiny model on the stdlib corpus (cached like the factories' builds).

recipe tiny_cpu (model tiny_v3): the embedded default that ``serve`` runs; with conf/train's defaults
this is the very cache entry ``serve`` uses. recipe=tiny_dsv4: the tiny DeepSeek-V4, which the
``tiny_dsv4_trained`` factory serves to ``eval`` (``model.factory=tiny_dsv4_trained``).
Writes the training manifest into the run directory too.
"""
from __future__ import annotations

import json
from pathlib import Path

TRAINABLE = ("tiny_v3", "tiny_v3_random", "tiny_dsv4", "tiny_dsv4_trained")


def trained_dir(cfg) -> tuple[Path, bool]:
    """Train (or find in the cache) the model of ``cfg.model.factory``: (the dir with its manifest,
    whether this call trained it)."""
    from nvfp4stack.models.resolve import cache_root

    factory = cfg.model.factory
    if cfg.model.path or factory not in TRAINABLE:
        raise ValueError(f"train: model.factory={factory!r}"
                         f"{' with model.path set' if cfg.model.path else ''}: expected one of the tiny "
                         f"factories ({', '.join(TRAINABLE)}) and no model.path; use the default recipe "
                         "(tiny_v3) or recipe=tiny_dsv4")
    cache = cache_root(cfg.cache_dir)
    if factory.startswith("tiny_v3"):
        from nvfp4stack.models.tiny_v3 import ensure_trained_tiny_v3

        return ensure_trained_tiny_v3(cache / "tiny_v3", train=cfg.train)
    from nvfp4stack.train.models import ensure_trained_tiny_dsv4

    return ensure_trained_tiny_dsv4(cache / "models", cfg.train)


def run(cfg) -> int:
    from nvfp4stack.io_atomic import atomic_write_text
    from nvfp4stack.train.models import MANIFEST, print_summary, read_manifest

    out, trained = trained_dir(cfg)
    manifest = read_manifest(out)
    copy = atomic_write_text(Path(cfg.run_dir) / MANIFEST, (out / MANIFEST).read_text())
    if not trained:  # a fresh run printed its summary as it finished
        print_summary(manifest["model"], manifest)
    print(f"train: {'' if trained else 'cached, '}{out} (manifest: {copy})")
    print(json.dumps({k: manifest[k] for k in ("seed", "steps", "tokens_seen", "final_train_loss",
                                               "heldout_ppl_bf16_weights", "uniform_ppl", "wall_s")}))
    return 0
