"""The fused Triton path of mxfp4 -> nvfp4 (CUDA) computes the same bytes as the torch path
(CPU): checked on CUDA when a GPU is present, and on CPU through Triton's interpreter.
No modelopt/vLLM here: the torch path itself is proven against them in tests/convert."""
import os
import subprocess
import sys

import pytest
import torch

from nvfp4stack.convert import mxfp4_to_nvfp4 as M
from nvfp4stack.formats import quantize_mxfp4
from nvfp4stack.formats.mxfp4 import Mxfp4Tensor


def cases(gen: torch.Generator):
    """(label, Mxfp4Tensor) on CPU: random codes/scales (exact), zero blocks carrying the largest
    scale byte, all-zero, stacked experts, and a > 17-binade tensor (inexact -> torch fallback)."""
    rnd = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, generator=gen)
    sc = lambda lo, hi, *s: torch.randint(lo, hi, s, dtype=torch.uint8, generator=gen)
    yield "random 2-D", Mxfp4Tensor(rnd(512, 1024), sc(118, 136, 512, 64), (512, 2048))
    d, s = rnd(256, 512), sc(110, 128, 256, 32)
    d[::7, :16], s[::7, 0] = 0x88, 200  # -0/+0 codes under a scale far above every nonzero block
    yield "zero blocks, large scale", Mxfp4Tensor(d, s, (256, 1024))
    yield "stacked experts", Mxfp4Tensor(rnd(4, 128, 256), sc(100, 117, 4, 128, 16), (4, 128, 512))
    yield "all zero", quantize_mxfp4(torch.zeros(64, 128))
    yield "tiny scales (g clamps at -126)", Mxfp4Tensor(rnd(64, 256), sc(0, 9, 64, 16), (64, 512))
    x = torch.randn(64, 256, generator=gen)
    x[:8] *= 2.0**30
    yield "wide range (inexact)", quantize_mxfp4(x)


def same(a, b) -> bool:
    (qa, ra), (qb, rb) = a, b
    return (torch.equal(qa.data.cpu(), qb.data.cpu())
            and torch.equal(qa.scale.view(torch.uint8).cpu(), qb.scale.view(torch.uint8).cpu())
            and torch.equal(qa.global_scale.cpu(), qb.global_scale.cpu()) and ra == rb)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_mxfp4_to_nvfp4_matches_cpu(seed):
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(seed)
    n = 0
    for label, m in cases(gen):
        cpu = M.mxfp4_to_nvfp4(m)
        gpu = M.mxfp4_to_nvfp4(Mxfp4Tensor(m.data.cuda(), m.scale.cuda(), m.shape))
        assert gpu[0].scale.is_cuda, label
        if "inexact" not in label:  # the fused path answered, not the torch fallback
            assert "nvfp4stack.formats.mxfp4_nvfp4_triton" in sys.modules, label
        assert same(cpu, gpu), f"{label}: CUDA output differs from the CPU torch path"
        n += m.data.numel() * 2
    assert n >= 1_000_000


_INTERPRET_CHECK = """
import os, sys, torch
sys.path.insert(0, os.environ["TEST_DIR"])
from test_mxfp4_nvfp4_fast import cases, same
from nvfp4stack.convert import mxfp4_to_nvfp4 as M
for label, m in cases(torch.Generator().manual_seed(int(sys.argv[1]))):
    os.environ[M._FORCE] = "1"; fast = M.mxfp4_to_nvfp4(m)
    os.environ[M._FORCE] = "0"; ref = M.mxfp4_to_nvfp4(m)
    assert same(fast, ref), label
    print("ok", label)
assert "nvfp4stack.formats.mxfp4_nvfp4_triton" in sys.modules  # the Triton path really ran
"""


def test_triton_path_matches_torch_path_interpreted(seed):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", TEST_DIR=os.path.dirname(__file__))
    r = subprocess.run([sys.executable, "-c", _INTERPRET_CHECK, str(seed)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == 6, r.stdout
