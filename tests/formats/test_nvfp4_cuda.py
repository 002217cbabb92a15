"""NVFP4 quantize on CUDA computes modelopt's function as torch evaluates it there.

Its own module, free of modelopt/vLLM imports, so that it collects on GPU hosts without them
(test_nvfp4.py proves the CPU path bit-exact against the installed modelopt).

The global scale is modelopt's ``reduce_amax(x).float() / (E2M1_MAX * E4M3_MAX)``
(NVFP4QTensor.get_weights_scaling_factor_2), a tensor divided by a Python number. torch's CUDA
kernel computes that as a multiply by the reciprocal, its CPU kernel as a division: for some amax
the two differ in the last bit (seen on the H200, 2026-11-22: 2 of 3 fresh seeds). quantize_nvfp4
uses the same expression, so on each device it gives what modelopt gives on that device; this test
checks exactly that, and that every byte matches the CPU path given the same global scale.
"""
import pytest
import torch

from nvfp4stack.formats.nvfp4 import E2M1_MAX, E4M3_MAX, quantize_nvfp4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_modelopt_expression_and_cpu_bytes(seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    cases = [(kind, (512, 1024), dt) for kind in ("normal", "student_t", "outliers")
             for dt in (torch.float32, torch.bfloat16)] + [("outliers", (64, 7168), torch.bfloat16)]
    for kind, shape, dt in cases:
        x = make_weights(kind, shape, gen).to(dt)
        b = quantize_nvfp4(x.cuda())
        ref_gs = x.cuda().abs().amax().float() / (E2M1_MAX * E4M3_MAX)  # modelopt's expression, on CUDA
        assert torch.equal(b.global_scale, ref_gs), (kind, dt)
        a = quantize_nvfp4(x, global_scale=b.global_scale.cpu())
        assert torch.equal(a.data, b.data.cpu()), (kind, dt)
        assert torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8).cpu()), (kind, dt)
