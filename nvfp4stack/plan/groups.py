"""Where a plan's tensor groups come from: a checkpoint's headers (or the family's config.json spec)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from nvfp4stack.checkpoint.safetensors_io import check_inside, read_header
from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.families.roles import SupportsRoles
from nvfp4stack.plan.roles import is_mtp, non_matrix_roles, role_of
from nvfp4stack.schemes import Scheme

# Stored-tensor suffixes that belong to one logical weight (native, modelopt, HF-FP8 layouts).
GROUP_SUFFIXES = (".weight_scale_2", ".weight_scale_inv", ".weight_scale", ".input_scale",
                  ".weight", ".scales", ".scale")


def group_name(tensor_name: str) -> tuple[str, str]:
    """Split a stored tensor name into (group, suffix): 'a.w1.weight_scale' -> ('a.w1', 'weight_scale')."""
    for suf in GROUP_SUFFIXES:
        if tensor_name.endswith(suf):
            return tensor_name[: -len(suf)], suf[1:]
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


_DTYPE_SCHEME = {"BF16": Scheme.BF16, "F16": Scheme.BF16, "F32": Scheme.BF16}


def sniff_scheme(suffixes: dict[str, dict]) -> Scheme:
    """The stored format of one group from its tensors' dtypes (never from a dtype alone)."""
    w = suffixes.get("weight")
    if "weight_scale_2" in suffixes and w is not None and w["dtype"] == "U8":
        return Scheme.NVFP4
    if w is not None and w["dtype"] in ("U8", "I8") and ("scales" in suffixes or "scale" in suffixes):
        return Scheme.MXFP4
    if w is not None and w["dtype"].startswith("F8"):
        return Scheme.FP8_BLOCK
    if w is not None:
        return _DTYPE_SCHEME.get(w["dtype"], Scheme.PASSTHROUGH)
    return Scheme.PASSTHROUGH


def groups_from_checkpoint(ckpt: Path, num_hidden_layers: int | None,
                           family: SupportsRoles | None = None) -> Iterator[tuple[TensorGroup, Scheme]]:
    """Tensor groups of a real checkpoint, with the format each is stored in; roles by ``family``'s
    names (None: by the first family that knows a name)."""
    non_matrix = non_matrix_roles(family)
    by_group: dict[str, dict[str, dict]] = {}
    for name, info in checkpoint_tensors(ckpt).items():
        g, suf = group_name(name)
        by_group.setdefault(g, {})[suf or "weight"] = info
    for g, sufs in sorted(by_group.items()):
        w = sufs.get("weight") or next(iter(sufs.values()))
        role = role_of(g, family) or "unknown"
        shape = tuple(w["shape"])
        scheme = sniff_scheme(sufs)
        if scheme in (Scheme.NVFP4, Scheme.MXFP4):
            shape = (*shape[:-1], shape[-1] * 2)  # two E2M1 values per byte
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
