"""Serve the release's MXFP4 routed experts on our NVFP4 kernels: the cast happens at load, per rank.

vLLM loads the checkpoint's experts into the parameters of its own ``Mxfp4MoEMethod`` (its
``create_weights``, so names, shapes and the TP/EP split are vLLM's: under EP each rank holds only its
local experts). ``process_weights_after_loading`` then casts them to NVFP4 on the device they are on
(``convert/expert_cast.py``: the offline converters' functions, the same bytes as ``convert``), puts
the NVFP4 scales in place of the UE8M0 ones, and hands the experts to the planned backend exactly as
:class:`Nvfp4StackModelOptMoE` does for a checkpoint that stores NVFP4.

The class name must not contain "ModelOpt": vLLM's FusedMoE weight loader treats those methods' scales
as modelopt's per-tensor ones; these are MXFP4 block scales ("block" quant_method, vLLM's generic path).
"""
from __future__ import annotations

import logging

import torch
from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

from nvfp4stack.convert.expert_cast import cast_stacked_experts
from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE

log = logging.getLogger("vllm.nvfp4stack")


def top_all_reduce(moe_config):
    """The MAX all-reduce of the cast's top exponents over the ranks that share each expert's rows
    (vLLM's MoE tensor parallelism), or None when every rank holds whole experts (one GPU, or EP)."""
    par = moe_config.moe_parallel_config
    if par.tp_size == 1:
        return None
    if par.dp_size != 1:
        raise ValueError(
            f"routed experts: the load-time MXFP4 -> NVFP4 cast shards experts over tensor x data parallel "
            f"ranks (tp {par.tp_size}, dp {par.dp_size}, no expert parallelism), whose group it cannot "
            "all-reduce over. Fix: engine.ep=true, or convert the checkpoint first (python main.py ... convert) "
            "and serve the converted copy")
    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    group = get_tp_group().device_group

    def reduce(top: torch.Tensor) -> None:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)

    return reduce


class Nvfp4StackMxfp4CastMoE(Nvfp4StackModelOptMoE):
    """Routed experts stored MXFP4 (the release), cast to NVFP4 at load, run on an nvfp4stack kernel."""

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        Mxfp4MoEMethod.create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                                      params_dtype, **extra_weight_attrs)

    def process_weights_after_loading(self, layer) -> None:
        if getattr(layer, "w13_bias", None) is not None:
            raise ValueError(f"{self.prefix}: MXFP4 experts with biases (w13_bias/w2_bias) have no NVFP4 form "
                             "in nvfp4stack's kernels; serve this model with a vLLM MoE backend")
        w13, w2, stats = cast_stacked_experts(layer.w13_weight.data, layer.w13_weight_scale.data,
                                              layer.w2_weight.data, layer.w2_weight_scale.data,
                                              reduce_top=top_all_reduce(self.moe))
        # the UE8M0 scales go; the parameters hold the NVFP4 scales (the codes were cast in place)
        layer.w13_weight_scale = torch.nn.Parameter(w13.scale, requires_grad=False)
        layer.w2_weight_scale = torch.nn.Parameter(w2.scale, requires_grad=False)
        layer.w13_weight_scale_2 = torch.nn.Parameter(w13.global_scale, requires_grad=False)
        layer.w2_weight_scale_2 = torch.nn.Parameter(w2.global_scale, requires_grad=False)
        log.info("nvfp4stack: %s: %d MXFP4 experts cast to NVFP4 at load on %s (%d blocks re-rounded below "
                 "E4M3's range, %d w1/w3 blocks re-rounded to the shared global scale)", self.prefix,
                 stats["experts"], w13.data.device, stats["inexact_blocks"], stats["w13_requantized_blocks"])
        self.install(layer, w13, w2, None, None)
