"""GPU-host check of vLLM's low-latency BF16 router GEMM (``ll_bf16_gemm``, CuTeDSL) against torch.

vLLM 0.26's ``GateLinear`` (DeepSeek-V4's router) runs this kernel on sm90+ for 16 tokens or fewer
and cuBLAS/torch above. ``python bench/tools/vllm_router_gemm_check.py`` prints, per (K, N, M), the
largest relative error against an fp32 matmul of the same bf16 inputs; exit 1 if any is above 1e-3.
Not collected by pytest (no GPU, no vLLM CUDA build in CI); run where vLLM is installed.
"""
import sys

import torch


def main() -> int:
    from vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 import is_available, ll_bf16_gemm

    if not torch.cuda.is_available() or not is_available():
        print("needs a CUDA GPU and vLLM with nvidia-cutlass-dsl (cuteDSL)")
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    bad = 0
    print("K     N    M   rel.err")
    for K, N in ((256, 16), (512, 16), (1024, 64), (2048, 64), (4096, 256), (7168, 256)):
        w = torch.randn(N, K, device="cuda", generator=g).bfloat16()
        for M in (1, 2, 3, 4, 5, 8, 16):
            x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
            got = ll_bf16_gemm(x, w)
            want = x.float() @ w.float().t()
            err = ((got.float() - want).abs().max() / want.abs().max()).item()
            bad += not err <= 1e-3
            print(f"{K:<5} {N:<4} {M:<3} {err:.2e}{'  <-- wrong' if not err <= 1e-3 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
