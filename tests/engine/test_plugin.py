"""Plugin registration, the nvfp4stack quant config's claims and per-module choices, the MoE method."""
import json
import logging
import random
import subprocess
import sys

import pytest
import torch

from nvfp4stack.engine.plan_section import (
    QUANT_METHOD,
    SECTION_KEY,
    EnginePlan,
    engine_plan_for,
    engine_plan_from_plan,
    quantization_config_with_plan,
)

MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "model.layers.0*"],
                  "config_groups": {"g": {"input_activations": {"num_bits": 4}, "weights": {"num_bits": 4}}}}
PLAN = EnginePlan({"routed_experts": {"scheme": "nvfp4", "kernel": "torch_emulation"}})


def test_plugin_module_imports_nothing_heavy():
    code = ("import sys, nvfp4stack.engine.plugin as p; "
            "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("nvfp4stack") == "nvfp4stack.engine.plugin:register"


@pytest.fixture(scope="module")
def registered():
    pytest.importorskip("vllm")
    from nvfp4stack.engine.plugin import register

    assert register() is True
    assert register() is True  # idempotent
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    assert QUANTIZATION_METHODS.count(QUANT_METHOD) == 1
    return get_quantization_config(QUANT_METHOD)


def test_cpu_nvfp4_linear_kernel_registered_once(registered):
    from vllm.model_executor.kernels.linear import _POSSIBLE_NVFP4_KERNELS
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum

    assert _POSSIBLE_NVFP4_KERNELS[PlatformEnum.CPU].count(EmulationNvFp4LinearKernel) == 1
    from vllm.model_executor.kernels.linear import init_nvfp4_linear_kernel
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # vLLM's own selection now finds a kernel for NVFP4 linears on CPU
        assert type(init_nvfp4_linear_kernel(use_a16=False)) is EmulationNvFp4LinearKernel


def test_claims_only_configs_with_the_plan(registered):
    with_plan = {**MODELOPT_NVFP4, SECTION_KEY: PLAN.to_dict()}
    assert registered.override_quantization_method(with_plan, None) == QUANT_METHOD
    assert registered.override_quantization_method(MODELOPT_NVFP4, None) is None
    assert registered.override_quantization_method(MODELOPT_NVFP4, QUANT_METHOD) is None


def test_wraps_the_config_vllm_would_pick(registered):
    cfg = registered.from_config({**MODELOPT_NVFP4, SECTION_KEY: PLAN.to_dict()})
    assert cfg.base_name == "modelopt_fp4" and cfg.base.exclude_modules[0] == "lm_head"
    assert torch.float32 in cfg.get_supported_act_dtypes()
    with pytest.raises(ValueError, match="needs a 'nvfp4stack' section"):
        registered.from_config(MODELOPT_NVFP4)
    with pytest.raises(ValueError, match="nvfp4stack.version: expected 1"):
        registered.from_config({**MODELOPT_NVFP4, SECTION_KEY: {"version": 0, "roles": {}}})


def test_claims_modelopt_mixed_precision_checkpoints(registered):
    """modelopt's DeepSeek-V4 export (MIXED_PRECISION, NVFP4 routed experts) keeps vLLM's mixed config."""
    mixed = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
             "exclude_modules": [], "quantized_layers": {"layers.0.ffn.experts.0.w1": {"quant_algo": "NVFP4",
                                                                                        "group_size": 16}}}
    assert registered.override_quantization_method({**mixed, SECTION_KEY: PLAN.to_dict()}, None) == QUANT_METHOD
    cfg = registered.from_config({**mixed, SECTION_KEY: PLAN.to_dict()})
    assert cfg.base_name == "modelopt_mixed" and type(cfg.base).__name__ == "ModelOptMixedPrecisionConfig"


def test_quantization_config_with_plan_reads_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": MODELOPT_NVFP4}))
    q = quantization_config_with_plan(tmp_path, PLAN)
    assert q[SECTION_KEY] == PLAN.to_dict() and q["quant_algo"] == "NVFP4"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    with pytest.raises(ValueError, match="no quantization_config"):
        quantization_config_with_plan(tmp_path, PLAN)


