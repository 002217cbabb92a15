"""What modelopt's DeepSeek-V4 exporter writes, as a spec: keys, dtypes, shapes, manifest, config.

Written from NVIDIA Model-Optimizer ``examples/deepseek/deepseek_v4/quantize_to_nvfp4.py`` (not in the
pip package; read from the public repository):

- ``_EXPERT_WEIGHT_RE = ^(?:mtp\\.\\d+|layers\\.\\d+)\\.ffn\\.experts\\.\\d+\\.w[123]\\.weight$`` selects the
  routed experts, MTP included;
- ``convert_shard``: for each such ``<path>.weight`` the paired ``<path>.scale`` is dropped and the
  weight becomes ``NVFP4QTensor.quantize(bf16, 16, None, weight_scale_2)``: ``<path>.weight`` packed
  uint8 ``(out, in//2)``, ``<path>.weight_scale`` float8_e4m3fn ``(out, in//16)``,
  ``<path>.weight_scale_2`` and ``<path>.input_scale`` float32 0-dim; every other key passes through
  unchanged; w1/w3 share weight and input amax (``_fuse_w1_w3_amax``,
  ``_build_w13_weight_amax_overrides``);
- ``_write_index_and_manifest``: hf_quant_config.json with ``quant_algo: MIXED_PRECISION`` and
  ``quantized_layers = {<path>: {quant_algo: NVFP4, group_size: 16}}``;
- ``_rewrite_config_json``: ``quantization_config.quant_method = fp8``, ``moe_quant_algo = NVFP4``,
  ``activation_scheme`` default ``dynamic``, ``weight_block_size`` default ``[128, 128]``.

The spec is computed from the *source* checkpoint's header alone, never from nvfp4stack's writer.
"""
from __future__ import annotations

import re

EXPORTER = "NVIDIA/Model-Optimizer examples/deepseek/deepseek_v4/quantize_to_nvfp4.py"
EXPERT_WEIGHT_RE = re.compile(r"^(?:mtp\.\d+|layers\.\d+)\.ffn\.experts\.\d+\.w[123]\.weight$")


def _logical_in(dtype: str, shape: tuple) -> int:
    """Logical K of a routed-expert weight: packed E2M1 (I8/U8) stores two values per byte."""
    return shape[1] * 2 if dtype in ("I8", "U8") else shape[1]


def expected_tensors(source: dict[str, tuple[str, tuple]], quantize_mtp: bool = True) -> dict[str, tuple[str, tuple]]:
    """{name: (safetensors dtype, shape)} of the export, from the source's {name: (dtype, shape)}.

    ``quantize_mtp=True`` is the exporter's behaviour; False describes nvfp4stack's default
    ``quantize.mtp=copy`` (MTP experts left as in the source).
    """
    out: dict[str, tuple[str, tuple]] = {}
    experts = {n for n in source if EXPERT_WEIGHT_RE.match(n) and (quantize_mtp or not n.startswith("mtp."))}
    dropped = {n[: -len(".weight")] + ".scale" for n in experts}
    for name, (dtype, shape) in source.items():
        if name in dropped:
            continue
        if name not in experts:
            out[name] = (dtype, tuple(shape))
            continue
        path, (n_out, k) = name[: -len(".weight")], (shape[0], _logical_in(dtype, shape))
        out[name] = ("U8", (n_out, k // 2))
        out[path + ".weight_scale"] = ("F8_E4M3", (n_out, k // 16))
        out[path + ".weight_scale_2"] = ("F32", ())
        out[path + ".input_scale"] = ("F32", ())
    return out


def expected_quantized_layers(source_names, quantize_mtp: bool = True) -> dict[str, dict]:
    return {n[: -len(".weight")]: {"quant_algo": "NVFP4", "group_size": 16}
            for n in sorted(source_names)
            if EXPERT_WEIGHT_RE.match(n) and (quantize_mtp or not n.startswith("mtp."))}


def check_hf_quant_config(hfq: dict, source_names, quantize_mtp: bool = True) -> list[str]:
    """Differences between a written hf_quant_config.json and the exporter's (empty = same)."""
    problems = []
    q = hfq.get("quantization", {})
    for key, want in (("quant_algo", "MIXED_PRECISION"), ("group_size", 16), ("kv_cache_quant_algo", None)):
        if q.get(key, "<missing>") != want:
            problems.append(f"hf_quant_config.json quantization.{key}: expected {want!r}, found {q.get(key, '<missing>')!r}")
    want_layers = expected_quantized_layers(source_names, quantize_mtp)
    got = q.get("quantized_layers", {})
    if got != want_layers:
        missing, extra = sorted(set(want_layers) - set(got)), sorted(set(got) - set(want_layers))
        problems.append(f"hf_quant_config.json quantized_layers: missing {missing[:3]}, unexpected {extra[:3]}, "
                        f"or values differ from {{quant_algo: NVFP4, group_size: 16}}")
    return problems


def check_config(out_cfg: dict, source_cfg: dict) -> list[str]:
    """Differences between the written config.json and the exporter's rewrite of the source's."""
    problems = []
    q = out_cfg.get("quantization_config") or {}
    src_q = source_cfg.get("quantization_config") or {}
    want = {"quant_method": "fp8", "moe_quant_algo": "NVFP4",
            "activation_scheme": src_q.get("activation_scheme", "dynamic"),
            "weight_block_size": src_q.get("weight_block_size", [128, 128])}
    for k, v in want.items():
        if q.get(k) != v:
            problems.append(f"config.json quantization_config.{k}: expected {v!r}, found {q.get(k)!r}")
    for k, v in source_cfg.items():
        if k != "quantization_config" and out_cfg.get(k) != v:
            problems.append(f"config.json {k}: changed from {v!r} to {out_cfg.get(k)!r}; the exporter keeps it")
    return problems
