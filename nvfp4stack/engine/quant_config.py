"""vLLM quantization config ``nvfp4stack``: the checkpoint's own vLLM config, steered by the plan.

It wraps the vLLM config the checkpoint would get anyway (modelopt NVFP4, modelopt
MIXED_PRECISION, fp8, ...) and asks it for every module's method, except where the plan puts a
module on a kernel nvfp4stack implements: those get our FusedMoE / linear method. Modules on
vLLM's own backends keep vLLM's methods, selected by vLLM's flags (--moe-backend, ...).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from nvfp4stack.engine.plan_section import QUANT_METHOD, SECTION_KEY, EnginePlan
from nvfp4stack.families.registry import families
from nvfp4stack.schemes import Scheme

log = logging.getLogger("vllm.nvfp4stack")  # under vLLM's logger: its handlers, in the server log


def _built(prefix: str, method):
    """Log the method vLLM builds for a MoE module (tests read the server log for it). None means
    vLLM's own default, UnquantizedFusedMoEMethod (routed_experts.py: ``if quant_method is None``)."""
    log.info("nvfp4stack: %s -> %s", prefix, type(method).__name__ if method is not None else "UnquantizedFusedMoEMethod")
    return method


def base_methods() -> tuple[str, ...]:
    """Built-in vLLM methods our wrapper may sit on, most specific first (vLLM's own override order):
    modelopt's, then the model families' own formats (``ModelFamily.vllm_quant_methods``), then fp8."""
    own = tuple(m for f in families() for m in f.vllm_quant_methods)
    return ("modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8", "modelopt", *own, "fp8")


def base_method_for(hf_quant_cfg: dict, hf_config: Any = None) -> str:
    """The built-in vLLM method that claims this checkpoint config (what vLLM would pick without us)."""
    for name in base_methods():
        cls = get_quantization_config(name)
        if cls.override_quantization_method(hf_quant_cfg, None, hf_config=hf_config) == name:
            return name
    qm = hf_quant_cfg.get("quant_method")
    if qm is None:
        raise ValueError(f"quantization_config: no quant_method and no vLLM method claims it "
                         f"(keys {sorted(hf_quant_cfg)}); the checkpoint is not a quantized export")
    return qm


def draft_quant_method(plan: EnginePlan, hf_quant_cfg: dict, hf_config: dict) -> str:
    """The ``quantization`` of an MTP draft served beside this plugin's quantization.

    vLLM 0.26 builds the draft's ModelConfig from the checkpoint's own config.json: a dict --hf-overrides
    (how the plan reaches the target) is not applied to the draft (``SpeculativeConfig.compose_draft_hf_overrides``),
    and the draft inherits ``--quantization nvfp4stack``, which the checkpoint's config then contradicts (the
    2026-11-27 four-H200 start: "Quantization method specified in the model config (fp8) does not match ...
    (nvfp4stack)"). The draft gets the vLLM method the checkpoint has without us, which serves exactly what
    our wrapper would for a module the plan keeps on vLLM's kernels: right only when the plan keeps every MTP
    module there. ``hf_config``: the checkpoint's config.json."""
    own = plan.own_mtp_roles()
    if own:
        raise ValueError(
            f"engine.speculative: the plan runs the MTP draft's {', '.join(own)} on nvfp4stack kernels, but vLLM "
            "builds the draft from the checkpoint's own quantization_config (the plan reaches only the target "
            "model), so the draft cannot load them. Fix: keep the MTP block on vLLM's kernels (the recipe's "
            "precision for MTP: untouched), or engine.speculative.method=null")
    from types import SimpleNamespace

    base = {k: v for k, v in hf_quant_cfg.items() if k != SECTION_KEY}
    return base_method_for(base, SimpleNamespace(**hf_config))


def nvfp4_moe_config(base: QuantizationConfig) -> QuantizationConfig:
    """The config our NVFP4 MoE method hands to ``ModelOptNvFp4FusedMoE.create_weights``, which
    reads NVFP4 fields (``is_checkpoint_nvfp4_serialized``, ``group_size``) off it: the base itself
    where it is vLLM's NVFP4 config, else one describing the NVFP4 experts the plan serves. (A family's
    own base config, e.g. an FP8 release format's, has no such fields: AttributeError on an H200.)"""
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    if isinstance(base, ModelOptNvFp4Config):
        return base
    return ModelOptNvFp4Config(is_checkpoint_nvfp4_serialized=True, kv_cache_quant_algo=None,
                               exclude_modules=[], group_size=16)