def test_plan_roles_and_kernels():
    assert PLAN.own_kernel("model.layers.1.mlp.experts", "moe") == "torch_emulation"
    assert PLAN.own_kernel("model.layers.1.self_attn.o_proj", "linear") is None
    vllm_plan = EnginePlan({"routed_experts": {"scheme": "nvfp4", "kernel": "flashinfer_trtllm"}})
    assert vllm_plan.own_kernel("model.layers.1.mlp.experts", "moe") is None and not vllm_plan.needs_plugin()
    with pytest.raises(ValueError, match="unknown scheme"):
        EnginePlan({"routed_experts": {"scheme": "fp5", "kernel": "x"}})


def test_engine_plan_from_planner_plan_keeps_per_layer_decisions():
    from types import SimpleNamespace as NS

    from nvfp4stack.plan.planner import PlanError
    from nvfp4stack.schemes import Scheme

    def g(name, kernel, served=Scheme.NVFP4):
        return NS(name=name, role="routed_experts", mtp=False, served=served, kernel=kernel)

    plan = engine_plan_from_plan(NS(groups=[g("layers.0.ffn.experts.0.w1", "torch_emulation"),
                                            g("layers.1.ffn.experts.0.w1", "torch_emulation")]))
    assert plan.roles == {"routed_experts": {"scheme": "nvfp4", "kernel": "torch_emulation"}} and not plan.layers
    # a rule keeping layer 0's experts BF16: the majority is the role default, layer 0 an exception
    plan = engine_plan_from_plan(NS(groups=[g("layers.0.ffn.experts.0.w1", "unquantized", Scheme.BF16),
                                            g("layers.1.ffn.experts.0.w1", "torch_emulation"),
                                            g("layers.2.ffn.experts.0.w1", "torch_emulation")]))
    assert plan.layers == {"routed_experts": {"0": {"scheme": "bf16", "kernel": "unquantized"}}}
    assert plan.own_kernel("model.layers.0.ffn.experts", "moe") is None
    assert plan.own_kernel("model.layers.2.ffn.experts", "moe") == "torch_emulation"
    assert EnginePlan.from_dict(plan.to_dict()) == plan  # survives --hf-overrides
    # experts of one layer split between two kernels: vLLM builds one method per MoE layer
    with pytest.raises(PlanError, match="role 'routed_experts' has two decisions in layer 1"):
        engine_plan_from_plan(NS(groups=[g("layers.1.ffn.experts.0.w1", "torch_emulation"),
                                         g("layers.1.ffn.experts.1.w1", "marlin")]))
    # an MTP draft asked of a model without MTP layers is refused, naming the key and the fix
    with pytest.raises(PlanError, match=r"engine.speculative.method=mtp: qwen3_moe has no multi-token.*"
                                        r"Fix: engine.speculative.method=null"):
        engine_plan_from_plan(NS(groups=[g("layers.0.mlp.experts.0.gate_proj", "torch_emulation")],
                                 family="qwen3_moe"), mtp_draft=True)


def test_local_routing_under_expert_parallel():
    """Global -> local expert ids (vLLM's expert_map, -1 for other ranks' experts): a backend that skips
    negative ids gets them as they are; the others get those slots on expert 0 with weight 0."""
    from nvfp4stack.engine.moe_method import local_routing
    from nvfp4stack.kernels.base import MOE_BACKENDS

    expert_map = torch.tensor([-1, -1, 0, 1, -1, 2], dtype=torch.int32)  # this rank holds experts 2, 3, 5
    ids = torch.tensor([[2, 0], [4, 5], [3, 1]], dtype=torch.int64)
    wts = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
    w, local = local_routing(expert_map, wts, ids, skips_negative=True)
    assert torch.equal(local, torch.tensor([[0, -1], [-1, 2], [1, -1]])) and local.dtype == ids.dtype
    assert torch.equal(w, wts)
    w, local = local_routing(expert_map, wts, ids, skips_negative=False)
    assert torch.equal(local, torch.tensor([[0, 0], [0, 2], [1, 0]]))
    assert torch.equal(w, torch.tensor([[0.6, 0.0], [0.0, 0.7], [0.5, 0.0]]))
    assert MOE_BACKENDS.get("triton_w4a16").capabilities.negative_expert_ids
    assert not MOE_BACKENDS.get("torch_emulation").capabilities.negative_expert_ids


