"""Child process of test_own_linear_method.py: vLLM's DeepSeek-V4 built with the nvfp4stack quantization
config and the release checkpoint loaded by vLLM's own loader (cast_at_load_child.loaded_model); every
linear the plan puts on an nvfp4stack kernel is run through its module's forward on random inputs,
and, for comparison, through vLLM's own ``Fp8LinearMethod`` on a twin layer holding the same loaded bytes.

``python -m tests.engine.fp8_linear_child CKPT OVERRIDES_JSON OUT_DIR``: writes ``methods.json``
(module -> method class, kernel) and ``outputs.safetensors`` (per run module: x, ours, vllm).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.engine.cast_at_load_child import loaded_model


def _vllm_twin(module, base, name: str):
    """A ReplicatedLinear with vLLM's own Fp8LinearMethod (base config) holding ``module``'s loaded bytes.
    vLLM lists its CPU FP8 block kernel for AMX hosts only; its op (fp8_scaled_mm_cpu) runs on AVX-512 too,
    so the AMX test is answered yes while the twin is built."""
    import torch
    from vllm.model_executor.layers.linear import ReplicatedLinear

    n, k = module.weight.shape
    has_amx = torch.cpu._is_amx_tile_supported
    torch.cpu._is_amx_tile_supported = lambda: True
    try:
        twin = ReplicatedLinear(k, n, bias=False, quant_config=base, prefix=f"{name}.vllm_twin")
    finally:
        torch.cpu._is_amx_tile_supported = has_amx
    twin.weight.data.copy_(module.weight.data)
    twin.weight_scale_inv.data.copy_(module.weight_scale_inv.data)   # e8m0 -> fp32 where vLLM wants fp32: exact
    twin.quant_method.process_weights_after_loading(twin)
    return twin


def main(ckpt: str, overrides: str, out_dir: str) -> int:
    import torch
    from safetensors.torch import save_file
    from vllm.model_executor.layers.linear import LinearBase

    out = Path(out_dir)
    methods: dict[str, dict] = {}
    saved: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(1234)
    with loaded_model(ckpt, overrides) as (model, vc), torch.no_grad():
        base = vc.quant_config.base
        for name, module in model.named_modules():
            if not isinstance(module, LinearBase):
                continue
            method = module.quant_method
            methods[name] = {"method": type(method).__name__, "kernel": getattr(method, "kernel", None)}
            if not hasattr(method, "typed_weight"):
                continue
            twin = _vllm_twin(module, base, name)
            # non-uniform activations: normal rows of different magnitudes, a few large outliers
            x = torch.randn(7, module.input_size_per_partition, generator=gen)
            x = x * torch.logspace(-2, 1, 7).unsqueeze(1)
            x[torch.rand(x.shape, generator=gen) < 0.01] *= 30
            x = x.to(torch.bfloat16)
            method.process_weights_after_loading(module)   # for wo_a: the CPU model's wrapper around ours
            ours = module(x)
            saved[f"{name}.x"] = x
            saved[f"{name}.ours"] = ours[0] if isinstance(ours, tuple) else ours
            saved[f"{name}.vllm"] = twin(x)[0]
    (out / "methods.json").write_text(json.dumps(methods, indent=1))
    save_file({k: v.contiguous() for k, v in saved.items()}, str(out / "outputs.safetensors"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
