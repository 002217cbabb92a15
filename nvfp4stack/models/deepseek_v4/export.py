"""Export in modelopt's DeepSeek-V4 layout: the release checkpoint with NVFP4 routed experts.

Mirrors modelopt's examples/deepseek/deepseek_v4/quantize_to_nvfp4.py (``convert_shard``,
``_build_w13_weight_amax_overrides``, ``_load_merged_amax``, ``_rewrite_config_json``,
``_write_index_and_manifest``), which is not part of the pip package: every tensor of the base
(release-format) checkpoint is copied byte for byte except the routed experts, whose
``.weight`` / ``.scale`` (MXFP4) pair becomes ``.weight`` u8 [N, K/2], ``.weight_scale`` e4m3
[N, K/16], ``.weight_scale_2`` and ``.input_scale`` f32 scalars. w1 and w3 share both global scales
(their max). Expert weights come from the BF16 source when given (more accurate than re-quantizing
the MXFP4 values), else from the base's MXFP4 dequantized to BF16 like modelopt does.
"""
from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import torch

from nvfp4stack.checkpoint.safetensors_io import (
    INDEX_NAME,
    ShardedReader,
    ShardWriter,
    write_index,
)
from nvfp4stack.formats.mxfp4 import as_ue8m0_bytes, dequantize_mxfp4
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, quantize_nvfp4
from nvfp4stack.io_atomic import atomic_dir
from nvfp4stack.models.deepseek_v4.config_fixups import moe_nvfp4

EXPERT_WEIGHT = re.compile(r"^(?P<block>(?:mtp\.\d+|layers\.\d+))\.ffn\.experts\.(?P<eid>\d+)\.(?P<proj>w[123])\.weight$")
NVFP4_SUFFIXES = (".weight", ".weight_scale", ".weight_scale_2", ".input_scale")
PRODUCER = {"name": "modelopt", "version": "dsv4-nvfp4-experts"}
# modelopt's DSV4 exporter (_write_index_and_manifest) lists these as unquantized.
EXCLUDE_MODULES = [
    "*.attn.*", "*.attn_norm.*", "*.ffn.shared_experts.*", "*.ffn.gate.*", "*.ffn_norm.*",
    "embed.weight", "head.weight", "*.hc_*", "*.h_proj.*", "*.e_proj.*", "*.enorm.*", "*.hnorm.*",
    "mtp.*.norm.*", "norm.weight",
]


def _scale_2(amax: torch.Tensor) -> torch.Tensor:
    """``amax / (6 * 448)`` as a 0-dim float32 (modelopt ``_amax_to_nvfp4_scale_2``)."""
    return (amax.float() / GLOBAL_DIVISOR).to(torch.float32).reshape(())


def expert_bf16(name: str, base: ShardedReader, source: ShardedReader | None) -> torch.Tensor:
    """BF16 value of one routed-expert weight: from the BF16 source, else the base's MXFP4."""
    if source is not None and name in source:
        return source.get(name).to(torch.bfloat16)
    w = base.get(name)
    if w.dtype == torch.bfloat16:
        return w
    scale_name = name[: -len(".weight")] + ".scale"
    if scale_name not in base:
        raise KeyError(f"{name}: stored as {w.dtype} without a {scale_name}; expected BF16 or MXFP4 "
                       "(packed E2M1 + UE8M0 .scale) routed experts in the base checkpoint")
    return dequantize_mxfp4(w.view(torch.uint8), as_ue8m0_bytes(base.get(scale_name), scale_name), torch.bfloat16)


