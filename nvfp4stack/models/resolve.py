"""Where a model's config.json and weights are: a shipped descriptor, a local factory, or a path."""
from __future__ import annotations

from pathlib import Path

DESCRIPTORS = Path(__file__).resolve().parent / "descriptors"


def _tiny_dsv4(cache: Path, source_format: str, trained: bool = False) -> Path:
    from nvfp4stack.models.tiny_dsv4 import build_tiny_dsv4, layout_dir

    if trained:
        from nvfp4stack.train.config import TrainConfig
        from nvfp4stack.train.models import train_tiny_dsv4

        root = train_tiny_dsv4(cache / "models", TrainConfig())
    else:
        root = build_tiny_dsv4(cache / "models")
    return layout_dir(root, "release" if source_format == "official" else "bf16")


def _tiny_v3(cache: Path, source_format: str, trained: bool = True) -> Path:
    from nvfp4stack.models.tiny_v3 import ensure_tiny_v3

    return ensure_tiny_v3(cache / "tiny_v3", trained=trained)


# factory name -> builder(cache root, source_format) -> checkpoint dir (built once, then cached).
# tiny_v3 (what `serve` runs) is trained on the stdlib corpus on first use (the default budget of
# conf/train/default.yaml); *_random are the seeded random weights, for shapes and loaders. tiny_dsv4
# stays random (most tests build on it); tiny_dsv4_trained is the same model trained.
FACTORIES = {
    "tiny_dsv4": _tiny_dsv4,
    "tiny_dsv4_trained": lambda cache, fmt: _tiny_dsv4(cache, fmt, trained=True),
    "tiny_v3": _tiny_v3,
    "tiny_v3_random": lambda cache, fmt: _tiny_v3(cache, fmt, trained=False),
}


def cache_root(cache_dir: str) -> Path:
    return Path(cache_dir).expanduser()


def model_dir(model, cache_dir: str) -> Path | None:
    """The checkpoint directory of ``model`` (building a factory model on first use), or None
    for a weight-free descriptor."""
    if model.path:
        p = Path(model.path).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(f"model.path={model.path!r} is not a directory; point it at a checkpoint dir")
        return p
    if model.factory:
        if model.factory not in FACTORIES:
            raise ValueError(f"model.factory={model.factory!r} is unknown; valid: {', '.join(FACTORIES)}")
        return FACTORIES[model.factory](cache_root(cache_dir), model.source_format)
    return None


# Trained factory -> its seeded random twin: the same tensor names, shapes, dtypes and config.json,
# only the values differ. Planning reads nothing else, so `plan` (and every command's planning step,
# e.g. `serve engine.dry_run=true` in a scratch cache) never waits for a training run.
SHAPE_TWIN = {"tiny_v3": "tiny_v3_random", "tiny_dsv4_trained": "tiny_dsv4"}


def header_dir(model, cache_dir: str) -> Path | None:
    """A checkpoint with ``model``'s tensor headers and config.json: :func:`model_dir`, except that a
    trained factory answers with its random twin (built in seconds) unless ``model.path`` is set."""
    if model.factory in SHAPE_TWIN and not model.path:
        return FACTORIES[SHAPE_TWIN[model.factory]](cache_root(cache_dir), model.source_format)
    return model_dir(model, cache_dir)


def config_json_path(model, cache_dir: str) -> Path:
    if model.descriptor and not model.path:
        p = DESCRIPTORS / f"{model.descriptor}.json"
        if not p.exists():
            valid = sorted(x.stem for x in DESCRIPTORS.glob("*.json"))
            raise FileNotFoundError(f"model.descriptor={model.descriptor!r} not found; valid: {', '.join(valid)}")
        return p
    d = header_dir(model, cache_dir)
    assert d is not None
    return d / "config.json"
