"""Doctor checks of a Qwen3-MoE checkpoint: config.json fields vLLM's ``qwen3_moe.py`` reads, and every
tensor group of the config present with its shape, stored BF16 or as a complete NVFP4 set."""
from __future__ import annotations

from nvfp4stack.models.qwen3_moe.spec import num_experts, qwen3_moe_tensor_groups

CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "moe_intermediate_size", "num_experts_per_tok", "vocab_size")
NVFP4_PARTS = {"weight": "U8", "weight_scale": "F8_E4M3", "weight_scale_2": "F32", "input_scale": "F32"}


def _check_config(config: dict, report) -> bool:
    missing = [k for k in CONFIG_KEYS if k not in config]
    try:
        experts = num_experts(config)
    except KeyError as e:
        missing.append(str(e).strip("'\""))
        experts = 0
    if missing:
        report.error("config", "config.json", f"missing {', '.join(missing)}", "every field vLLM's Qwen3-MoE reads",
                     "copy config.json from the source checkpoint")
        return False
    if not 0 < int(config["num_experts_per_tok"]) <= experts:
        report.error("config", "config.json: num_experts_per_tok", config["num_experts_per_tok"],
                     f"between 1 and the expert count {experts}", "fix config.json")
        return False
    return True


def _check_group(name: str, shape: tuple, tensors: dict, report) -> None:
    w = tensors.get(f"{name}.weight")
    if w is None:
        report.error("structure", f"{name}.weight", "absent", f"a tensor of logical shape {list(shape)}",
                     "the checkpoint does not match its config.json: re-export it")
        return
    if w.dtype == "U8":   # NVFP4: two E2M1 values per byte, one UE4M3 scale per 16
        for part, dtype in NVFP4_PARTS.items():
            t = tensors.get(f"{name}.{part}")
            if t is None and part == "input_scale":   # e.g. a data-free `convert`: weights only
                report.error("structure", f"{name}.input_scale", "absent", "F32 activation scale (vLLM's NVFP4 MoE "
                             "loads one per projection)", "calibrate: `python main.py recipe=... quantize` "
                             "(modelopt) instead of a data-free convert")
            elif t is None or t.dtype != dtype:
                report.error("structure", f"{name}.{part}", "absent" if t is None else t.dtype,
                             f"{dtype} (modelopt NVFP4)", "re-export with modelopt; the NVFP4 set is incomplete")
        expect = {"weight": (shape[0], shape[1] // 2), "weight_scale": (shape[0], shape[1] // 16)}
        for part, want in expect.items():
            t = tensors.get(f"{name}.{part}")
            if t is not None and tuple(t.shape) != want:
                report.error("structure", f"{name}.{part}", list(t.shape), list(want), "re-export the checkpoint")
    elif tuple(w.shape) != tuple(shape):
        report.error("structure", f"{name}.weight", list(w.shape), list(shape),
                     "the checkpoint does not match its config.json: re-export it")


def check_checkpoint(config: dict, tensors: dict, report) -> bool:
    """Config fields, then each expected group; True when vLLM's Qwen3-MoE loader can read the layout."""
    if not _check_config(config, report):
        return False
    errors = len(report.errors)
    for g in qwen3_moe_tensor_groups(config):
        if g.is_matrix:
            _check_group(g.name, g.shape, tensors, report)
        elif f"{g.name}.weight" not in tensors:
            report.error("structure", f"{g.name}.weight", "absent", f"a tensor of shape {list(g.shape)}",
                         "the checkpoint does not match its config.json: re-export it")
    shared = sorted(n for n in tensors if ".shared_expert" in n)
    if shared:
        report.error("structure", shared[0], f"{len(shared)} shared-expert tensors", "none (Qwen3-MoE has no shared "
                     "expert; vLLM's loader would reject them)", "check the model family of this checkpoint")
    return len(report.errors) == errors