class FakeExpertsLayer(torch.nn.Module):
    """The parameters vLLM's ModelOptNvFp4FusedMoE.create_weights registers, filled by the loader."""

    def __init__(self, w13, w2, a13, a2):
        super().__init__()
        P = lambda t: torch.nn.Parameter(t, requires_grad=False)
        self.w13_weight, self.w13_weight_scale = P(w13.data), P(w13.scale)
        self.w13_weight_scale_2 = P(w13.global_scale[:, None].repeat(1, 2))
        self.w2_weight, self.w2_weight_scale, self.w2_weight_scale_2 = P(w2.data), P(w2.scale), P(w2.global_scale)
        self.w13_input_scale, self.w2_input_scale = P(a13[:, None].repeat(1, 2)), P(a2)
        self.apply_router_weight_on_input = False
        self.expert_map = None
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        self.activation = MoEActivation.SILU


def test_moe_method_runs_planned_backend_on_packed_weights(registered):
    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward
    from nvfp4stack.schemes import Scheme

    seed = random.randrange(2**31)
    print(f"seed={seed}")
    g = torch.Generator().manual_seed(seed)
    E, H, I, T, K = 4, 64, 32, 9, 2
    w13 = quantize_nvfp4(torch.randn(E, 2 * I, H, generator=g))
    w2 = quantize_nvfp4(torch.randn(E, H, I, generator=g))
    a13, a2 = torch.rand(E, generator=g) * 0.01 + 1e-3, torch.rand(E, generator=g) * 0.01 + 1e-3
    layer = FakeExpertsLayer(w13, w2, a13, a2)
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    wts = torch.rand(T, K, generator=g)
    for scheme, scales in ((Scheme.NVFP4, (a13, a2)), (Scheme.NVFP4_W4A16, (None, None))):
        m = Nvfp4StackModelOptMoE.__new__(Nvfp4StackModelOptMoE)
        Nvfp4StackModelOptMoE.__init__(m, None, _moe_config(), kernel="torch_emulation", scheme=scheme,
                                       prefix="model.layers.1.mlp.experts")
        m.process_weights_after_loading(layer)
        assert m.prepared.weights.w13.data.data_ptr() == layer.w13_weight.data_ptr(), "weights must stay packed, not copied"
        got = m.apply(layer, x, wts, ids, None, None)
        want = nvfp4_moe_forward(x, w13, w2, wts, ids, a13_scale=scales[0], a2_scale=scales[1])
        assert torch.equal(got, want) and got.abs().sum() > 0
    layer.w13_weight_scale_2.data[2, 1] *= 2
    with pytest.raises(ValueError, match=r"experts.w13_weight_scale_2: expert 2 has w1"):
        m.process_weights_after_loading(layer)


def _moe_config():
    from types import SimpleNamespace as NS

    return NS(is_act_and_mul=True, experts_per_token=2)  # FusedMoEMethodBase only stores it; top-k for warm-up


