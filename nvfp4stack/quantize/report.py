"""Quantize run report: per-role relative weight error vs the BF16 source, and bytes before/after."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.families.registry import get_family
from nvfp4stack.families.roles import SupportsRoles
from nvfp4stack.formats.codec import Entry, detect, group_suffixes
from nvfp4stack.io_atomic import atomic_write_text
from nvfp4stack.plan.roles import is_mtp, role_of


def _stored_group(reader: ShardedReader, weight_name: str):
    """(codec or None, suffix -> Entry) of the group one stored ``.weight`` belongs to."""
    base = weight_name[: -len(".weight")]
    entries = {suf: Entry(info.dtype, tuple(info.shape)) for suf in group_suffixes()
               if (info := reader.infos.get(f"{base}.{suf}")) is not None}
    return detect(entries), entries


def stored_format(reader: ShardedReader, weight_name: str) -> str:
    """The storage codec's name of one stored ``.weight`` ('nvfp4', 'fp8_block', 'mxfp4', ...), or
    the plain dtype of an unquantized one."""
    codec, entries = _stored_group(reader, weight_name)
    return codec.describe(entries) if codec is not None else reader.infos[weight_name].dtype.lower()


def dequantize_group(reader: ShardedReader, weight_name: str) -> torch.Tensor:
    """The float32 value of one stored ``.weight``, whatever its format (its storage codec decodes it)."""
    codec, entries = _stored_group(reader, weight_name)
    if codec is None:
        return reader.get(weight_name).float()
    base = weight_name[: -len(".weight")]
    return codec.dequantize({suf: reader.get(f"{base}.{suf}") for suf in entries if suf in codec.suffixes}, base)


def _group_key(name: str, family: SupportsRoles | None = None, num_hidden_layers: int | None = None) -> str:
    """The report group of one tensor: its role, under ``mtp.`` for the multi-token-prediction block
    (``plan.roles.is_mtp``: the family's MTP module, or decoder layers past ``num_hidden_layers``)."""
    role = role_of(name, family) or "other"
    return f"mtp.{role}" if is_mtp(name, num_hidden_layers, family) and not role.startswith("mtp.") else role


def weight_errors(out: ShardedReader, reference: ShardedReader, family: SupportsRoles | None = None,
                  num_hidden_layers: int | None = None) -> dict[str, dict]:
    """Per role group (``family``'s role names; MTP tensors apart, see ``_group_key``): aggregate
    relative Frobenius error, worst tensor, formats seen."""
    acc: dict[str, dict] = defaultdict(lambda: {"err2": 0.0, "ref2": 0.0, "max_rel": 0.0, "worst": None,
                                                "tensors": 0, "formats": set()})
    for name in out.names():
        if not name.endswith(".weight") or name not in reference:
            continue
        ref = reference.get(name).float()
        got = dequantize_group(out, name)
        if got.shape != ref.shape:
            raise ValueError(f"{name}: output decodes to {tuple(got.shape)}, the BF16 source has "
                             f"{tuple(ref.shape)}; the output is not the same model")
        e2, r2 = float((got - ref).pow(2).sum()), float(ref.pow(2).sum())
        a = acc[_group_key(name, family, num_hidden_layers)]
        a["err2"] += e2
        a["ref2"] += r2
        a["tensors"] += 1
        a["formats"].add(stored_format(out, name))
        rel = math.sqrt(e2 / r2) if r2 else 0.0
        if rel >= a["max_rel"]:
            a["max_rel"], a["worst"] = rel, name
    return {k: {"rel_error": math.sqrt(v["err2"] / v["ref2"]) if v["ref2"] else 0.0,
                "max_tensor_rel_error": v["max_rel"], "worst_tensor": v["worst"],
                "tensors": v["tensors"], "formats": sorted(v["formats"])}
            for k, v in sorted(acc.items())}


def bytes_by_group(reader: ShardedReader, family: SupportsRoles | None = None,
                   num_hidden_layers: int | None = None) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for name, info in reader.infos.items():
        out[_group_key(name, family, num_hidden_layers)] += info.nbytes
    return dict(sorted(out.items()))


def _num_hidden_layers(ckpt: Path) -> int | None:
    """config.json's ``num_hidden_layers`` of a checkpoint dir, None without one."""
    try:
        n = json.loads((ckpt / "config.json").read_text()).get("num_hidden_layers")
    except (OSError, ValueError):
        return None
    return int(n) if n is not None else None


def write_report(run_dir: str | Path, *, method: str, out_dir: str | Path, before_dir: str | Path,
                 reference_dir: str | Path | None, extra: dict | None = None, family: str | None = None) -> dict:
    """Build the report, write quantize_report.json and .md into ``run_dir``; return it. ``family``:
    the model family whose role names group the tensors (None: any family's); the MTP layers are told
    apart with the output's config.json ``num_hidden_layers``."""
    family = get_family(family, "quantize report family") if family else None
    out, before = ShardedReader(out_dir), ShardedReader(before_dir)
    reference = ShardedReader(reference_dir) if reference_dir else None
    layers = _num_hidden_layers(Path(out_dir))
    report = {
        "method": method, "output": str(out_dir), "before": str(before_dir),
        "reference_bf16": str(reference_dir) if reference_dir else None,
        "bytes_before": before.total_bytes, "bytes_after": out.total_bytes,
        "bytes_bf16_source": reference.total_bytes if reference else None,
        "bytes_by_group_before": bytes_by_group(before, family, layers),
        "bytes_by_group_after": bytes_by_group(out, family, layers),
        "weight_error_vs_bf16": weight_errors(out, reference, family, layers) if reference else {},
        "before_error_vs_bf16": weight_errors(before, reference, family, layers) if reference else {},
        **(extra or {}),
    }
    run_dir = Path(run_dir)
    atomic_write_text(run_dir / "quantize_report.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    lines = [f"# quantize report ({method})", "", f"output: {out_dir}",
             f"bytes: {report['bytes_before']:,} -> {report['bytes_after']:,}", "",
             "| group | formats | rel error vs BF16 | before | worst tensor |", "|---|---|---|---|---|"]
    for g, v in report["weight_error_vs_bf16"].items():
        b = report["before_error_vs_bf16"].get(g, {}).get("rel_error")
        lines.append(f"| {g} | {','.join(v['formats'])} | {v['rel_error']:.4f} | "
                     f"{'' if b is None else f'{b:.4f}'} | {v['worst_tensor']} |")
    atomic_write_text(run_dir / "quantize_report.md", "\n".join(lines) + "\n")
    return report
