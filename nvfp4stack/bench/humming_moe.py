"""vLLM 0.26's Humming NVFP4 MoE (W4A16, JIT kernels of the ``humming-kernels`` package) on our NVFP4
expert weights: the second stock baseline of the MoE benches, beside bench/marlin_moe.py.

It goes through the functions vLLM's NVFP4 MoE oracle calls for ``NvFp4MoeBackend.HUMMING``
(fused_moe/oracle/nvfp4.py): ``select_nvfp4_moe_backend`` with ``moe_backend="humming"`` (which
also applies vLLM's eligibility rules), ``convert_to_humming_moe_kernel_format`` on a layer holding
the ModelOpt parameters (``w13_weight``, ``w13_weight_scale``, ``w13_weight_scale_2``, ...),
``get_humming_moe_quant_config`` and ``make_nvfp4_moe_kernel``. Unlike Marlin, vLLM has no
stand-alone function for it, so the layer is a small module carrying what those functions read.

Humming applies no SwiGLU clamp (vLLM's oracle leaves it out for a model with ``swiglu_limit``),
so it is compared with the unclamped fp32 twin. Needs a CUDA GPU, vLLM for CUDA (>= 0.26) and the
``humming`` package (the offline bundle); ``available()`` says why not otherwise. Not yet run on a
GPU from this tree: ``moe_few_tokens`` reports a failure here as a left-out column, not an error.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from nvfp4stack.bench.marlin_moe import expert_shapes
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import global_scale_per_expert  # [E] fp32, checked

MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "nvfp4"}   # what vLLM's oracle passes


def available() -> tuple[bool, str]:
    """Whether vLLM's Humming MoE can run here, and why not."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    try:
        from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
        from vllm.model_executor.layers.quantization.utils.humming_utils import (  # noqa: F401
            convert_to_humming_moe_kernel_format,
        )
        from vllm.utils.import_utils import has_humming
    except Exception as exc:  # noqa: BLE001 - any failure to load vLLM means no baseline, said why
        return False, (f"vLLM's Humming MoE is not importable ({type(exc).__name__}: {exc}); it needs vLLM 0.26's "
                       "CUDA build (the offline bundle, README)")
    if not hasattr(NvFp4MoeBackend, "HUMMING"):
        return False, "this vLLM has no NvFp4MoeBackend.HUMMING; it needs vLLM >= 0.26"
    if not has_humming():
        return False, "the humming package is not installed (pip wheel humming-kernels==0.1.10, in the offline bundle)"
    return True, "vLLM Humming NVFP4 MoE (moe_backend=humming)"


@dataclass
class HummingExperts:
    """vLLM's Humming kernel and the layer it reads its weights from."""

    kernel: Any
    layer: torch.nn.Module
    experts: int
    vllm_config: Any


def _vllm_context():
    from vllm.config import VllmConfig, set_current_vllm_config

    cfg = VllmConfig()
    return cfg, set_current_vllm_config(cfg)


def prepare(w13: Nvfp4Tensor, w2: Nvfp4Tensor, top_k: int, max_tokens: int) -> HummingExperts:
    """w13 [E, 2I, H] (gate rows then up rows) and w2 [E, H, I], prepared as vLLM prepares a ModelOpt
    NVFP4 MoE layer for moe_backend=humming."""
    experts, two_i, hidden = expert_shapes(w13, w2, "humming_moe")
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import make_nvfp4_moe_kernel, select_nvfp4_moe_backend
    from vllm.model_executor.layers.quantization.utils.humming_utils import (
        convert_to_humming_moe_kernel_format,
        get_humming_moe_quant_config,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4Static
    from vllm.v1.worker import workspace

    if not workspace.is_workspace_manager_initialized():
        # what vLLM's GPU model runner sets up before any layer runs; vLLM 0.26's Humming experts draw their
        # scratch from it (the H200 run of 2026-11-27: "WorkspaceManager not initialized")
        workspace.init_workspace_manager(w13.data.device)
    vllm_config, ctx = _vllm_context()
    with ctx:
        moe = FusedMoEConfig(
            num_experts=experts, experts_per_token=top_k, hidden_dim=hidden, intermediate_size=two_i // 2,
            num_local_experts=experts, num_logical_experts=experts, activation=MoEActivation.SILU,
            device=w13.data.device, routing_method=RoutingMethodType.Renormalize,
            moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=torch.bfloat16,
            moe_backend="humming", max_num_tokens=max(max_tokens, 1))
        backend, experts_cls = select_nvfp4_moe_backend(moe, kNvfp4Static, None)
        layer = torch.nn.Module()
        layer.moe_config, layer.params_dtype, layer.layer_name = moe, torch.bfloat16, "bench.moe_few_tokens.experts"
        layer.local_num_experts = layer.global_num_experts = experts
        layer.hidden_size, layer.intermediate_size_per_partition = hidden, two_i // 2
        for name, t in (("w13", w13), ("w2", w2)):
            for suffix, value in (("weight", t.data), ("weight_scale", t.scale),
                                  ("weight_scale_2", global_scale_per_expert(t, experts, name))):
                setattr(layer, f"{name}_{suffix}", torch.nn.Parameter(value.contiguous(), requires_grad=False))
        convert_to_humming_moe_kernel_format(layer, quant_config=MODELOPT_NVFP4)
        kernel = make_nvfp4_moe_kernel(get_humming_moe_quant_config(layer), moe, experts_cls, backend, layer=layer)
    return HummingExperts(kernel, layer, experts, vllm_config)


def forward(h: HummingExperts, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """The MoE output [T, H] (bf16), unclamped SwiGLU, as vLLM's Humming experts compute it."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    with contextlib.ExitStack() as stack:
        stack.enter_context(set_current_vllm_config(h.vllm_config))
        stack.enter_context(set_forward_context(None, h.vllm_config, num_tokens=x.shape[0]))
        return h.kernel.apply(x.to(torch.bfloat16).contiguous(), h.layer.w13_weight, h.layer.w2_weight,
                              topk_weights.to(torch.float32), topk_ids, MoEActivation.SILU, h.experts, None, False)
