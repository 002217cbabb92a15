"""Child process of test_cast_at_load.py: vLLM's DeepSeek-V4 built with the nvfp4stack quantization
config, the release checkpoint loaded by vLLM's own loader, and our MoE method's
``process_weights_after_loading`` run on every routed-experts module (the load-time cast); the NVFP4
tensors it leaves are saved for the test to compare with the offline converter's bytes.

``python -m tests.engine.cast_at_load_child CKPT OVERRIDES_JSON OUT_SAFETENSORS [SEED]``; with SEED,
CKPT is weight-free and vLLM loads it with the plugin's ``synthetic`` load format (that seed).
(vLLM patches torch and starts a process group, hence a child process, like the doctor's load check).
"""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def loaded_model(ckpt: str, overrides: str, seed: str | None = None):
    """vLLM's model for ``ckpt`` built with the nvfp4stack quantization config (``overrides``: the
    --hf-overrides payload) and its weights loaded by vLLM's own loader; yields (model, vllm_config)
    inside vLLM's config context, before any ``process_weights_after_loading``."""
    from nvfp4stack.models.deepseek_v4.vllm_cpu_shims import force_no_amx_if_asked

    force_no_amx_if_asked()
    import torch
    import vllm.v1.worker.cpu.shm  # noqa: F401  (vLLM's CPU worker imports it first)
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype

    from nvfp4stack.engine.plugin import register
    from nvfp4stack.models.deepseek_v4.load_check import LoadReport
    from nvfp4stack.models.deepseek_v4.vllm_cpu_shims import allow_fp8_block_without_amx, init_dist_once

    register()
    load = {} if seed is None else {"load_format": "synthetic", "model_loader_extra_config": {"seed": int(seed)}}
    ea = EngineArgs(model=ckpt, dtype="bfloat16", enforce_eager=True, max_model_len=256, max_num_batched_tokens=256,
                    max_num_seqs=4, skip_tokenizer_init=True, quantization="nvfp4stack",
                    hf_overrides=json.loads(Path(overrides).read_text()), **load)
    vc = ea.create_engine_config()
    report = LoadReport(ckpt)
    with set_current_vllm_config(vc):
        init_dist_once()
        allow_fp8_block_without_amx(report)
        model_cls, _ = get_model_architecture(vc.model_config)
        with set_default_torch_dtype(vc.model_config.dtype), torch.device("cpu"):
            model = model_cls(vllm_config=vc)
        with torch.no_grad():
            if seed is None:
                model.load_weights(DefaultModelLoader(vc.load_config).get_all_weights(vc.model_config, model))
            else:
                get_model_loader(vc.load_config).load_weights(model, vc.model_config)
                bad = [n for n, p in model.named_parameters() if p.dtype.is_floating_point and p.dtype.itemsize > 1
                       and not torch.isfinite(p.float()).all()]
                print(f"[cast_at_load] non-finite parameters: {bad}", flush=True)
            yield model, vc


def main(ckpt: str, overrides: str, out: str, seed: str | None = None) -> int:
    import torch
    from safetensors.torch import save_file
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    saved: dict[str, torch.Tensor] = {}
    with loaded_model(ckpt, overrides, seed) as (model, _):
        for name, module in model.named_modules():
            if not isinstance(module, RoutedExperts):
                continue
            method = module.quant_method
            print(f"[cast_at_load] {name}: {type(method).__name__}", flush=True)
            method.process_weights_after_loading(module)
            for p in ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
                      "w2_weight_scale_2"):
                t = getattr(module, p).data
                saved[f"{name}.{p}"] = (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).contiguous()
    save_file(saved, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:5]))
