"""Per-arch backend priority lists for ``backend.<kind>=auto``: data, walked in order."""
from __future__ import annotations

MOE_PRIORITY: dict[str, list[str]] = {
    "sm100a": ["flashinfer_trtllm", "flashinfer_cutedsl", "flashinfer_cutlass", "cutlass",
               "deep_gemm", "marlin", "triton_w4a16", "vllm_emulation"],
    "sm103a": ["flashinfer_trtllm", "flashinfer_cutedsl", "flashinfer_cutlass", "cutlass",
               "deep_gemm", "marlin", "triton_w4a16", "vllm_emulation"],
    "sm100f": ["deep_gemm", "marlin", "triton_w4a16"],
    "sm120": ["flashinfer_cutlass", "cutlass", "marlin", "triton_w4a16"],
    # Hopper has no FP4 tensor cores: weight-only NVFP4 (our Triton kernel first, then Marlin).
    "sm90": ["triton_w4a16", "marlin", "deep_gemm"],
    "sm89": ["marlin", "triton_w4a16"],
    "sm80": ["marlin", "triton_w4a16"],
    "cpu": ["torch_emulation"],
}

LINEAR_PRIORITY: dict[str, list[str]] = {
    "sm100a": ["flashinfer_cutlass", "cutlass", "deep_gemm", "marlin", "vllm_emulation"],
    "sm103a": ["flashinfer_cutlass", "cutlass", "deep_gemm", "marlin", "vllm_emulation"],
    "sm100f": ["deep_gemm", "marlin", "vllm_emulation"],
    "sm120": ["flashinfer_cutlass", "cutlass", "triton", "marlin"],
    "sm90": ["deep_gemm", "cutlass", "triton", "marlin"],
    "sm89": ["triton", "marlin"],
    "sm80": ["marlin"],
    "cpu": ["vllm_emulation", "torch_emulation"],
}


def priority(kind: str, arch_name: str) -> list[str]:
    table = MOE_PRIORITY if kind == "moe" else LINEAR_PRIORITY
    return table.get(arch_name, table["sm80"])
