"""Plans from config.json alone: footprints, hard rules, MTP handling, backend fallback."""
import json
import warnings

import pytest

from nvfp4stack.arch import resolve
from nvfp4stack.config import GROUP_PRECISIONS, BackendConfig, PrecisionConfig
from nvfp4stack.families.registry import get_family
from nvfp4stack.kernels.select import BackendError
from nvfp4stack.models import DESCRIPTORS
from nvfp4stack.models.deepseek_v4.spec import dsv4_tensor_groups
from nvfp4stack.models.deepseek_v4.spec import source_scheme as source_scheme_dsv4
from nvfp4stack.plan.memory import Layout
from nvfp4stack.plan.planner import PlanError, build_plan
from nvfp4stack.plan.rules import PrecisionRule
from nvfp4stack.schemes import Scheme

AttnPrecision, IndexerPrecision = GROUP_PRECISIONS["attn"], GROUP_PRECISIONS["indexer"]


def _config(name="dsv4_pro", experts=None):
    c = json.loads((DESCRIPTORS / f"{name}.json").read_text())
    if experts:
        c["n_routed_experts"] = experts
    return c


def serving_precision(**kw):
    base = dict(attn=AttnPrecision(wo_a="fp8_block"), compressor="bf16",
                indexer=IndexerPrecision(weights_proj="bf16"))
    return PrecisionConfig(**{**base, **kw})


def plan(c, source="official", arch="sm100a", precision=None, backend=None, layout=Layout(tp=8, ep=True)):
    groups = [(g, source_scheme_dsv4(g, source)) for g in dsv4_tensor_groups(c)]
    return build_plan(groups, model="m", family=get_family("deepseek_v4"), arch=resolve(arch), source_format=source,
                      precision=precision or serving_precision(), backend=backend or BackendConfig(),
                      layout=layout)


@pytest.fixture(scope="module")
def pro_plan():
    return plan(_config())


def test_pro_footprint_nvfp4_experts_fp8_attention(pro_plan):
    p = pro_plan
    assert 1.5e12 <= p.total_params <= 1.7e12
    assert 850e9 <= p.total_bytes <= 1000e9, p.total_bytes
    experts = [g for g in p.groups if g.role == "routed_experts" and not g.mtp]
    assert {g.target for g in experts} == {Scheme.NVFP4}
    assert {g.converter for g in experts} == {"mxfp4_to_nvfp4"}
    assert {g.kernel for g in experts} == {"flashinfer_trtllm"}
    # 8 GPUs with expert parallelism: each holds 1/8 of the experts plus replicated parts
    assert p.total_bytes / 8 < p.gpu_bytes < p.total_bytes / 8 + 10e9
    assert all(g.target is Scheme.FP8_BLOCK for g in p.groups if g.role == "attn.wo_a")


def test_mtp_is_untouched_by_default(pro_plan):
    mtp = [g for g in pro_plan.groups if g.mtp]
    assert mtp and all(g.source is g.target and g.converter is None for g in mtp)


def test_native_footprint_is_smaller():
    p = plan(_config(experts=16), precision=serving_precision(routed_experts="passthrough"))
    assert {g.target for g in p.groups if g.role == "routed_experts"} == {Scheme.MXFP4}


def test_wo_a_cannot_be_nvfp4():
    with pytest.raises(PlanError, match="wo_a cannot be nvfp4.*Fix: precision.attn.wo_a=fp8_block"):
        plan(_config(experts=8), source="bf16", precision=PrecisionConfig(attn=AttnPrecision(wo_a="nvfp4")))


def test_compressor_and_weights_proj_stay_bf16():
    with pytest.raises(PlanError, match="compressor.*must be bf16.*Fix: precision.compressor=bf16"):
        plan(_config(experts=8), precision=serving_precision(compressor="fp8_block"))
    with pytest.raises(PlanError, match="Fix: precision.indexer.weights_proj=bf16"):
        plan(_config(experts=8), source="bf16",
             precision=PrecisionConfig(indexer=IndexerPrecision(weights_proj="fp8_block")))


