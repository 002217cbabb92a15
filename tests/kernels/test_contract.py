"""The backend contract (kernels/base.py): a backend declares what it can do as data (``Capabilities``);
only backends nvfp4stack runs have ``prepare``/``apply``; every vLLM flag value is one vLLM accepts;
the planner and the engine ask capabilities, never a backend's name."""
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import torch

from nvfp4stack.arch import resolve
from nvfp4stack.formats.nvfp4 import quantize_nvfp4
from nvfp4stack.kernels.base import (
    LINEAR_BACKENDS,
    MOE_BACKENDS,
    Capabilities,
    MoeWeights,
    RunnableLinearBackend,
    RunnableMoeBackend,
    backends_with,
    load_backends,
)
from nvfp4stack.kernels.vllm_backend import VllmBackend
from nvfp4stack.plan.planner import PlanError, check_moe_fp8_prefill, fp8_prefill_kernels
from nvfp4stack.schemes import Scheme

load_backends()
ALL = [(kind, name) for kind, reg in (("moe", MOE_BACKENDS), ("linear", LINEAR_BACKENDS)) for name in reg.names()]
RUNNABLE = {"moe": RunnableMoeBackend, "linear": RunnableLinearBackend}
ROOT = Path(__file__).parents[2] / "nvfp4stack"


def _backend(kind, name):
    return (MOE_BACKENDS if kind == "moe" else LINEAR_BACKENDS).get(name)


@pytest.mark.parametrize("kind,name", ALL)
def test_every_backend_declares_its_own_capabilities(kind, name):
    be = _backend(kind, name)
    assert isinstance(vars(be).get("capabilities"), Capabilities), f"{name}: declares no Capabilities of its own"
    caps = be.capabilities
    assert caps.provider in ("vllm", "nvfp4stack") and caps.schemes
    if kind == "linear":  # MoE-only modes stay off for linears
        assert not caps.negative_expert_ids and not caps.fp8_prefill, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.fp8_prefill = True  # type: ignore[misc]


def test_capabilities_refuse_an_inconsistent_declaration():
    with pytest.raises(ValueError, match="Capabilities.provider: expected one of vllm, nvfp4stack, found 'torch'"):
        Capabilities(provider="torch", schemes=(Scheme.NVFP4,))
    with pytest.raises(ValueError, match="Capabilities.vllm_flag: a provider='vllm' backend names.*vllm_flag=None"):
        Capabilities(provider="vllm", schemes=(Scheme.NVFP4,))
    with pytest.raises(ValueError, match="provider='nvfp4stack', vllm_flag='marlin'"):
        Capabilities(provider="nvfp4stack", schemes=(Scheme.NVFP4,), vllm_flag="marlin")
    with pytest.raises(ValueError, match="Capabilities.schemes: expected a non-empty tuple of Scheme"):
        Capabilities(provider="nvfp4stack", schemes=())


@pytest.mark.parametrize("kind,name", ALL)
def test_only_backends_nvfp4stack_runs_have_prepare_and_apply(kind, name):
    be = _backend(kind, name)
    if be.capabilities.provider == "vllm":
        assert issubclass(be, VllmBackend) and not issubclass(be, RUNNABLE[kind])
        assert not hasattr(be, "prepare") and not hasattr(be, "apply"), f"{name}: vLLM runs it; a declaration only"
    else:
        assert issubclass(be, RUNNABLE[kind]) and not issubclass(be, VllmBackend)
        for verb in ("prepare", "apply"):
            owner = next(c for c in be.__mro__ if verb in vars(c))
            assert owner is not RUNNABLE[kind], f"{name}.{verb} is not implemented"


@pytest.mark.parametrize("name", [n for n in MOE_BACKENDS.names() if issubclass(MOE_BACKENDS.get(n), RunnableMoeBackend)])
def test_moe_prepare_returns_the_backends_own_type_and_honours_fp8_prefill(name):
    """What ``prepare`` returns is the backend's declared ``prepared_type`` (the engine carries it), and the
    FP8 prefill copy is built exactly where ``capabilities.fp8_prefill`` says so (pure torch: CPU builds it)."""
    be = MOE_BACKENDS.get(name)
    g = torch.Generator().manual_seed(7)
    w13 = quantize_nvfp4(torch.randn(4, 64, 64, generator=g) * torch.rand(4, 64, 1, generator=g))
    w2 = quantize_nvfp4(torch.randn(4, 64, 32, generator=g) * torch.rand(4, 64, 1, generator=g))
    prepared = be.prepare(MoeWeights(w13, w2), routed_experts=16)
    assert isinstance(prepared, be.prepared_type) and prepared.routed_experts == 16
    back = be.prepared_type.from_op_tensors(*prepared.op_tensors(), prepared.tiled, prepared.routed_experts)
    assert torch.equal(back.weights.w13.data, prepared.weights.w13.data) and back.routed_experts == 16
    if be.capabilities.fp8_prefill:
        assert be.prepare(MoeWeights(w13, w2), fp8_prefill=True).fp8 is not None
    else:
        with pytest.raises(ValueError, match=f"{name} has no FP8 prefill mode: .*needs backend.moe=triton_w4a16"):
            be.prepare(MoeWeights(w13, w2), fp8_prefill=True)


