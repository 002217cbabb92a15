"""Where a model's config.json and weights are: a shipped descriptor, a local factory, or a path."""
from __future__ import annotations

from pathlib import Path

DESCRIPTORS = Path(__file__).resolve().parent / "descriptors"


def _tiny_dsv4(cache: Path, source_format: str) -> Path:
    from nvfp4stack.models.tiny_dsv4 import build_tiny_dsv4, layout_dir

    root = build_tiny_dsv4(cache / "models")
    return layout_dir(root, "release" if source_format == "official" else "bf16")


def _tiny_v3(cache: Path, source_format: str) -> Path:
    from nvfp4stack.models.tiny_v3 import ensure_tiny_v3

    return ensure_tiny_v3(cache / "tiny_v3")


# factory name -> builder(cache root, source_format) -> checkpoint dir (built once, then cached)
FACTORIES = {"tiny_dsv4": _tiny_dsv4, "tiny_v3": _tiny_v3}


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


def config_json_path(model, cache_dir: str) -> Path:
    if model.descriptor and not model.path:
        p = DESCRIPTORS / f"{model.descriptor}.json"
        if not p.exists():
            valid = sorted(x.stem for x in DESCRIPTORS.glob("*.json"))
            raise FileNotFoundError(f"model.descriptor={model.descriptor!r} not found; valid: {', '.join(valid)}")
        return p
    d = model_dir(model, cache_dir)
    assert d is not None
    return d / "config.json"