def test_nvfp4_experts_never_become_mxfp4():
    with pytest.raises(PlanError, match="never turned into MXFP4"):
        plan(_config(experts=8), source="modelopt", precision=serving_precision(routed_experts="mxfp4"))


def test_rules_come_first_and_warn_on_unmatched_targets():
    prec = serving_precision(rules=[
        PrecisionRule(targets=["re:^layers\\.0\\.ffn\\.experts\\."], scheme="bf16"),
        PrecisionRule(targets=["no_such_module"], scheme="bf16"),
    ])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = plan(_config(experts=8), source="bf16", precision=prec)
    by = p.by_name()
    assert by["layers.0.ffn.experts.0.w1"].target is Scheme.BF16
    assert by["layers.1.ffn.experts.0.w1"].target is Scheme.NVFP4
    assert any("no_such_module" in str(w.message) for w in caught)
    assert any("no_such_module" in w for w in p.warnings)


def test_hopper_plan_serves_weight_only():
    p = plan(_config(experts=8), arch="sm90")
    experts = [g for g in p.groups if g.role == "routed_experts" and not g.mtp]
    assert {g.kernel for g in experts} == {"triton_w4a16"}
    assert {g.served for g in experts} == {Scheme.NVFP4_W4A16}
    with pytest.raises(BackendError, match="flashinfer_trtllm cannot run nvfp4 on sm90"):
        plan(_config(experts=8), arch="sm90", backend=BackendConfig(moe="flashinfer_trtllm"))


def test_plan_json_is_serialisable(pro_plan):
    j = json.loads(json.dumps(pro_plan.to_json(), default=str))
    assert j["total_params"] == pro_plan.total_params and j["rows"]
    assert j["selections"]["moe:nvfp4"]["backend"] == "flashinfer_trtllm"


def test_bf16_experts_w1_w3_share_one_global_scale():
    p = plan(_config(experts=8), source="bf16", precision=serving_precision())
    by = p.by_name()
    assert by["layers.3.ffn.experts.5.w1"].converter == "w13_shared_global_scale"
    assert by["layers.3.ffn.experts.5.w3"].converter == "w13_shared_global_scale"
    assert by["layers.3.ffn.experts.5.w2"].converter == "bf16_to_nvfp4"


def test_moe_fp8_prefill_adds_its_copy_to_gpu_bytes_and_needs_triton_w4a16_on_sm90():
    from nvfp4stack.plan.planner import fp8_prefill_bytes

    c = _config("dsv4_flash")
    base = plan(c, arch="sm90", backend=BackendConfig(moe="triton_w4a16"), layout=Layout(tp=4, ep=True))
    fp8 = plan(c, arch="sm90", backend=BackendConfig(moe="triton_w4a16", moe_fp8_prefill=True), layout=Layout(tp=4, ep=True))
    experts = [g for g in fp8.groups if g.role == "routed_experts" and not g.mtp]
    copy = sum(fp8_prefill_bytes(g) for g in dsv4_tensor_groups(c) if g.role == "routed_experts" and not g.mtp)
    weights = sum(g.params for g in experts)
    assert weights < copy < weights * 1.01  # 1 byte per weight + 4 bytes per row
    assert fp8.gpu_bytes - base.gpu_bytes == pytest.approx(copy / 4, rel=1e-9)  # EP over 4 GPUs
    assert fp8.total_bytes == base.total_bytes  # the checkpoint does not change
    with pytest.raises(PlanError, match="belongs to the triton_w4a16 MoE kernel.*Fix: backend.moe=triton_w4a16"):
        plan(c, arch="sm100a", backend=BackendConfig(moe="flashinfer_trtllm", moe_fp8_prefill=True))
    with pytest.raises(PlanError, match="sm80: .*needs sm90 or later"):
        plan(c, arch="sm80", backend=BackendConfig(moe="triton_w4a16", moe_fp8_prefill=True))