def test_moe_method_fp8_prefill_builds_the_copy_once_and_hands_it_to_the_backend(registered, monkeypatch, caplog):
    """backend.moe_fp8_prefill: triton_w4a16's ``prepare`` builds the FP8 copy at load from the packed
    NVFP4 experts and it reaches the backend's ``apply`` through the opaque op. The backend here is
    triton_w4a16 with ``apply`` and ``warm_up`` recording and running the FP8 path's CPU twin:
    its kernels need a GPU."""
    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4
    from nvfp4stack.kernels.base import MOE_BACKENDS
    from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import fp8_moe_forward_emulated, prepare_fp8_experts
    from nvfp4stack.kernels.moe.triton_w4a16 import TritonW4A16Moe
    from nvfp4stack.schemes import Scheme

    seen = {}

    class Recorder(TritonW4A16Moe):
        @classmethod
        def apply(cls, prepared, x, topk_weights, topk_ids, *, swiglu_limit=None, activation="silu"):
            seen.update(fp8=prepared.fp8)
            return fp8_moe_forward_emulated(x, prepared.fp8, topk_weights, topk_ids, swiglu_limit=swiglu_limit)

        @classmethod
        def warm_up(cls, prepared, *, top_k, max_tokens, swiglu_limit):
            seen.update(warm=(top_k, max_tokens, prepared.fp8))
            return [1, 6]

    monkeypatch.setitem(MOE_BACKENDS._items, "fp8_recorder", Recorder)
    g = torch.Generator().manual_seed(random.randrange(2**31))
    E, H, I, T, K = 4, 64, 32, 7, 2
    w13, w2 = quantize_nvfp4(torch.randn(E, 2 * I, H, generator=g)), quantize_nvfp4(torch.randn(E, H, I, generator=g))
    layer = FakeExpertsLayer(w13, w2, torch.ones(E), torch.ones(E))
    m = Nvfp4StackModelOptMoE.__new__(Nvfp4StackModelOptMoE)
    Nvfp4StackModelOptMoE.__init__(m, None, _moe_config(), kernel="fp8_recorder", scheme=Scheme.NVFP4_W4A16,
                                   prefix="model.layers.1.mlp.experts", fp8_prefill=True)
    with caplog.at_level(logging.INFO, logger="vllm.nvfp4stack"):
        m.process_weights_after_loading(layer)
    # the warm-up's counts reach vLLM's log (a worker's own kernels logger has no handler there)
    assert "model.layers.1.mlp.experts: fp8_recorder kernels compiled" in caplog.text
    assert "for 2 launch configurations (token counts [1, 6])" in caplog.text
    fp8 = m.prepared.fp8
    # the backend is asked to compile ahead at load: top-k of the layer, the token budget (vLLM's
    # default outside an engine), and the FP8 copy it will be handed
    assert seen["warm"][0] == 2 and seen["warm"][1] >= 1 and seen["warm"][2] is fp8
    want_fp8 = prepare_fp8_experts(w13, w2)
    for a, b in ((fp8.w13, want_fp8.w13), (fp8.w2_scale, want_fp8.w2_scale)):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    wts = torch.rand(T, K, generator=g)
    got = m.apply(layer, x, wts, ids, None, None)
    assert seen["fp8"].w13.data_ptr() == fp8.w13.data_ptr()
    assert torch.equal(got, fp8_moe_forward_emulated(x, want_fp8, wts, ids)) and got.abs().sum() > 0
    with pytest.raises(ValueError, match="torch_emulation has no FP8 prefill mode"):
        Nvfp4StackModelOptMoE(None, _moe_config(), kernel="torch_emulation", scheme=Scheme.NVFP4_W4A16,
                              prefix="p", fp8_prefill=True).process_weights_after_loading(layer)