def test_every_vllm_flag_is_a_value_vllm_accepts():
    """Checked against the installed vLLM: its --moe-backend / --linear-backend choices (vllm/config/kernel.py)."""
    kernel = pytest.importorskip("vllm.config.kernel")
    valid = {"moe": set(typing.get_args(kernel.MoEBackend)), "linear": set(typing.get_args(kernel.LinearBackend))}
    assert {"marlin", "emulation", "flashinfer_trtllm"} <= valid["moe"]  # the literal was read, not an empty set
    flagged = 0
    for kind, name in ALL:
        flag = _backend(kind, name).capabilities.vllm_flag
        if flag is not None:
            flagged += 1
            assert flag in valid[kind] and flag != "auto", f"{kind} backend {name}: {flag!r} is not a vLLM --{kind}-backend value"
    assert flagged == sum(_backend(k, n).capabilities.provider == "vllm" for k, n in ALL) > 0


def test_the_planners_fp8_prefill_decision_comes_from_capabilities(monkeypatch):
    assert fp8_prefill_kernels() == backends_with("moe", lambda c: c.fp8_prefill) == ["triton_w4a16"]
    sm90 = resolve("sm90")
    check_moe_fp8_prefill("triton_w4a16", sm90)
    with pytest.raises(PlanError) as e:
        check_moe_fp8_prefill("marlin", sm90)
    assert str(e.value) == ("backend.moe_fp8_prefill=true: the FP8 prefill mode belongs to the triton_w4a16 MoE kernel, "
                            "but the routed experts run on 'marlin'. Fix: backend.moe=triton_w4a16, or "
                            "backend.moe_fp8_prefill=false")
    # another backend declaring the mode is accepted, and named in the refusal; one that drops it is refused
    torch_emu = MOE_BACKENDS.get("torch_emulation")
    able = type("Fp8Able", (torch_emu,), {"capabilities": dataclasses.replace(torch_emu.capabilities, fp8_prefill=True)})
    monkeypatch.setitem(MOE_BACKENDS._items, "fp8_able", able)
    check_moe_fp8_prefill("fp8_able", sm90)
    with pytest.raises(PlanError, match=r"belongs to the fp8_able / triton_w4a16 MoE kernel.*Fix: backend.moe=fp8_able or "
                                        r"backend.moe=triton_w4a16, or backend.moe_fp8_prefill=false"):
        check_moe_fp8_prefill("marlin", sm90)
    tri = MOE_BACKENDS.get("triton_w4a16")
    monkeypatch.setattr(tri, "capabilities", dataclasses.replace(tri.capabilities, fp8_prefill=False))
    with pytest.raises(PlanError, match="belongs to the fp8_able MoE kernel, but the routed experts run on 'triton_w4a16'"):
        check_moe_fp8_prefill("triton_w4a16", sm90)


def test_engine_and_models_reach_moe_kernels_through_the_registry():
    """No module outside kernels/ imports a MoE forward or a backend's prepared type by name: the engine's
    MoE method and DeepSeek-V4's layer test ask MOE_BACKENDS for the backend and call its prepare/apply."""
    forbidden = re.compile(r"\b(nvfp4_moe_forward_triton|nvfp4_moe_forward|fp8_moe_forward\w*|PackedExperts)\b"
                           r"|hopper_w4a16\.(fused_moe|fp8_prefill|packed)")
    files = sorted([*(ROOT / "engine").glob("*.py"), *(ROOT / "models").rglob("*.py")])
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1) if "import" in line and forbidden.search(line)]
    assert not hits, "imports a MoE kernel by name instead of MOE_BACKENDS:\n" + "\n".join(hits)
    assert any("layertest" in str(p) for p in files)


def test_layertest_picks_its_moe_backend_from_the_registry(monkeypatch):
    from nvfp4stack.models.deepseek_v4.layertest import _moe_backend

    emu = MOE_BACKENDS.get("torch_emulation")
    # a vLLM-provided backend (no apply here) and a GPU-only one on this CPU host fall back to torch_emulation
    for name in ["marlin", "auto"] + ([] if torch.cuda.is_available() else ["triton_w4a16"]):
        assert _moe_backend(name, Scheme.NVFP4) == (emu, torch.device("cpu")), name
    own = type("OwnMoe", (emu,), {})
    monkeypatch.setitem(MOE_BACKENDS._items, "own_moe", own)
    assert _moe_backend("own_moe", Scheme.NVFP4_W4A16) == (own, torch.device("cpu"))
