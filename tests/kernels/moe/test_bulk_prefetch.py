"""The decode kernels' L2-cache bulk prefetch (``DecodeConfig.bulk``, _bulk_prefetch.py).

CPU: the config check. GPU (sm90): a prefetch is a hint, so every bulk setting gives the same bits as none, for
one token (the fused top-k sum) and a few, tiled and row-major weights, split and unsplit K runs, with EP's -1
slots; and against the fp32 twin within the decode kernels' bound.
"""
from dataclasses import replace

import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16, DecodeConfig
from tests.support.decode_moe import fresh_generator, nvfp4_experts, routed_tokens, sm90_or_skip, with_splits

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with Triton")
H, I = 2048, 1024


def test_bulk_is_checked():
    assert replace(_DECODE_FEW[0], bulk=7).bulk == 7 and replace(_DECODE_T16[0], bulk=1).rows == 64
    for bad in (dict(bulk=4), dict(bulk=5), dict(bulk=8), dict(bulk=1, wgmma=3, prefetch=3)):
        with pytest.raises(ValueError, match="bulk"):
            DecodeConfig(**{**dict(block_t=16, mrep=1, block_k=128, num_warps=4, prefetch=1), **bad})
    with pytest.raises(ValueError, match="64-row"):  # 32 rows: half a weight block of the tiled layout
        DecodeConfig(8, 1, 128, 2, 0, bulk=1)
    assert replace(_DECODE_FEW[1], ahead=4).ahead == 4
    for bad in (dict(ahead=5), dict(ahead=1, wgmma=3, prefetch=3), dict(ahead=1, num_warps=2)):
        with pytest.raises(ValueError, match="ahead"):
            DecodeConfig(**{**dict(block_t=16, mrep=1, block_k=128, num_warps=4, prefetch=1), **bad})


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_bulk_prefetch_keeps_the_bits(tokens, tiled):
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    sm90_or_skip("the bulk prefetch is in the mma.sync decode kernels")
    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 32, H, I)
    k13, k2 = tiles.tile_experts(w13, w2) if tiled else (w13, w2)
    for other in (0.0, 0.5):
        x, ids, wts = routed_tokens(g, tokens, 32, H, other=other)
        zeroed = torch.where(ids < 0, torch.zeros_like(wts), wts)
        ref = nvfp4_moe_forward(x.float(), w13, w2, zeroed, ids.clamp(min=0), swiglu_limit=10.0).float()
        for splits in ((1, 1), (2, 2), (4, 1)):
            base = with_splits(_DECODE_FEW, *splits)
            plain = nvfp4_moe_forward_triton(x, k13, k2, wts, ids, swiglu_limit=10.0, config=base, poison=True,
                                             tiled=tiled, routed_experts=64 if other else 0)
            for kw1, kw2 in (({"bulk": 1}, {"bulk": 1}), ({"bulk": 7}, {"bulk": 1}), ({"bulk": 2}, {}),
                             ({"ahead": 1}, {"ahead": 1}), ({"ahead": 4}, {"ahead": 2}), ({}, {"ahead": 3})):
                pair = (replace(base[0], **kw1), replace(base[1], **kw2))
                got = nvfp4_moe_forward_triton(x, k13, k2, wts, ids, swiglu_limit=10.0, config=pair, poison=True,
                                               tiled=tiled, routed_experts=64 if other else 0)
                assert torch.equal(got, plain), f"{kw1}/{kw2}, splits {splits}, tiled {tiled}, ids {ids.tolist()}"
            if bool((ids >= 0).any()):
                err = ((plain.float() - ref).norm() / ref.norm()).item()
                assert err <= 1e-2, (err, splits, tiled)
