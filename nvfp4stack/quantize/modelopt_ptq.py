"""Generic modelopt NVFP4 post-training quantization: calibrate, snapshot amax to CPU, export.

The amax snapshot is the lesson of the original quantize repo: after long calibrations device
tensors went stale before export, so the calibrated amax values are copied to CPU and saved
right after calibration, as safetensors (never a pickle) in ``calibration/amax.safetensors``: a
sub-directory, since vLLM loads every top-level ``*.safetensors`` of a checkpoint without an index.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from nvfp4stack.checkpoint.safetensors_io import check_inside
from nvfp4stack.checkpoint.side_files import copy_side_files, side_files
from nvfp4stack.corpus import calibration_texts
from nvfp4stack.io_atomic import atomic_dir

# The modelopt config names this module accepts (attributes of modelopt.torch.quantization).
MODELOPT_CONFIGS = ("NVFP4_DEFAULT_CFG", "NVFP4_EXPERTS_ONLY_CFG", "NVFP4_MLP_ONLY_CFG")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")
AMAX_FILE = Path("calibration") / "amax.safetensors"


def _quant_cfg(name: str, disable: tuple[str, ...] = ()):
    """modelopt's named config, with quantizers matching the ``disable`` globs switched off (the
    plan keeps those modules BF16); modelopt applies its entries in order, so these come last."""
    import copy

    import modelopt.torch.quantization as mtq

    if name not in MODELOPT_CONFIGS or not hasattr(mtq, name):
        raise ValueError(
            f"quantize.modelopt_config: expected one of {', '.join(MODELOPT_CONFIGS)}, found {name!r}; "
            "pick one of those"
        )
    cfg = getattr(mtq, name)
    if not disable:
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + [{"quantizer_name": g, "enable": False} for g in disable]
    return cfg


def snapshot_amax(model) -> dict:
    """Every quantizer's calibrated amax, copied to CPU: {quantizer module name: tensor}."""
    out = {}
    for name, mod in model.named_modules():
        amax = getattr(mod, "_amax", None)
        if amax is not None and hasattr(mod, "is_enabled"):
            out[name] = amax.detach().to("cpu", copy=True)
    return out


def save_amax(amax: dict, path: str | os.PathLike, quant_cfg_name: str) -> Path:
    """The amax snapshot as safetensors at ``path`` (quantizer name -> tensor, the config in the metadata)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sorted(amax.items())}, str(path),
              metadata={"format": "pt", "modelopt_config": quant_cfg_name})
    return path


def load_amax(path: str | os.PathLike) -> dict:
    """The amax snapshot save_amax wrote (safetensors: no code runs on load)."""
    from safetensors.torch import load_file

    return load_file(str(path))


def calibrate(model, tokenizer, quant_cfg_name: str, num_samples: int = 32, max_len: int = 256,
              seed: int = 0, forward_loop: Callable | None = None, disable: tuple[str, ...] = ()):
    """Insert modelopt quantizers and calibrate them on the stdlib corpus (or ``forward_loop``)."""
    import modelopt.torch.quantization as mtq
    import torch
    from tqdm import tqdm

    texts = calibration_texts(num_samples, seed=seed)

    def default_loop(m):
        dev = next(m.parameters()).device
        for text in tqdm(texts, desc="calibrate", leave=False):
            ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_len)
            with torch.no_grad():
                m(input_ids=ids["input_ids"].to(dev))

    return mtq.quantize(model, _quant_cfg(quant_cfg_name, disable), forward_loop or default_loop)


def load_kwargs() -> dict:
    """transformers' from_pretrained arguments for the model to calibrate: BF16, and on a host with CUDA
    GPUs spread over them by accelerate (``device_map="auto"``, modelopt's hf_ptq flow), since a full-size
    MoE does not fit one GPU nor, in practice, host memory; on CPU hosts it stays where it loads."""
    import torch

    kw = {"dtype": torch.bfloat16, "use_safetensors": True}  # never torch.load a checkpoint's .bin
    if torch.cuda.is_available():
        kw["device_map"] = "auto"
    return kw


def quantize_and_export(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                        quant_cfg_name: str = "NVFP4_EXPERTS_ONLY_CFG", num_samples: int = 32,
                        max_len: int = 256, seed: int = 0, keep_config_keys: tuple[str, ...] = (),
                        disable: tuple[str, ...] = ()) -> Path:
    """Quantize the HF model in ``model_dir`` with modelopt and export a unified HF checkpoint.

    ``keep_config_keys``: config.json keys the model's transformers config class drops on save (the
    family knows which); they are copied back from the source config.json so vLLM reads the same model.
    The export is written to a temporary sibling dir and renamed into ``out_dir``.
    """
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(model_dir)
    out = Path(out_dir)
    tokenizer_files, _ = side_files(src, TOKENIZER_FILES)  # refuses one linking out of src
    src_cfg = json.loads(check_inside(src, src / "config.json", "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, **load_kwargs()).eval()
    calibrate(model, tokenizer, quant_cfg_name, num_samples=num_samples, max_len=max_len, seed=seed,
              disable=disable)

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        save_amax(snapshot_amax(model), tmp / AMAX_FILE, quant_cfg_name)
        with torch.inference_mode():
            export_hf_checkpoint(model, export_dir=tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update({k: src_cfg[k] for k in keep_config_keys if k in src_cfg})
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
        copy_side_files([p for p in tokenizer_files if not (tmp / p.name).exists()], tmp)
    return out
