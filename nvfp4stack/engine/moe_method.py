"""FusedMoE method for nvfp4stack's own MoE backends (torch_emulation on CPU, triton_w4a16, ...).

It subclasses vLLM's ``ModelOptNvFp4FusedMoE`` only to inherit its parameter layout
(``create_weights``), so checkpoint loading is vLLM's own code path: vLLM's FusedMoE weight
loader special-cases quant methods whose class name contains "ModelOpt", hence the name. Backend
selection (vLLM's oracle, which has no CPU NVFP4 kernel) and weight shuffling are skipped: the
weights stay packed exactly as the checkpoint stores them and the backend's ``forward`` (same
signature as ``nvfp4_moe_forward``) runs the experts.
"""
from __future__ import annotations

from typing import Optional

import torch
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE

from nvfp4stack.engine.compat import engine_token_budget, triton_jit_hook_suspended
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.base import MOE_BACKENDS
from nvfp4stack.schemes import Scheme


def _shared_scale(t: torch.Tensor, what: str, prefix: str) -> torch.Tensor:
    """[E, 2] (w1, w3) per-expert scalars -> [E]; modelopt exports w1 and w3 with one shared value."""
    if t.ndim == 2:
        if not torch.equal(t[:, 0], t[:, 1]):
            bad = int((t[:, 0] != t[:, 1]).nonzero()[0, 0])
            raise ValueError(
                f"{prefix}.w13_{what}: expert {bad} has w1 {float(t[bad, 0])} != w3 {float(t[bad, 1])}; "
                "expected one shared value (modelopt exports the max of both). Re-export with "
                "modelopt, or requantize w1/w3 to a common global scale"
            )
        t = t[:, 0]
    return t.contiguous().float()