def test_moe_method_under_expert_parallel(registered, monkeypatch):
    """EP: vLLM hands the method global ids and its expert_map. triton_w4a16 (here with ``apply`` and
    ``warm_up`` recording, its kernels need a GPU) gets the other ranks' slots as -1 and the router's
    expert count, which its tile choice and warm-up divide the rows by."""
    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4
    from nvfp4stack.kernels.base import MOE_BACKENDS
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import routed_rows_per_expert
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward
    from nvfp4stack.kernels.moe.triton_w4a16 import TritonW4A16Moe
    from nvfp4stack.schemes import Scheme

    seen = {}

    class Recorder(TritonW4A16Moe):
        @classmethod
        def apply(cls, prepared, x, topk_weights, topk_ids, *, swiglu_limit=None, activation="silu"):
            seen.update(ids=topk_ids, routed=prepared.routed_experts)
            w = prepared.weights
            kept = torch.where(topk_ids < 0, torch.zeros_like(topk_weights), topk_weights)
            return nvfp4_moe_forward(x, w.w13, w.w2, kept, topk_ids.clamp(min=0))

        @classmethod
        def warm_up(cls, prepared, *, top_k, max_tokens, swiglu_limit):
            seen.update(warm=prepared.routed_experts)
            return []

    monkeypatch.setitem(MOE_BACKENDS._items, "ep_recorder", Recorder)
    g = torch.Generator().manual_seed(random.randrange(2**31))
    E, G, H, I, T, K = 4, 16, 64, 32, 7, 2  # 4 local experts of 16: this rank holds global 8..11
    w13, w2 = quantize_nvfp4(torch.randn(E, 2 * I, H, generator=g)), quantize_nvfp4(torch.randn(E, H, I, generator=g))
    layer = FakeExpertsLayer(w13, w2, torch.ones(E), torch.ones(E))
    layer.expert_map = torch.full((G,), -1, dtype=torch.int32)
    layer.expert_map[8:12] = torch.arange(E, dtype=torch.int32)
    m = Nvfp4StackModelOptMoE.__new__(Nvfp4StackModelOptMoE)
    Nvfp4StackModelOptMoE.__init__(m, None, _moe_config(), kernel="ep_recorder", scheme=Scheme.NVFP4_W4A16,
                                   prefix="model.layers.1.mlp.experts")
    m.process_weights_after_loading(layer)
    assert seen["warm"] == G and m.prepared.routed_experts == G
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(G, generator=g)[:K] for _ in range(T)])
    ids[0, 0] = 9  # one slot surely here
    wts = torch.rand(T, K, generator=g)
    got = m.apply(layer, x, wts, ids, None, None)
    local = layer.expert_map[ids.long()]
    assert torch.equal(seen["ids"], local.to(ids.dtype)) and seen["routed"] == G
    want = nvfp4_moe_forward(x, w13, w2, torch.where(local < 0, 0.0, wts), local.clamp(min=0))
    assert torch.equal(got, want) and got.abs().sum() > 0
    # rows per expert over all 16 experts (not the 4 here), and a count below the local one refused
    assert routed_rows_per_expert(T, K, E, G) == T * K / G and routed_rows_per_expert(T, K, E) == T * K / E
    with pytest.raises(ValueError, match="routed_experts: expected 0 or at least the 4 local experts"):
        routed_rows_per_expert(T, K, E, 2)


def test_engine_plan_carries_fp8_prefill_for_triton_w4a16_only():
    from nvfp4stack.cli import compose_config
    from nvfp4stack.plan.planner import PlanError

    cfg = compose_config("recipe=dsv4_h200", "backend.moe=triton_w4a16", "backend.moe_fp8_prefill=true", "run_dir=/tmp/x")
    ep = engine_plan_for(cfg)
    assert ep.roles["routed_experts"] == {"scheme": "nvfp4_w4a16", "kernel": "triton_w4a16", "fp8_prefill": True,
                                          "cast": "mxfp4_to_nvfp4"}
    assert EnginePlan.from_dict(ep.to_dict()).roles == ep.roles  # survives the trip through --hf-overrides
    with pytest.raises(PlanError, match="backend.moe_fp8_prefill"):
        engine_plan_for(compose_config("recipe=dsv4_b200", "backend.moe_fp8_prefill=true", "run_dir=/tmp/x"))
    with pytest.raises(ValueError, match="expected keys scheme, kernel"):
        EnginePlan({"routed_experts": {"scheme": "nvfp4", "kernel": "triton_w4a16", "fp8": True}})


def test_moe_methods_offer_vllm_no_modular_kernel(registered):
    """vLLM 0.26 calls maybe_make_prepare_finalize on every MoE layer once the EP group has more than
    one rank (TP=2 alone); vLLM's ModelOpt NVFP4 method raises there, which stopped the first two-H200
    start. Ours answer None: apply runs the planned backend, vLLM's runner keeps the quant method."""
    from nvfp4stack.engine.moe_cast_method import Nvfp4StackMxfp4CastMoE
    from nvfp4stack.engine.moe_method import Nvfp4StackModelOptMoE
    from nvfp4stack.schemes import Scheme

    for cls in (Nvfp4StackModelOptMoE, Nvfp4StackMxfp4CastMoE):
        m = cls.__new__(cls)
        Nvfp4StackModelOptMoE.__init__(m, None, _moe_config(), kernel="torch_emulation", scheme=Scheme.NVFP4_W4A16,
                                       prefix="model.layers.1.mlp.experts")
        assert m.maybe_make_prepare_finalize(routing_tables=None) is None
        assert not m.is_monolithic
