"""FusedMoE method for nvfp4stack's own MoE backends (torch_emulation on CPU, triton_w4a16, ...).

It subclasses vLLM's ``ModelOptNvFp4FusedMoE`` only to inherit its parameter layout
(``create_weights``), so checkpoint loading is vLLM's own code path: vLLM's FusedMoE weight
loader special-cases quant methods whose class name contains "ModelOpt", hence the name. Backend
selection (vLLM's oracle, which has no CPU NVFP4 kernel) and weight shuffling are skipped: the
planned backend's ``prepare`` takes the packed experts exactly as the checkpoint stores them
(views, no copy; triton_w4a16 on sm90 moves their bytes into a tile layout, which then replaces the
parameters' storage) and its ``apply`` runs them (kernels/base.py: MoeBackend).
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import torch
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE

from nvfp4stack.engine.compat import engine_token_budget, triton_jit_hook_suspended
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.base import MOE_BACKENDS, MoeWeights, RunnableMoeBackend, runnable_backend
from nvfp4stack.schemes import Scheme

log = logging.getLogger("vllm.nvfp4stack")  # under vLLM's logger: its handlers, in the server log


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


def local_routing(expert_map: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  skips_negative: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Global expert ids -> this rank's (vLLM's ``expert_map``: -1 for other ranks' experts). A backend
    that skips negative ids gets them as they are, so their slots cost nothing (with vLLM's all-gather
    dispatch at EP 8, ~7/8 of the slots); the others get such slots on expert 0 with weight 0."""
    local = expert_map[topk_ids.long()].to(topk_ids.dtype)
    if skips_negative:
        return topk_weights, local
    return torch.where(local < 0, torch.zeros_like(topk_weights), topk_weights), local.clamp(min=0)


def runnable_moe_backend(kernel: str, prefix: str) -> type[RunnableMoeBackend]:
    """The registered MoE backend ``kernel``, which must be one nvfp4stack runs (prepare/apply)."""
    return runnable_backend("moe", kernel, prefix,
                            "plan the routed experts on one of those, or leave the layer to vLLM's method")