@torch.library.custom_op("nvfp4stack::moe_forward", mutates_args=())
def moe_forward_op(x: torch.Tensor, w13_data: torch.Tensor, w13_scale: torch.Tensor, w13_gs: torch.Tensor,
                   w2_data: torch.Tensor, w2_scale: torch.Tensor, w2_gs: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, a13_scale: Optional[torch.Tensor],
                   a2_scale: Optional[torch.Tensor], swiglu_limit: Optional[float], activation: str,
                   kernel: str, fp8_w13: Optional[torch.Tensor] = None, fp8_w13_scale: Optional[torch.Tensor] = None,
                   fp8_w2: Optional[torch.Tensor] = None, fp8_w2_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Opaque op around the backend: vLLM's torch.compile traces the model in one graph, and the
    emulation's data-dependent loop (experts that received tokens) must not be traced. The ``fp8_*``
    tensors (triton_w4a16's FP8 prefill copy) switch the backend to ``mode="auto"``."""
    e, two_i, h_half = w13_data.shape
    w13 = Nvfp4Tensor(w13_data, w13_scale, w13_gs, (e, two_i, h_half * 2))
    w2 = Nvfp4Tensor(w2_data, w2_scale, w2_gs, (e, h_half * 2, two_i // 2))
    extra = {}
    if fp8_w13 is not None:
        from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import Fp8ExpertWeights

        extra = {"mode": "auto", "fp8_weights": Fp8ExpertWeights(fp8_w13, fp8_w13_scale, fp8_w2, fp8_w2_scale)}
    with triton_jit_hook_suspended():  # vLLM 0.26's JIT monitor cannot serialize Gluon layouts
        return MOE_BACKENDS.get(kernel).forward(x, w13, w2, topk_weights, topk_ids, swiglu_limit=swiglu_limit,
                                                a13_scale=a13_scale, a2_scale=a2_scale, activation=activation,
                                                **extra)


@moe_forward_op.register_fake
def _(x, w13_data, w13_scale, w13_gs, w2_data, w2_scale, w2_gs, topk_weights, topk_ids, a13_scale,
      a2_scale, swiglu_limit, activation, kernel, fp8_w13=None, fp8_w13_scale=None, fp8_w2=None, fp8_w2_scale=None):
    return torch.empty_like(x)


class Nvfp4StackModelOptMoE(ModelOptNvFp4FusedMoE):
    """Routed experts kept packed NVFP4; ``apply`` calls the planned nvfp4stack backend."""

    def __init__(self, quant_config, moe_config, *, kernel: str, scheme: Scheme, prefix: str,
                 fp8_prefill: bool = False):
        FusedMoEMethodBase.__init__(self, moe_config)  # skip vLLM's NVFP4 backend oracle
        self.quant_config = quant_config
        self.kernel = kernel
        MOE_BACKENDS.get(kernel)  # fail here, naming the valid backends, if the name is wrong
        self.scheme = scheme
        self.prefix = prefix
        self.fp8_prefill = fp8_prefill  # triton_w4a16: FP8 copy built at load, used from 64 rows/expert
        self.fp8 = None
        self.use_a16 = scheme is Scheme.NVFP4_W4A16
        self.per_token_activation = False
        self.use_global_sf = False
        self.nvfp4_backend = None
        self.experts_cls = None

    @property
    def is_monolithic(self) -> bool:
        return False

    @property
    def supports_eplb(self) -> bool:
        return False

    @property
    def method_name(self) -> str:
        return f"nvfp4stack:{self.kernel}"

    def get_fused_moe_quant_config(self, layer):
        return None  # no vLLM modular kernel consumes it; our forward reads the layer directly

    def process_weights_after_loading(self, layer) -> None:
        p = self.prefix
        w13_s2 = _shared_scale(layer.w13_weight_scale_2.data, "weight_scale_2", p)   # [E]
        e, two_i, h_half = layer.w13_weight.shape
        h = h_half * 2
        # Views on the loaded parameters: the packed bytes are the only copy in memory.
        self.w13 = Nvfp4Tensor(layer.w13_weight.data, layer.w13_weight_scale.data, w13_s2, (e, two_i, h))
        self.w2 = Nvfp4Tensor(layer.w2_weight.data, layer.w2_weight_scale.data,
                              layer.w2_weight_scale_2.data.float().contiguous(), (e, h, two_i // 2))
        if self.use_a16:
            self.a13_scale = self.a2_scale = None
        else:
            self.a13_scale = _shared_scale(layer.w13_input_scale.data, "input_scale", p)
            self.a2_scale = layer.w2_input_scale.data.float().contiguous()
            for name, s in (("w13_input_scale", self.a13_scale), ("w2_input_scale", self.a2_scale)):
                if not (torch.isfinite(s).all() and (s > 0).all()):
                    raise ValueError(f"{p}.{name}: expected finite positive calibrated scales, found "
                                     f"{s.tolist()}; the checkpoint lacks input scales: serve it as "
                                     "nvfp4_w4a16 or re-calibrate")
        if self.fp8_prefill:
            from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import prepare_fp8_experts

            self.fp8 = prepare_fp8_experts(self.w13, self.w2)  # +1 byte/weight, once
        limit = getattr(layer, "swiglu_limit", None)
        with triton_jit_hook_suspended():
            MOE_BACKENDS.get(self.kernel).warm_up_moe(
                self.w13, self.w2, top_k=self.moe.experts_per_token, max_tokens=engine_token_budget(),
                swiglu_limit=None if limit is None else float(limit), fp8_weights=self.fp8)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        # Shared experts are run by vLLM's MoE runner (no internal modular kernel here).
        if layer.apply_router_weight_on_input:
            raise NotImplementedError(f"{self.prefix}: apply_router_weight_on_input is not supported by "
                                      f"{self.kernel}; use a vLLM MoE backend for this model")
        if layer.expert_map is not None:  # expert parallel: global ids -> local, others dropped
            local = layer.expert_map[topk_ids.long()]
            topk_weights = torch.where(local < 0, torch.zeros_like(topk_weights), topk_weights)
            topk_ids = local.clamp(min=0)
        limit = getattr(layer, "swiglu_limit", None)
        return moe_forward_op(
            x, self.w13.data, self.w13.scale, self.w13.global_scale,
            self.w2.data, self.w2.scale, self.w2.global_scale, topk_weights, topk_ids,
            self.a13_scale, self.a2_scale, None if limit is None else float(limit),
            layer.activation.value, self.kernel,
            *((self.fp8.w13, self.fp8.w13_scale, self.fp8.w2, self.fp8.w2_scale) if self.fp8 is not None else ()),
        )
