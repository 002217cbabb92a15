"""Per-module decisions reach vLLM: the plugin's quant config answers get_quant_method(layer, prefix)
from the plan section (role defaults, per-layer exceptions, the MTP draft's own section)."""
import random
from types import SimpleNamespace as NS

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.engine.plan_section import SECTION_KEY, EnginePlan, engine_plan_for
from nvfp4stack.plan.planner import PlanError

NVFP4 = {"scheme": "nvfp4", "kernel": "torch_emulation"}
BF16 = {"scheme": "bf16", "kernel": "unquantized"}


def _modelopt_cfg(bf16_layers):
    """modelopt's NVFP4 export config with the planned-BF16 expert layers in its ignore list."""
    return {"quant_method": "modelopt", "quant_algo": "NVFP4",
            "ignore": ["lm_head", *(f"model.layers.{i}.mlp.experts*" for i in bf16_layers)],
            "config_groups": {"g": {"input_activations": {"num_bits": 4}, "weights": {"num_bits": 4}}}}


@pytest.fixture(scope="module")
def registered():
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization import get_quantization_config

    from nvfp4stack.engine.plugin import register

    assert register() is True
    return get_quantization_config("nvfp4stack")


def _experts_layer():
    """A RoutedExperts as get_quant_method sees it (isinstance + moe_config), without building
    vLLM's parallel state: the test is about the choice per prefix, not the layer's weights."""
    import torch
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    layer = RoutedExperts.__new__(RoutedExperts)
    torch.nn.Module.__init__(layer)
    layer.moe_config = NS(is_act_and_mul=True)
    return layer


def test_mixed_layers_get_the_planned_method_per_prefix(registered):
    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE

    rng = random.Random(1234)
    n_layers = 8
    bf16 = sorted(rng.sample(range(1, n_layers), 3))   # e.g. "layers 1-3 experts BF16, the rest NVFP4"
    plan = EnginePlan({"routed_experts": NVFP4}, {"routed_experts": {str(i): BF16 for i in bf16}})
    qcfg = registered.from_config({**_modelopt_cfg(bf16), SECTION_KEY: plan.to_dict()})
    layer = _experts_layer()
    for i in range(1, n_layers):
        prefix = f"model.layers.{i}.mlp.experts"
        method = qcfg.get_quant_method(layer, prefix)
        if i in bf16:
            assert method is None, f"{prefix}: planned BF16, got {type(method).__name__}"  # vLLM: Unquantized
        else:
            assert isinstance(method, Nvfp4StackModelOptMoE), f"{prefix}: planned NVFP4, got {method}"
            assert (method.kernel, method.prefix) == ("torch_emulation", prefix)


def test_checkpoint_that_disagrees_with_the_plan_is_refused_at_the_module(registered):
    plan = EnginePlan({"routed_experts": NVFP4}, {"routed_experts": {"2": BF16}})
    layer = _experts_layer()
    # the checkpoint quantized layer 2 although the plan keeps it BF16
    qcfg = registered.from_config({**_modelopt_cfg([]), SECTION_KEY: plan.to_dict()})
    with pytest.raises(ValueError, match=r"model.layers.2.mlp.experts: the plan keeps it BF16.*Fix: re-quantize"):
        qcfg.get_quant_method(layer, "model.layers.2.mlp.experts")
    # the checkpoint left layer 3 unquantized although the plan runs it NVFP4
    qcfg = registered.from_config({**_modelopt_cfg([2, 3]), SECTION_KEY: plan.to_dict()})
    with pytest.raises(ValueError, match=r"model.layers.3.mlp.experts: the plan runs it as NVFP4.*excludes it"):
        qcfg.get_quant_method(layer, "model.layers.3.mlp.experts")


def test_mtp_draft_modules_read_the_mtp_section(tmp_path):
    """DSV4: vLLM numbers the MTP draft's layers after the main model's (model.layers.61. on Pro);
    the untouched MXFP4 draft experts must not take the main experts' NVFP4 decision."""
    cfg = compose_config("recipe=dsv4_h200", f"run_dir={tmp_path}")
    plan = engine_plan_for(cfg)
    assert plan.mtp_first_layer == 61
    # the release's MXFP4 experts, cast to NVFP4 at load for our kernel (engine/moe_cast_method.py)
    assert plan.entry_for("model.layers.60.ffn.experts") == {"scheme": "nvfp4_w4a16", "kernel": "triton_w4a16",
                                                             "cast": "mxfp4_to_nvfp4"}
    assert plan.entry_for("model.layers.61.ffn.experts")["scheme"] == "mxfp4"
    assert plan.entry_for("model.layers.61.e_proj")["scheme"] == "fp8_block"
    assert EnginePlan.from_dict(plan.to_dict()) == plan
    off = engine_plan_for(compose_config("recipe=dsv4_h200", "engine.speculative.method=null", f"run_dir={tmp_path}"))
    assert not off.mtp and off.mtp_first_layer is None and "mtp" not in off.to_dict()


