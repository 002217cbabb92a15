"""Plant one known fault in a copy of a checkpoint: the doctor's and the load check's test inputs.

The source directory is never touched. Shards are rewritten tensor by tensor through
``safetensors_io`` (streamed, bounded memory), the index is rewritten to match, other files are
copied. Each fault is one function of (name -> tensor) so a test states exactly what it planted.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch

from nvfp4stack.checkpoint.safetensors_io import INDEX_NAME, ShardedReader, ShardWriter, write_index

# edit(name, tensor) -> list of (new name, new tensor); [] removes the tensor.
Edit = Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]]


def copy_with_edit(src: str | Path, dst: str | Path, edit: Edit, only: set[str] | None = None) -> Path:
    """Copy checkpoint ``src`` to ``dst`` applying ``edit`` to the tensors named in ``only``
    (all when None); untouched tensors are copied byte for byte."""
    src, dst = Path(src), Path(dst)
    reader = ShardedReader(src)
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and p.suffix != ".safetensors" and p.name != INDEX_NAME:
            shutil.copy2(p, dst / p.name)
    weight_map: dict[str, str] = {}
    total = 0
    for f in reader.files:
        w = ShardWriter(dst / f.name)
        for name in [n for n in reader.names() if reader.infos[n].file == f]:
            if only is not None and name not in only:
                w.add_raw(name, reader.infos[name], reader.iter_raw(name))
                continue
            for new_name, t in edit(name, reader.get(name)):
                w.add(new_name, t)
        w.close()
        weight_map.update({n: f.name for n in w.names()})
        total += w.nbytes
    if (src / INDEX_NAME).exists():
        write_index(dst, weight_map, total)
    return dst


def remove_tensor(src, dst, name: str) -> Path:
    return copy_with_edit(src, dst, lambda n, t: [], only={name})


def rename_tensor(src, dst, name: str, new_name: str) -> Path:
    return copy_with_edit(src, dst, lambda n, t: [(new_name, t)], only={name})


def replace_tensor(src, dst, name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    return copy_with_edit(src, dst, lambda n, t: [(n, fn(t))], only={name})


def edit_config(src: str | Path, dst: str | Path, fn: Callable[[dict], dict]) -> Path:
    """Copy ``src`` (shards hard-linked where possible) with config.json rewritten by ``fn``."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and p.name != "config.json":
            try:
                (dst / p.name).hardlink_to(p)
            except OSError:
                shutil.copy2(p, dst / p.name)
    cfg = fn(json.loads((src / "config.json").read_text()))
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def tiny_dsv4_layouts(cache_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """The tiny DeepSeek-V4 in every layout the project produces, built once under ``cache_dir``.

    ``bf16``/``release``/``hf`` come from ``build_tiny_dsv4``; ``modelopt`` is modelopt's DSV4 layout
    written by the quantize stage's ``export_dsv4`` with weight amax taken from the weights and a
    seeded per-expert activation amax (no calibration run: the load check tests names, shapes and
    dtypes); ``cast`` (MXFP4 -> NVFP4, ``CastExperts``) is added when its converters are registered.
    """
    from nvfp4stack.models.deepseek_v4.export import EXPERT_WEIGHT, CalibratedExperts, export_dsv4
    from nvfp4stack.models.deepseek_v4.tiny import build_tiny_dsv4

    root = build_tiny_dsv4(cache_dir, seed=seed)
    out = {name: root / name for name in ("bf16", "release", "hf")}
    base, source = ShardedReader(root / "release"), ShardedReader(root / "bf16")
    g = torch.Generator().manual_seed(seed + 1)
    input_amax = {n[: -len(".weight")] + "_input_quantizer._amax": 1.0 + 5.0 * torch.rand((), generator=g)
                  for n in base.names() if EXPERT_WEIGHT.match(n)}
    out["modelopt"] = root / "modelopt"
    if not (out["modelopt"] / "config.json").exists():
        export_dsv4(root / "release", out["modelopt"], CalibratedExperts(base, source, input_amax))
    try:
        from nvfp4stack.models.deepseek_v4.cast import CastExperts

        cast = root / "cast"
        if not (cast / "config.json").exists():
            export_dsv4(root / "release", cast, CastExperts(base, lambda path: input_amax[f"{path}_input_quantizer._amax"]))
        out["cast"] = cast
    except KeyError:
        pass  # mxfp4_to_nvfp4 / w13_shared_global_scale converters not registered yet
    return out


def vllm_ready_config(src: str | Path, dst: str | Path) -> Path:
    """A copy whose config.json drops transformers' ``mlp_layer_types`` (vLLM's config parsing
    rejects 'hash_moe'/'moe'; vLLM reads ``num_hash_layers``). tiny_dsv4 SPEC_VERSION 1 wrote it;
    version 2 no longer does, so this is a no-op there (kept for older cached builds)."""
    return edit_config(src, dst, lambda c: {k: v for k, v in c.items() if k != "mlp_layer_types"})
