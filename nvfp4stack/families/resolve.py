"""Where a model's config.json and weights are: a shipped descriptor, a local factory, or a path."""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.checkpoint.location import checkpoint_dir
from nvfp4stack.families.registry import get_factory, plugins, shape_twins


def cache_root(cache_dir: str) -> Path:
    return Path(cache_dir).expanduser()


def model_dir(model, cache_dir: str) -> Path | None:
    """The checkpoint directory of ``model`` (building a factory model on first use), or None
    for a weight-free descriptor."""
    if model.path:
        return checkpoint_dir("model.path", model.path, needs_config=False)
    if model.factory:
        return get_factory(model.factory)[1](cache_root(cache_dir), model.source_format)
    return None


def header_dir(model, cache_dir: str) -> Path | None:
    """A checkpoint with ``model``'s tensor headers and config.json: :func:`model_dir`, except that a
    trained factory answers with its random twin (built in seconds) unless ``model.path`` is set."""
    # The twin: the same tensor names, shapes, dtypes and config.json, only the values differ. Planning
    # reads nothing else, so `plan` (and every command's planning step, e.g. `serve engine.dry_run=true`
    # in a scratch cache) never waits for a training run.
    twin = shape_twins().get(model.factory)
    if twin is not None and not model.path:
        return get_factory(twin)[1](cache_root(cache_dir), model.source_format)
    return model_dir(model, cache_dir)


def descriptor_files() -> dict[str, Path]:
    """Weight-free config.json descriptors by name: the plug-ins' shared descriptors/ and each family's."""
    shared = Path(plugins().DESCRIPTORS)
    found = sorted(shared.glob("*.json")) + sorted(shared.parent.glob("*/descriptors/*.json"))
    out: dict[str, Path] = {}
    for p in found:
        if p.stem in out:
            raise ValueError(f"model.descriptor {p.stem!r} is defined twice, in {out[p.stem]} and {p}; expected one "
                             "file per name. Fix: rename one of them")
        out[p.stem] = p
    return out


def config_json_path(model, cache_dir: str) -> Path:
    if model.descriptor and not model.path:
        known = descriptor_files()
        if model.descriptor not in known:
            raise FileNotFoundError(f"model.descriptor={model.descriptor!r} not found; valid: {', '.join(sorted(known))}")
        return known[model.descriptor]
    d = header_dir(model, cache_dir)
    if d is None:
        raise ValueError(f"model: found model.path={model.path!r}, model.factory={model.factory!r}, "
                         f"model.descriptor={model.descriptor!r}; expected one of them to name the model's config.json. "
                         "Fix: set model.path=<checkpoint dir>, a model.factory, or a model.descriptor")
    if model.path:  # an error naming the key, not a bare [Errno 2] .../config.json
        checkpoint_dir("model.path", model.path)
    return d / "config.json"


def with_num_layers(hf: dict, num_layers: int | None) -> dict:
    """``hf`` (a config.json) cut to its first ``num_layers`` decoder layers, full width: per-layer lists
    keep those layers' entries and any beyond the original depth (an MTP block's), counts of leading
    special layers are capped. ``None`` or the model's own depth returns ``hf`` as it is."""
    n0 = hf.get("num_hidden_layers")
    if num_layers is None or num_layers == n0:
        return hf
    if not isinstance(n0, int) or num_layers > n0:
        raise ValueError(f"model.num_layers={num_layers}: expected at most the model's num_hidden_layers ({n0}); "
                         "a descriptor can be made shallower, not deeper. Fix: model.num_layers<={n0}")
    out = dict(hf, num_hidden_layers=num_layers)
    for key, value in hf.items():   # compress_ratios, layer_types, mlp_layer_types, ...
        if isinstance(value, list) and len(value) >= n0 and key != "architectures":
            out[key] = value[:num_layers] + value[n0:]
    for key in ("num_hash_layers", "first_k_dense_replace"):
        if isinstance(hf.get(key), int):
            out[key] = min(hf[key], num_layers)
    return out
