"""NVFP4 quantize on CUDA gives the CPU path's bytes (which test_nvfp4.py proves bit-exact against
modelopt). Its own module, free of modelopt/vLLM imports, so it collects on GPU hosts without them."""
import pytest
import torch

from nvfp4stack.formats.nvfp4 import quantize_nvfp4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(seed, make_weights):
    for dist, shape in (("student_t", (256, 512)), ("outliers", (64, 7168))):
        x = make_weights(dist, shape, torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        a, b = quantize_nvfp4(x), quantize_nvfp4(x.cuda())
        assert torch.equal(a.global_scale, b.global_scale.cpu()), dist
        assert torch.equal(a.data, b.data.cpu()), dist
        assert torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8).cpu()), dist
