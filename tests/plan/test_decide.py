"""The one decision (plan.planner.decide): (source, requested, arch, backend) -> stored, served, kernel."""
import pytest

from nvfp4stack.arch import resolve
from nvfp4stack.config import BackendConfig
from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.families.registry import get_family
from nvfp4stack.kernels.select import BackendError
from nvfp4stack.plan.planner import PlanError, decide
from nvfp4stack.schemes import Scheme

EXPERT = TensorGroup("layers.3.ffn.experts.7.w2", (4096, 2048), "routed_experts")
EXPERT_W1 = TensorGroup("layers.3.ffn.experts.7.w1", (2048, 4096), "routed_experts")
MTP_EXPERT = TensorGroup("mtp.0.ffn.experts.7.w2", (4096, 2048), "routed_experts", mtp=True)
WO_A = TensorGroup("layers.3.attn.wo_a", (8192, 1024), "attn.wo_a")
NORM = TensorGroup("layers.3.attn_norm", (4096,), "norms", is_matrix=False)


def _decide(group, source, requested, arch="sm90", family="deepseek_v4", **backend):
    return decide(group, source, requested, family=get_family(family), arch=resolve(arch),
                  backend=BackendConfig(**backend))


@pytest.mark.parametrize("source,requested,arch,want", [
    # the BF16 reference of the release experts: dequantized, served by vLLM's unquantized MoE
    (Scheme.MXFP4, Scheme.BF16, "sm90", (Scheme.BF16, Scheme.BF16, "unquantized", "mxfp4_to_bf16")),
    (Scheme.MXFP4, Scheme.FP8_BLOCK, "sm90", (Scheme.FP8_BLOCK, Scheme.FP8_BLOCK, "deep_gemm", "mxfp4_to_fp8_block")),
    # NVFP4 on Hopper is served weight-only; on sm100a as W4A4 on FlashInfer's TRT-LLM MoE
    (Scheme.MXFP4, Scheme.NVFP4, "sm90", (Scheme.NVFP4, Scheme.NVFP4_W4A16, "triton_w4a16", "mxfp4_to_nvfp4")),
    (Scheme.MXFP4, Scheme.NVFP4, "sm100a", (Scheme.NVFP4, Scheme.NVFP4, "flashinfer_trtllm", "mxfp4_to_nvfp4")),
    # passthrough keeps the stored bytes: no converter
    (Scheme.NVFP4, Scheme.PASSTHROUGH, "cpu", (Scheme.NVFP4, Scheme.NVFP4, "torch_emulation", None)),
])
def test_decision_per_source_request_and_arch(source, requested, arch, want):
    d = _decide(EXPERT, source, requested, arch)
    assert (d.stored, d.served, d.kernel, d.converter) == want


def test_w1_w3_from_bf16_share_one_global_scale():
    assert _decide(EXPERT_W1, Scheme.BF16, Scheme.NVFP4, "cpu").converter == "w13_shared_global_scale"
    assert _decide(EXPERT, Scheme.BF16, Scheme.NVFP4, "cpu").converter == "bf16_to_nvfp4"


def test_gate_up_names_are_the_familys(monkeypatch):
    from tests.support.toy_family import register_toy_family

    gate = TensorGroup("model.layers.0.mlp.experts.3.gate_proj", (64, 128), "routed_experts")
    up = TensorGroup("model.layers.0.mlp.experts.3.up_proj", (64, 128), "routed_experts")
    for g in (gate, up):
        assert _decide(g, Scheme.BF16, Scheme.NVFP4, "cpu", family="qwen3_moe").converter == "w13_shared_global_scale"
        # DeepSeek-V4's experts are w1/w3: a gate_proj name is no pair of that family
        assert _decide(g, Scheme.BF16, Scheme.NVFP4, "cpu").converter == "bf16_to_nvfp4"
    register_toy_family(monkeypatch, gate_up_pairs=(("wg", "wu"),))
    toy = TensorGroup("layers.0.ffn.experts.3.wu", (64, 128), "routed_experts")
    assert _decide(toy, Scheme.BF16, Scheme.NVFP4, "cpu", family="toy").converter == "w13_shared_global_scale"
    assert _decide(EXPERT_W1, Scheme.BF16, Scheme.NVFP4, "cpu", family="toy").converter == "bf16_to_nvfp4"


def test_mtp_experts_take_their_own_backend_key():
    d = _decide(MTP_EXPERT, Scheme.MXFP4, Scheme.PASSTHROUGH, "sm90", mtp_moe="marlin", moe="triton_w4a16")
    assert (d.stored, d.kernel) == (Scheme.MXFP4, "marlin")
    with pytest.raises(BackendError, match="backend.mtp_moe=triton_w4a16 cannot run mxfp4"):
        _decide(MTP_EXPERT, Scheme.MXFP4, Scheme.PASSTHROUGH, "sm90", mtp_moe="triton_w4a16")


def test_hard_rules_and_missing_converters_refuse_with_the_fix():
    with pytest.raises(PlanError, match=r"wo_a cannot be nvfp4.*Fix: precision.attn.wo_a=fp8_block"):
        _decide(WO_A, Scheme.FP8_BLOCK, Scheme.NVFP4)
    with pytest.raises(PlanError, match=r"never turned into MXFP4"):
        _decide(EXPERT, Scheme.NVFP4, Scheme.MXFP4)
    with pytest.raises(PlanError, match=r"no converter from fp8_block to mxfp4"):
        _decide(EXPERT, Scheme.FP8_BLOCK, Scheme.MXFP4)


def test_groups_without_a_gemm_keep_their_bytes():
    d = _decide(NORM, Scheme.PASSTHROUGH, Scheme.PASSTHROUGH)
    assert (d.stored, d.kernel, d.converter) == (Scheme.PASSTHROUGH, "-", None)


def test_fp8_prefill_copy_only_for_the_main_experts_on_triton_w4a16():
    main = _decide(EXPERT, Scheme.NVFP4, Scheme.NVFP4, "sm90", moe="triton_w4a16", moe_fp8_prefill=True)
    assert main.fp8_copy and main.kernel == "triton_w4a16"
    with pytest.raises(PlanError, match="backend.moe_fp8_prefill=true"):
        _decide(EXPERT, Scheme.NVFP4, Scheme.NVFP4, "sm90", moe="marlin", moe_fp8_prefill=True)


def test_converter_lookup_is_cached_yet_sees_a_converter_registered_later(monkeypatch):
    """converter_for runs once per group (35,000 for DeepSeek-V4-Flash), so its registry walk is
    cached; the cache is keyed by the registered names, so a plugin's converter added afterwards counts."""
    import pytest

    import nvfp4stack.convert  # noqa: F401
    from nvfp4stack.convert.base import CONVERTERS, Converter
    from nvfp4stack.plan.planner import PlanError, converter_for
    from nvfp4stack.schemes import Scheme

    assert converter_for(Scheme.MXFP4, Scheme.NVFP4, "g") == "mxfp4_to_nvfp4"
    with pytest.raises(PlanError, match="g: no converter from fp8_block to nvfp4"):
        converter_for(Scheme.FP8_BLOCK, Scheme.NVFP4, "g")

    class Fp8BlockToNvfp4(Converter):
        source, target = Scheme.FP8_BLOCK, Scheme.NVFP4

    monkeypatch.setitem(CONVERTERS._items, "test_fp8_block_to_nvfp4", Fp8BlockToNvfp4)
    assert converter_for(Scheme.FP8_BLOCK, Scheme.NVFP4, "g") == "test_fp8_block_to_nvfp4"