def merge_amax(amax: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """w1/w3 amax fused to their max (weight and input); per-projection input fallbacks."""
    merged = {k: v.float().reshape(()) for k, v in amax.items()}
    for which in ("weight", "input"):
        for k in list(merged):
            if k.endswith(f"w1_{which}_quantizer._amax"):
                k3 = k.replace(f"w1_{which}", f"w3_{which}")
                if k3 in merged:
                    merged[k] = merged[k3] = torch.maximum(merged[k], merged[k3])
    by_proj: dict[str, list[torch.Tensor]] = defaultdict(list)
    for k, v in merged.items():
        m = re.search(r"\.(w[123])_input_quantizer\._amax$", k)
        if m:
            by_proj[m.group(1)].append(v)
    fallback = {p: torch.stack(v).max() for p, v in by_proj.items()}
    return merged, fallback


def quantize_expert(bf16: torch.Tensor, weight_amax: torch.Tensor, input_amax: torch.Tensor,
                    name: str) -> dict[str, torch.Tensor]:
    """One routed-expert projection -> its four NVFP4 tensors (suffix -> tensor)."""
    s2 = _scale_2(weight_amax)
    q = quantize_nvfp4(bf16, s2, name=name)
    return {".weight": q.data, ".weight_scale": q.scale, ".weight_scale_2": s2,
            ".input_scale": _scale_2(input_amax)}


def _aux_files(base_dir: Path) -> list[Path]:
    return sorted(p for p in base_dir.iterdir() if p.is_file() and p.suffix != ".safetensors"
                  and p.name not in (INDEX_NAME, "config.json", "hf_quant_config.json"))


class CalibratedExperts:
    """Routed-expert NVFP4 tensors from calibrated amax (the modelopt path).

    Weight amax: calibrated, else synthesized from the weight (modelopt does the same for experts
    that saw no tokens); w1/w3 share max(w1, w3). Input amax: calibrated, else the max over the
    calibrated experts of the same projection.
    """

    def __init__(self, base: ShardedReader, source: ShardedReader | None, amax: dict[str, torch.Tensor]):
        self.base, self.source = base, source
        self.merged, self.fallback = merge_amax(amax)
        self.stats: dict = defaultdict(int)
        self._weight_amax: dict[str, torch.Tensor] = {}

    def _own_weight_amax(self, path: str) -> torch.Tensor:
        a = self.merged.get(f"{path}_weight_quantizer._amax")
        if a is None:
            a = expert_bf16(path + ".weight", self.base, self.source).abs().amax().float()
            self.stats["weight_amax_synthesized"] += 1
        return a

    def weight_amax(self, path: str) -> torch.Tensor:
        if path not in self._weight_amax:
            head, proj = path.rsplit(".", 1)
            if proj in ("w1", "w3") and f"{head}.w1.weight" in self.base and f"{head}.w3.weight" in self.base:
                shared = torch.maximum(self._own_weight_amax(f"{head}.w1"), self._own_weight_amax(f"{head}.w3"))
                self._weight_amax[f"{head}.w1"] = self._weight_amax[f"{head}.w3"] = shared
            else:
                self._weight_amax[path] = self._own_weight_amax(path)
        return self._weight_amax[path]

    def input_amax(self, path: str) -> torch.Tensor:
        a = self.merged.get(f"{path}_input_quantizer._amax")
        if a is None:
            proj = path.rsplit(".", 1)[1]
            a = self.fallback.get(proj)
            self.stats["input_amax_fallback"] += 1
            if a is None:
                raise RuntimeError(f"{path}: no input amax and no calibrated {proj} to fall back on; "
                                   "recalibrate (quantize.method=modelopt) or set quantize.cast_input_amax")
        return a

    def __call__(self, path: str) -> dict[str, torch.Tensor]:
        self.stats["experts_quantized"] += 1
        return quantize_expert(expert_bf16(path + ".weight", self.base, self.source),
                               self.weight_amax(path), self.input_amax(path), path)


def export_dsv4(base_dir: str | Path, out_dir: str | Path, make_expert, *, quantize_mtp: bool = False) -> None:
    """Write the modelopt-DSV4-layout checkpoint to ``out_dir`` atomically.

    ``make_expert(path)`` returns one routed-expert projection's NVFP4 tensors keyed by suffix
    (``.weight``, ``.weight_scale``, ``.weight_scale_2``, ``.input_scale``); every other tensor of
    ``base_dir`` is copied byte for byte, shard by shard, in storage order (so re-running gives
    byte-identical shards).
    """
    from tqdm import tqdm

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base = ShardedReader(base_dir)
    names = base.names()
    experts = [n for n in names if EXPERT_WEIGHT.match(n) and (quantize_mtp or not n.startswith("mtp."))]
    expert_set = set(experts)
    drop = {n[: -len(".weight")] + ".scale" for n in experts}

    weight_map: dict[str, str] = {}
    total = 0
    with atomic_dir(out_dir) as tmp:
        by_file: dict[Path, list[str]] = defaultdict(list)
        for n in names:
            by_file[base.infos[n].file].append(n)
        bar = tqdm(total=len(names), desc="export", unit="tensor")
        for f, fnames in by_file.items():
            w = ShardWriter(tmp / f.name)
            for n in fnames:
                bar.update(1)
                if n in drop:
                    continue
                if n in expert_set:
                    path = n[: -len(".weight")]
                    group = make_expert(path)
                    for suf in NVFP4_SUFFIXES:
                        w.add(path + suf, group[suf])
                else:
                    w.add_raw(n, base.infos[n], base.iter_raw(n))
            w.close()
            for n in w.names():
                weight_map[n] = f.name
            total += w.nbytes
        bar.close()
        write_index(tmp, weight_map, total)
        _write_manifest(tmp, sorted(n[: -len(".weight")] for n in experts))
        cfg = moe_nvfp4(json.loads((base_dir / "config.json").read_text()))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for p in _aux_files(base_dir):
            shutil.copy2(p, tmp / p.name)


def _write_manifest(out: Path, quantized_layers: list[str]) -> None:
    """hf_quant_config.json as modelopt's DSV4 exporter writes it."""
    cfg = {
        "producer": PRODUCER,
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "quantized_layers": {n: {"quant_algo": "NVFP4", "group_size": 16} for n in quantized_layers},
            "exclude_modules": EXCLUDE_MODULES,
        },
    }
    (out / "hf_quant_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
