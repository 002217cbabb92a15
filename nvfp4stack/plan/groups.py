"""Where a plan's tensor groups come from: a checkpoint's headers (or the family's config.json spec)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from nvfp4stack.checkpoint.safetensors_io import check_inside, read_header
from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.families.roles import SupportsRoles
from nvfp4stack.formats.codec import Entry, group_suffixes
from nvfp4stack.plan.roles import is_mtp, non_matrix_roles, role_of
from nvfp4stack.schemes import Scheme


def group_name(tensor_name: str) -> tuple[str, str]:
    """Split a stored tensor name into (group, suffix): 'a.w1.weight_scale' -> ('a.w1', 'weight_scale');
    the suffixes are the storage codecs' (native, modelopt, HF-FP8 layouts, and any registered codec)."""
    for suf in group_suffixes():
        if tensor_name.endswith("." + suf):
            return tensor_name[: -len(suf) - 1], suf
    return tensor_name, ""


def checkpoint_tensors(ckpt: Path) -> dict[str, dict]:
    """name -> {'dtype', 'shape', 'file'} for every tensor of a (sharded) safetensors checkpoint."""
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{ckpt}: no *.safetensors files; point model.path / checkpoint at a checkpoint dir")
    out: dict[str, dict] = {}
    for f in files:
        check_inside(ckpt, f, f.name)   # a checkpoint is untrusted: no header read through a link out of it
        for name, info in read_header(f)[0].items():
            out[name] = {"dtype": info["dtype"], "shape": tuple(info["shape"]), "file": f.name}
    return out


def sniff_scheme(suffixes: dict[str, dict]) -> Scheme:
    """The stored format of one group from its tensors' header entries (never from a dtype alone);
    a group no storage codec claims passes through as stored."""
    entries = {s: Entry(i["dtype"], tuple(i["shape"])) for s, i in suffixes.items()}
    return Scheme.detect(entries) or Scheme.PASSTHROUGH


def groups_from_checkpoint(ckpt: Path, num_hidden_layers: int | None,
                           family: SupportsRoles | None = None) -> Iterator[tuple[TensorGroup, Scheme]]:
    """Tensor groups of a real checkpoint, with the format each is stored in; roles by ``family``'s
    names (None: by the first family that knows a name)."""
    return groups_from_headers(checkpoint_tensors(ckpt), num_hidden_layers, family)


def groups_from_headers(tensors: dict[str, dict], num_hidden_layers: int | None,
                        family: SupportsRoles | None = None) -> Iterator[tuple[TensorGroup, Scheme]]:
    """``groups_from_checkpoint`` on header entries (name -> {'dtype': safetensors dtype, 'shape'}) that a
    checkpoint would hold: a family that knows its tensors from config.json alone plans through here."""
    non_matrix = non_matrix_roles(family)
    by_group: dict[str, dict[str, dict]] = {}
    for name, info in tensors.items():
        g, suf = group_name(name)
        by_group.setdefault(g, {})[suf or "weight"] = info
    for g, sufs in sorted(by_group.items()):
        w = sufs.get("weight") or next(iter(sufs.values()))
        role = role_of(g, family) or "unknown"
        shape = tuple(w["shape"])
        scheme = sniff_scheme(sufs)
        shape = scheme.codec.logical_shape(shape)  # packed formats: two values per byte
        matrix = len(shape) >= 2 and role not in non_matrix and w["dtype"] not in ("I64", "I32")
        dtype = {"F32": "f32", "I64": "i64", "I32": "i32"}.get(w["dtype"], "bf16")
        yield TensorGroup(g, shape, role, is_mtp(g, num_hidden_layers, family), dtype, matrix), scheme


def load_config_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: config.json not found; the model dir must hold the HF config.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: config.json is not valid JSON ({e}); fix or regenerate it") from None