class Nvfp4StackConfig(QuantizationConfig):
    """Registered as ``nvfp4stack`` by the plugin; claims configs carrying the plan section."""

    def __init__(self, plan: EnginePlan, base: QuantizationConfig, base_name: str):
        super().__init__()
        self.plan = plan
        self.base = base
        self.base_name = base_name

    # -- identity -------------------------------------------------------------------------------
    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        # fp32 too: the CPU numerics check serves in fp32 to compare with the torch reference.
        return [torch.bfloat16, torch.half, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # torch_emulation runs anywhere; vLLM-backed modules keep their own checks

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        if isinstance(hf_quant_cfg, dict) and SECTION_KEY in hf_quant_cfg:
            return QUANT_METHOD
        return None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Nvfp4StackConfig":
        if SECTION_KEY not in config:
            raise ValueError(
                f"quantization_config: --quantization {QUANT_METHOD} needs a {SECTION_KEY!r} section "
                f"(the plan); found keys {sorted(config)}. Start the server with `main.py serve`, which "
                "passes it through --hf-overrides"
            )
        plan = EnginePlan.from_dict(config[SECTION_KEY])
        base_cfg = {k: v for k, v in config.items() if k != SECTION_KEY}
        base_name = base_method_for(base_cfg)
        base = get_quantization_config(base_name).from_config(base_cfg)
        return cls(plan, base, base_name)

    # -- the base config sees everything the model tells the quant config -----------------------
    @property
    def packed_modules_mapping(self):
        return self.base.packed_modules_mapping if hasattr(self, "base") else self._pmm

    @packed_modules_mapping.setter
    def packed_modules_mapping(self, value):
        if hasattr(self, "base"):
            self.base.packed_modules_mapping = value
        else:
            self._pmm = value  # set by QuantizationConfig.__init__ before base exists

    def apply_vllm_mapper(self, hf_to_vllm_mapper):
        self.base.apply_vllm_mapper(hf_to_vllm_mapper)

    def maybe_update_config(self, model_name, hf_config=None, revision=None):
        self.base.maybe_update_config(model_name, hf_config=hf_config, revision=revision)

    def get_cache_scale_mapper(self):
        return self.base.get_cache_scale_mapper()

    # -- per module -----------------------------------------------------------------------------
    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        # Imported here, not at module level: the plugin runs in the API server process too,
        # which never builds layers and need not import vLLM's MoE stack.
        from vllm.model_executor.layers.fused_moe import RoutedExperts
        from vllm.model_executor.layers.linear import LinearBase

        if isinstance(layer, RoutedExperts):
            kernel = self.plan.own_kernel(prefix, "moe")
            if kernel is not None:
                from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE

                self._check_nvfp4_module(prefix)
                entry = self.plan.entry_for(prefix)
                method = Nvfp4StackModelOptMoE
                if entry.get("cast"):  # stored MXFP4 (the release): cast to NVFP4 at load
                    from nvfp4stack.engine.moe_cast_method import Nvfp4StackMxfp4CastMoE as method
                return _built(prefix, method(nvfp4_moe_config(self.base), layer.moe_config, kernel=kernel,
                                             scheme=Scheme(entry["scheme"]), prefix=prefix,
                                             fp8_prefill=bool(entry.get("fp8_prefill", False))))
            planned_bf16 = (self.plan.entry_for(prefix) or {}).get("scheme") == Scheme.BF16.value
            if planned_bf16 and not self._excluded(prefix, default=True):
                # before the base builds its quantized method: on CPU that already fails, obscurely
                self._refuse_quantized(prefix, f"does not exclude it (the {self.base_name} method would quantize it)")
            method = self.base.get_quant_method(layer, prefix)
            self._check_unquantized_module(prefix, method)
            return _built(prefix, method)
        elif isinstance(layer, LinearBase):
            kernel = self.plan.own_kernel(prefix, "linear")
            if kernel is not None:  # engine/linear_method.py: vLLM's parameters, our backend's prepare/apply
                from nvfp4stack.engine.linear_method import own_linear_method

                return own_linear_method(self.base, self.plan.entry_for(prefix), kernel, prefix)
        return self.base.get_quant_method(layer, prefix)

    def _excluded(self, prefix: str, default: bool) -> bool:
        """Whether the checkpoint's config leaves ``prefix`` unquantized; ``default`` when the base
        config cannot say (it has no exclude list)."""
        excluded = getattr(self.base, "is_layer_excluded", None)
        if excluded is None:
            return default
        if excluded(prefix):
            return True
        # modelopt's MIXED_PRECISION form: a module absent from quantized_layers stays unquantized
        algo_of = getattr(self.base, "_resolve_quant_algo", None)
        return algo_of is not None and algo_of(prefix) is None

    def _refuse_quantized(self, prefix: str, found: str) -> None:
        raise ValueError(
            f"{prefix}: the plan keeps it BF16, but the checkpoint's quantization_config ({self.base_name}) "
            f"{found}: the checkpoint was quantized with other precision rules. "
            "Fix: re-quantize with the recipe's rules (serve rebuilds the tiny model itself), or make the "
            "rules match the checkpoint")

    def _check_unquantized_module(self, prefix: str, method) -> None:
        """The plan keeps this module BF16: the checkpoint's own config must not quantize it."""
        entry = self.plan.entry_for(prefix)
        if entry is not None and entry["scheme"] == Scheme.BF16.value and method is not None \
                and not type(method).__name__.startswith("Unquantized"):
            self._refuse_quantized(prefix, f"gives it {type(method).__name__}")

    def _check_nvfp4_module(self, prefix: str) -> None:
        """The plan says NVFP4 here: the checkpoint must agree, else loading would fail obscurely."""
        if self._excluded(prefix, default=False):
            raise ValueError(
                f"{prefix}: the plan runs it as NVFP4 on an nvfp4stack kernel, but the checkpoint's "
                f"quantization_config ({self.base_name}) excludes it (stored unquantized). Fix the "
                "precision rules or re-quantize so both agree"
            )
