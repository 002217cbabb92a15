"""Backend selection on fake archs: every hard rule is an error with its reason."""
import pytest

from nvfp4stack.arch import resolve
from nvfp4stack.kernels.base import LINEAR_BACKENDS, MOE_BACKENDS
from nvfp4stack.kernels.priority import LINEAR_PRIORITY, MOE_PRIORITY
from nvfp4stack.kernels.select import BackendError, select_backend
from nvfp4stack.schemes import Scheme


def test_every_priority_entry_is_registered():
    select_backend("moe", "auto", resolve("cpu"), Scheme.NVFP4)  # loads the backends
    for table, reg in ((MOE_PRIORITY, MOE_BACKENDS), (LINEAR_PRIORITY, LINEAR_BACKENDS)):
        for arch, names in table.items():
            for n in names:
                assert n in reg, f"{arch}: {n} is in the priority list but not registered"


@pytest.mark.parametrize("arch,expected", [
    ("sm100a", "flashinfer_trtllm"), ("sm103a", "flashinfer_trtllm"), ("sm120", "flashinfer_cutlass"),
    ("sm90", "triton_w4a16"), ("sm80", "marlin"), ("cpu", "torch_emulation"),
])
def test_auto_walks_the_priority_list(arch, expected):
    assert select_backend("moe", "auto", resolve(arch), Scheme.NVFP4).backend == expected


def test_mxf4nvf4_needs_arch_specific_blackwell_not_sm100f():
    with pytest.raises(BackendError, match="needs sm100a or sm103a .*not sm_100f.*arch is sm100f"):
        select_backend("moe", "flashinfer_trtllm", resolve("sm100f"), Scheme.NVFP4)
    with pytest.raises(BackendError, match="cutedsl.*sm100a or sm103a"):
        select_backend("moe", "cutedsl", resolve("sm100f"), Scheme.NVFP4)


def test_hopper_gets_weight_only_nvfp4():
    sel = select_backend("moe", "auto", resolve("sm90"), Scheme.NVFP4)
    assert sel.served_scheme is Scheme.NVFP4_W4A16
    ok, why = MOE_BACKENDS.get("flashinfer_trtllm").is_supported(resolve("sm90"), Scheme.NVFP4)
    assert not ok and "sm100a" in why
    for w4a4 in ("flashinfer_trtllm", "cutedsl", "flashinfer_cutlass", "cutlass"):
        with pytest.raises(BackendError, match="cannot run nvfp4 on sm90.*Fix: set backend.moe=auto"):
            select_backend("moe", w4a4, resolve("sm90"), Scheme.NVFP4)
    with pytest.raises(BackendError, match="cutlass NVFP4 GEMM needs sm100a/sm103a/sm120 FP4 tensor cores"):
        select_backend("linear", "cutlass", resolve("sm90"), Scheme.NVFP4)


def test_any_w4a4_kernel_is_refused_without_fp4_tensor_cores():
    """The safety net behind the per-backend arch lists: a hypothetical portable W4A4 kernel."""
    from nvfp4stack.kernels.base import Capabilities
    from nvfp4stack.kernels.vllm_backend import VllmMoeBackend

    class PortableW4A4(VllmMoeBackend):
        name = "portable_w4a4"
        capabilities = Capabilities(provider="vllm", vllm_flag="portable_w4a4", schemes=(Scheme.NVFP4,),
                                    min_capability=(8, 0), activation_fp4=True)

    ok, why = PortableW4A4.is_supported(resolve("sm90"), Scheme.NVFP4)
    assert not ok and "no FP4 tensor cores: sm_90 and older get weight-only NVFP4 only" in why
    assert PortableW4A4.is_supported(resolve("sm100a"), Scheme.NVFP4)[0]


def test_nvfp4_experts_are_never_served_as_mxfp4():
    with pytest.raises(BackendError, match="never silently served as MXFP4"):
        select_backend("moe", "deep_gemm", resolve("sm100a"), Scheme.NVFP4)


def test_explicit_choice_is_validated_and_alias_resolved():
    sel = select_backend("moe", "cutedsl", resolve("sm100a"), Scheme.NVFP4)
    assert sel.backend == "flashinfer_cutedsl" and sel.served_scheme is Scheme.NVFP4
    with pytest.raises(BackendError, match="'nope' is not a moe backend; valid: auto, cutlass"):
        select_backend("moe", "nope", resolve("sm100a"), Scheme.NVFP4)
    with pytest.raises(BackendError, match="torch_emulation|triton_w4a16"):
        select_backend("moe", "triton_w4a16", resolve("cpu"), Scheme.NVFP4)


def test_no_backend_lists_every_reason():
    with pytest.raises(BackendError, match="found no moe backend for fp8_block on cpu: torch_emulation: "):
        select_backend("moe", "auto", resolve("cpu"), Scheme.FP8_BLOCK)


def test_cpu_runs_mxfp4_experts_on_torch_emulation():
    """DeepSeek-V4's untouched MTP block keeps MXFP4 experts: the CPU emulation runs them."""
    sel = select_backend("moe", "auto", resolve("cpu"), Scheme.MXFP4)
    assert sel.backend == "torch_emulation" and sel.served_scheme is Scheme.MXFP4


def test_torch_emulation_linear_matches_dequantized_gemm():
    import torch

    from nvfp4stack.formats.fp8_block import quantize_fp8_block
    from nvfp4stack.kernels.linear.torch_emulation import emulated_linear

    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(256, 384, generator=g) * torch.rand(256, 1, generator=g) * 3
    x = torch.randn(5, 384, generator=g).to(torch.bfloat16)
    qw = quantize_fp8_block(w, ue8m0=True, name="w")
    y = emulated_linear(x, qw)
    ref = (x.float() @ qw.dequantize(torch.float32).t()).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, ref)
    assert select_backend("linear", "auto", resolve("cpu"), Scheme.FP8_BLOCK).backend == "torch_emulation"


def test_official_tiny_plan_puts_mxfp4_mtp_experts_on_torch_emulation():
    """`python main.py recipe=tiny_dsv4 model.source_format=official plan` on CPU: the untouched MTP
    block's MXFP4 experts get backend.mtp_moe=auto -> torch_emulation, next to the NVFP4 main experts."""
    pytest.importorskip("hydra", reason="composes the recipe with Hydra (a bare GPU host running tests/kernels has none)")
    from nvfp4stack.cli import compose_config
    from nvfp4stack.plan.build import plan_for_config

    cfg = compose_config("recipe=tiny_dsv4", "model.source_format=official", "run_dir=/tmp/unused")
    assert cfg.arch.name == "cpu" and cfg.backend.mtp_moe == "auto"
    plan = plan_for_config(cfg)
    experts = [g for g in plan.groups if g.role == "routed_experts"]
    mtp = [g for g in experts if g.mtp]
    assert mtp and len(mtp) < len(experts)
    for g in mtp:
        assert (g.source, g.target, g.served, g.kernel) == (Scheme.MXFP4, Scheme.MXFP4, Scheme.MXFP4,
                                                            "torch_emulation"), g.name
    for g in experts:
        if not g.mtp:
            assert (g.source, g.target, g.kernel) == (Scheme.MXFP4, Scheme.NVFP4, "torch_emulation"), g.name
    assert plan.selections["mtp_moe:mxfp4"]["backend"] == "torch_emulation"