@torch.library.custom_op("nvfp4stack::moe_forward", mutates_args=())
def moe_forward_op(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                   swiglu_limit: Optional[float], activation: str, kernel: str, tiled: bool, routed_experts: int,
                   w13_data: torch.Tensor, w13_scale: torch.Tensor, w13_gs: torch.Tensor,
                   w2_data: torch.Tensor, w2_scale: torch.Tensor, w2_gs: torch.Tensor,
                   a13_scale: Optional[torch.Tensor], a2_scale: Optional[torch.Tensor],
                   fp8_w13: Optional[torch.Tensor], fp8_w13_scale: Optional[torch.Tensor],
                   fp8_w2: Optional[torch.Tensor], fp8_w2_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """Opaque op around the backend's ``apply``: vLLM's torch.compile traces the model in one
    graph, and the emulation's data-dependent loop (experts that received tokens) must not be
    traced. The tensors are the backend's prepared form's ``op_tensors()``, ``tiled`` and ``routed_experts``
    its fields."""
    backend = MOE_BACKENDS.get(kernel)
    prepared = backend.prepared_type.from_op_tensors(w13_data, w13_scale, w13_gs, w2_data, w2_scale, w2_gs,
                                                     a13_scale, a2_scale, fp8_w13, fp8_w13_scale, fp8_w2,
                                                     fp8_w2_scale, tiled, routed_experts)
    with triton_jit_hook_suspended():  # vLLM 0.26's JIT monitor cannot serialize Gluon layouts
        return backend.apply(prepared, x, topk_weights, topk_ids, swiglu_limit=swiglu_limit, activation=activation)


@moe_forward_op.register_fake
def _(x, topk_weights, topk_ids, swiglu_limit, activation, kernel, tiled, routed_experts, *tensors):
    return torch.empty_like(x)


class Nvfp4StackModelOptMoE(ModelOptNvFp4FusedMoE):
    """Routed experts kept packed NVFP4; ``apply`` calls the planned nvfp4stack backend."""

    def __init__(self, quant_config, moe_config, *, kernel: str, scheme: Scheme, prefix: str,
                 fp8_prefill: bool = False):
        FusedMoEMethodBase.__init__(self, moe_config)  # skip vLLM's NVFP4 backend oracle
        self.quant_config = quant_config
        self.kernel = kernel
        # fail here, naming the valid backends, if the name is wrong; apply asks it every step
        self.skips_negative_ids = runnable_moe_backend(kernel, prefix).capabilities.negative_expert_ids
        self.scheme = scheme
        self.prefix = prefix
        self.fp8_prefill = fp8_prefill  # triton_w4a16: FP8 copy built at load, used from 64 rows/expert
        self.prepared = None  # the backend's prepared form, set by process_weights_after_loading
        self.op_tensors: tuple = ()
        self.use_a16 = scheme is Scheme.NVFP4_W4A16
        self.per_token_activation = False
        self.use_global_sf = False
        self.nvfp4_backend = None
        self.experts_cls = None

    @property
    def is_monolithic(self) -> bool:
        return False

    def maybe_make_prepare_finalize(self, routing_tables=None):
        # vLLM 0.26 asks every MoE layer for a modular kernel whenever the EP group has more than one
        # rank (TP=2 alone is enough); ModelOptNvFp4FusedMoE raises there. Ours has none: apply runs it.
        return None

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
        w13 = Nvfp4Tensor(layer.w13_weight.data, layer.w13_weight_scale.data, w13_s2, (e, two_i, h))
        w2 = Nvfp4Tensor(layer.w2_weight.data, layer.w2_weight_scale.data,
                         layer.w2_weight_scale_2.data.float().contiguous(), (e, h, two_i // 2))
        self.install(layer, w13, w2, *self._input_scales(layer))

    def _input_scales(self, layer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The calibrated activation scales W4A4 needs (None, None for weight-only)."""
        p = self.prefix
        a13_scale = a2_scale = None
        if not self.use_a16:
            a13_scale = _shared_scale(layer.w13_input_scale.data, "input_scale", p)
            a2_scale = layer.w2_input_scale.data.float().contiguous()
            for name, s in (("w13_input_scale", a13_scale), ("w2_input_scale", a2_scale)):
                if not (torch.isfinite(s).all() and (s > 0).all()):
                    raise ValueError(f"{p}.{name}: expected finite positive calibrated scales, found "
                                     f"{s.tolist()}; the checkpoint lacks input scales: serve it as "
                                     "nvfp4_w4a16 or re-calibrate")
        return a13_scale, a2_scale

    def install(self, layer, w13: Nvfp4Tensor, w2: Nvfp4Tensor, a13_scale, a2_scale) -> None:
        """Hand the layer's NVFP4 experts to the planned backend (prepare, warm-up) for ``apply``."""
        p = self.prefix
        backend = runnable_moe_backend(self.kernel, p)
        expert_map = getattr(layer, "expert_map", None)  # ids arrive global (the map's index): rows per
        routed = expert_map.numel() if expert_map is not None else 0  # expert over all ranks' experts
        prepared = backend.prepare(MoeWeights(w13, w2, a13_scale, a2_scale), fp8_prefill=self.fp8_prefill,
                                   routed_experts=routed)
        if not isinstance(prepared, backend.prepared_type):
            raise TypeError(f"{p}: backend {self.kernel} prepared a {type(prepared).__name__}, but declares "
                            f"prepared_type {backend.prepared_type.__name__}, which this method carries through "
                            "its custom op: return one from prepare")
        if prepared.tiled:  # the parameters now hold the tiled bytes: no second copy of the experts stays
            layer.w13_weight.data = prepared.weights.w13.data
            layer.w2_weight.data = prepared.weights.w2.data
            log.info("nvfp4stack: %s: %s experts in the tile layout (hopper_w4a16/tiles.py)", p, self.kernel)
        self.prepared = prepared
        self.op_tensors = prepared.op_tensors()  # once: apply only passes them on
        limit = getattr(layer, "swiglu_limit", None)
        start = time.perf_counter()
        with triton_jit_hook_suspended():
            counts = backend.warm_up(prepared, top_k=self.moe.experts_per_token, max_tokens=engine_token_budget(),
                                     swiglu_limit=None if limit is None else float(limit))
        if counts:   # [] where a layer of the same shapes warmed them already (the kernels' own log is not vLLM's)
            log.info("nvfp4stack: %s: %s kernels compiled (or loaded from Triton's cache) for %d launch "
                     "configurations (token counts %s) in %.1f s", p, self.kernel, len(counts), counts,
                     time.perf_counter() - start)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        # Shared experts are run by vLLM's MoE runner (no internal modular kernel here).
        if layer.apply_router_weight_on_input:
            raise NotImplementedError(f"{self.prefix}: apply_router_weight_on_input is not supported by "
                                      f"{self.kernel}; use a vLLM MoE backend for this model")
        if layer.expert_map is not None:  # expert parallel: global ids -> local, -1 for other ranks' experts
            topk_weights, topk_ids = local_routing(layer.expert_map, topk_weights, topk_ids, self.skips_negative_ids)
        limit = getattr(layer, "swiglu_limit", None)
        return moe_forward_op(x, topk_weights, topk_ids, None if limit is None else float(limit),
                              layer.activation.value, self.kernel, self.prepared.tiled, self.prepared.routed_experts,
                              *self.op_tensors)