def test_mtp_section_needs_its_first_layer():
    with pytest.raises(ValueError, match="nvfp4stack.mtp: roles given without first_layer"):
        EnginePlan({}, {}, {"routed_experts": NVFP4})


def test_split_moe_layer_is_refused_naming_both_groups():
    from nvfp4stack.engine.plan_section import engine_plan_from_plan
    from nvfp4stack.schemes import Scheme

    g = lambda name, kernel, s: NS(name=name, role="routed_experts", mtp=False, served=s, kernel=kernel)
    plan = NS(groups=[g("layers.1.ffn.experts.0.w1", "torch_emulation", Scheme.NVFP4),
                      g("layers.1.ffn.experts.3.w1", "unquantized", Scheme.BF16)], num_hidden_layers=4)
    with pytest.raises(PlanError, match=r"layer 1 .*experts.0.w1.*experts.3.w1.*Fix: make the precision rules"):
        engine_plan_from_plan(plan)


def test_modelopt_mixed_precision_checkpoint_per_prefix(registered):
    """modelopt's MIXED_PRECISION form (DeepSeek-V4 export): the layers absent from quantized_layers
    are the unquantized ones, and they must be exactly the layers the plan keeps BF16."""
    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE

    rng = random.Random(99)
    bf16 = sorted(rng.sample(range(0, 6), 2))
    nvfp4_layers = [i for i in range(6) if i not in bf16]
    mixed = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
             "exclude_modules": [],
             "quantized_layers": {f"model.layers.{i}.ffn.experts.{e}.{w}": {"quant_algo": "NVFP4", "group_size": 16}
                                  for i in nvfp4_layers for e in range(2) for w in ("w1", "w2", "w3")}}
    plan = EnginePlan({"routed_experts": NVFP4}, {"routed_experts": {str(i): BF16 for i in bf16}})
    qcfg = registered.from_config({**mixed, SECTION_KEY: plan.to_dict()})
    layer = _experts_layer()
    for i in range(6):
        method = qcfg.get_quant_method(layer, f"model.layers.{i}.ffn.experts")
        assert (method is None) == (i in bf16) and (method is None or isinstance(method, Nvfp4StackModelOptMoE))
    wrong = EnginePlan({"routed_experts": NVFP4})  # the plan runs every layer NVFP4
    qcfg = registered.from_config({**mixed, SECTION_KEY: wrong.to_dict()})
    with pytest.raises(ValueError, match=rf"model.layers.{bf16[0]}.ffn.experts: the plan runs it as NVFP4"):
        qcfg.get_quant_method(layer, f"model.layers.{bf16[0]}.ffn.experts")


def test_nvfp4_experts_get_an_nvfp4_config_whatever_the_base(registered):
    """vLLM's ModelOptNvFp4FusedMoE.create_weights reads NVFP4 fields off its quant_config; on an
    H200 (vLLM 0.26) the DeepSeek-V4 base, DeepseekV4FP8Config, has none (AttributeError:
    is_checkpoint_nvfp4_serialized). Our method gets vLLM's own NVFP4 config in its place."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE
    from nvfp4stack.engine.quant_config import nvfp4_moe_config

    fp8_cfg = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
               "weight_block_size": [128, 128]}
    for name in ("deepseek_v4_fp8", "fp8"):
        base = get_quantization_config(name).from_config(fp8_cfg)
        cfg = nvfp4_moe_config(base)
        assert isinstance(cfg, ModelOptNvFp4Config) and cfg is not base, name
        assert cfg.is_checkpoint_nvfp4_serialized and cfg.group_size == 16, name
    nv = get_quantization_config("modelopt_fp4").from_config(
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    assert nvfp4_moe_config(nv) is nv  # vLLM's own NVFP4 config is kept as it is

    plan = EnginePlan({"routed_experts": NVFP4}, {})
    qcfg = registered.from_config({**fp8_cfg, SECTION_KEY: plan.to_dict()})
    assert qcfg.base_name == "fp8"
    method = qcfg.get_quant_method(_experts_layer(), "model.layers.1.mlp.experts")
    assert isinstance(method, Nvfp4StackModelOptMoE)
    assert method.quant_config.is_checkpoint_nvfp4_serialized
