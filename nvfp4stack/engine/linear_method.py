"""Linear method for nvfp4stack's own linear backends (kernels/linear/: torch_emulation on CPU, ...).

It subclasses vLLM's method for the stored format only to take its parameter layout, so checkpoint
loading (names, merged projections, the TP split) is vLLM's own code path: FP8 block linears get
``Fp8LinearMethod``'s parameters (``weight`` [N, K] E4M3, ``weight_scale_inv`` [ceil(N/bn), ceil(K/bk)]).
vLLM's kernel choice is skipped (on CPU it asks for AMX, which a pure-torch backend does not need):
``process_weights_after_loading`` hands the loaded parameters, as a typed container of views (no
copy), to the planned backend's ``prepare``, and ``apply`` calls its ``apply`` through an opaque op.
"""
from __future__ import annotations

import logging

import torch
from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod

from nvfp4stack.convert.groups import fp8_from_group
from nvfp4stack.formats.fp8_block import Fp8BlockTensor
from nvfp4stack.kernels.base import LINEAR_BACKENDS, RunnableLinearBackend, runnable_backend
from nvfp4stack.schemes import Scheme

log = logging.getLogger("vllm.nvfp4stack")  # under vLLM's logger: its handlers, in the server log

# op key -> (prepared without bias, prepared with the layer's bias or None); set at load, read per call
_PREPARED: dict[str, tuple] = {}


def runnable_linear_backend(kernel: str, prefix: str) -> type[RunnableLinearBackend]:
    """The registered linear backend ``kernel``, which must be one nvfp4stack runs (prepare/apply)."""
    return runnable_backend("linear", kernel, prefix, "plan the linear on one of those, or leave it to vLLM's method")


def _op_key(prefix: str) -> str:
    """A key per method, stable across runs (vLLM's compile cache hashes the graph, strings included):
    the prefix, suffixed only where a second model in this process has a module of the same prefix."""
    key, n = prefix, 1
    while key in _PREPARED:
        key, n = f"{prefix}#{n}", n + 1
    _PREPARED[key] = (None, None)
    return key


@torch.library.custom_op("nvfp4stack::linear_forward", mutates_args=())
def linear_forward_op(x: torch.Tensor, kernel: str, key: str, out_features: int, with_bias: bool) -> torch.Tensor:
    """Opaque op around the backend's ``apply``: vLLM's torch.compile traces the model in one graph,
    and the prepared form (a typed container, not a tensor) must not be traced into it."""
    plain, biased = _PREPARED[key]
    return LINEAR_BACKENDS.get(kernel).apply(biased if with_bias else plain, x)


@linear_forward_op.register_fake
def _(x, kernel, key, out_features, with_bias):
    return x.new_empty((*x.shape[:-1], out_features))


class Nvfp4StackFp8BlockLinear(Fp8LinearMethod):
    """An FP8 block linear (merged projections included) run by the planned nvfp4stack backend."""

    def __init__(self, quant_config, *, kernel: str, prefix: str):
        # vLLM's __init__ picks activation-quant keys and DeepGEMM for its kernels: none run here
        self.quant_config = quant_config
        self.kernel = kernel
        self.prefix = prefix
        self.backend = runnable_linear_backend(kernel, prefix)  # fail here, naming the valid ones
        self.weight_block_size = quant_config.weight_block_size
        if self.weight_block_size is None:
            raise ValueError(f"{prefix}: the plan serves it as {Scheme.FP8_BLOCK.value} on {kernel}, but the "
                             "checkpoint's quantization_config has no weight_block_size (per-tensor FP8). Fix: "
                             "plan it as stored, or re-export the checkpoint with block scales")
        self.block_quant = True
        self.is_scale_e8m0 = getattr(quant_config, "is_scale_e8m0", False)
        self.key = _op_key(prefix)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        # Fp8LinearMethod.create_weights' block path, parameters only (no vLLM kernel is chosen)
        from vllm.model_executor.layers.quantization.utils.fp8_utils import (
            create_fp8_scale_parameter,
            create_fp8_weight_parameter,
            validate_fp8_block_shape,
        )
        from vllm.model_executor.parameter import BlockQuantScaleParameter

        weight_loader = extra_weight_attrs.get("weight_loader")
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = sum(output_partition_sizes)
        layer.orig_dtype = params_dtype
        layer.weight_block_size = self.weight_block_size
        validate_fp8_block_shape(layer, input_size, output_size, input_size_per_partition, output_partition_sizes,
                                 self.weight_block_size)
        layer.register_parameter("weight", create_fp8_weight_parameter(
            layer.output_size_per_partition, input_size_per_partition, weight_loader))
        layer.register_parameter("weight_scale_inv", create_fp8_scale_parameter(  # vLLM's name for block scales
            BlockQuantScaleParameter, output_partition_sizes, input_size_per_partition, self.weight_block_size,
            weight_loader, scale_dtype=torch.float8_e8m0fnu if self.is_scale_e8m0 else None))

    def typed_weight(self, layer) -> Fp8BlockTensor:
        """The loaded parameters as one Fp8BlockTensor [sum N, K] (this rank's shard), views only:
        merged projections stack whole blocks (vLLM checks each part but the last is a multiple of bn)."""
        return fp8_from_group({"weight": layer.weight.data, "weight_scale_inv": layer.weight_scale_inv.data},
                              self.prefix, self.weight_block_size)

    def process_weights_after_loading(self, layer) -> None:
        weight = self.typed_weight(layer)
        bias = getattr(layer, "bias", None)
        prepared = self.backend.prepare(weight)
        biased = self.backend.prepare(weight, bias.data) if bias is not None else None
        _PREPARED[self.key] = (prepared, biased)
        log.debug("nvfp4stack: %s: FP8 block %s on %s", self.prefix, tuple(weight.shape), self.kernel)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # vLLM passes the layer's bias, or None where this rank must not add it (row parallel, rank > 0)
        if bias is not None and bias is not getattr(layer, "bias", None):
            raise ValueError(f"{self.prefix}: apply got a bias that is not the layer's own; {self.kernel} "
                             "prepared the layer's bias at load")
        return linear_forward_op(x, self.kernel, self.key, layer.output_size_per_partition, bias is not None)


def own_linear_method(base, entry: dict, kernel: str, prefix: str):
    """The method for a linear the plan puts on nvfp4stack kernel ``kernel``, by the scheme it serves."""
    scheme = Scheme(entry["scheme"])
    if scheme is Scheme.FP8_BLOCK:
        return Nvfp4StackFp8BlockLinear(base, kernel=kernel, prefix=prefix)
    raise NotImplementedError(
        f"{prefix}: the plan serves this linear as {scheme.value} on nvfp4stack kernel {kernel!r}; nvfp4stack's "
        f"linear method runs {Scheme.FP8_BLOCK.value} only so far. Fix: backend.linear=vllm_emulation (or "
        "another vLLM backend) for NVFP4 linears")
