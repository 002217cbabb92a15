"""The load-time cast of stacked MXFP4 experts gives, expert by expert, the offline converters' bytes."""
from __future__ import annotations

import pytest
import torch

from nvfp4stack.convert.expert_cast import cast_stacked_experts
from nvfp4stack.convert.mxfp4_to_nvfp4 import Mxfp4ToNvfp4
from nvfp4stack.convert.w13_shared_global_scale import W13SharedGlobalScale

E, I, H = 6, 64, 128


def _experts(seed: int, spread: int):
    """Random packed codes (every byte value) and UE8M0 scales over ``spread`` binades, with the
    cases that matter: an all-zero expert, all-zero blocks, w1 and w3 each holding the larger top
    exponent in some experts, and (spread > 17) blocks too small to stay exact."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
    s13 = torch.randint(120 - spread, 121, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8)
    s2 = torch.randint(120 - spread, 121, (E, H, I // 32), generator=g, dtype=torch.uint8)
    s13[1, :I] += 3          # expert 1: w1 holds the top exponent
    s13[2, I:] += 2          # expert 2: w3 does
    w13[3] = 0               # an all-zero expert
    w2[3] = 0
    w13[4, :, :8] = 0        # zero blocks inside an expert
    return w13, s13, w2, s2


def _offline(w13, s13, w2, s2):
    """Per expert: mxfp4_to_nvfp4 on w1, w3, w2, then w13_shared_global_scale on the pair (quantize.method=cast)."""
    to_nv, shared = Mxfp4ToNvfp4(), W13SharedGlobalScale()
    rows = []
    for e in range(w13.shape[0]):
        pair = {}
        for p, sl in (("w1", slice(0, I)), ("w3", slice(I, 2 * I))):
            out = to_nv.convert({"weight": w13[e, sl].clone(), "scale": s13[e, sl].clone()}, f"x.{e}.{p}")
            pair.update({f"{p}.{k}": v for k, v in out.items()})
        pair = shared.convert(pair, f"x.{e}")
        down = to_nv.convert({"weight": w2[e].clone(), "scale": s2[e].clone()}, f"x.{e}.w2")
        rows.append((pair, down))
    return rows


@pytest.mark.parametrize("spread", [6, 24])   # 24 binades: some blocks fall below E4M3's window
def test_bytes_equal_the_offline_converters(spread):
    w13, s13, w2, s2 = _experts(spread, spread)
    want = _offline(w13, s13, w2, s2)
    q13, q2, stats = cast_stacked_experts(w13.clone(), s13.clone(), w2.clone(), s2.clone(), chunk=4)
    assert stats["experts"] == E
    if spread > 17:
        assert stats["inexact_blocks"] > 0
    for e, (pair, down) in enumerate(want):
        assert torch.equal(q13.data[e], torch.cat([pair["w1.weight"], pair["w3.weight"]]))
        assert torch.equal(q13.scale[e].view(torch.uint8),
                           torch.cat([pair["w1.weight_scale"], pair["w3.weight_scale"]]).view(torch.uint8))
        assert q13.global_scale[e] == pair["w1.weight_scale_2"] == pair["w3.weight_scale_2"]
        assert torch.equal(q2.data[e], down["weight"])
        assert torch.equal(q2.scale[e].view(torch.uint8), down["weight_scale"].view(torch.uint8))
        assert q2.global_scale[e] == down["weight_scale_2"]
    # the all-zero expert and the experts whose top sits in w1 or in w3 are all covered
    assert q13.global_scale[1] != q13.global_scale[2]


def _shards(w13, s13, w2, s2, tp: int, r: int):
    """Rank r's part under tensor parallelism: w1/w3 rows and w2 columns (vLLM's FusedMoE split)."""
    i = I // tp
    rows = torch.cat([torch.arange(r * i, (r + 1) * i), I + torch.arange(r * i, (r + 1) * i)])
    return (w13[:, rows].clone(), s13[:, rows].clone(), w2[:, :, r * i // 2:(r + 1) * i // 2].clone(),
            s2[:, :, r * i // 32:(r + 1) * i // 32].clone())


def test_tensor_parallel_shards_get_the_whole_tensors_bytes():
    """Each rank casts its rows; the MAX all-reduce of the top exponents (replayed here, call by call)
    gives every rank the global scales, hence the bytes, of the unsharded cast."""
    tp = 2
    w13, s13, w2, s2 = _experts(7, 10)
    s13[:, :I // 2] += 4      # rank 0's w1 rows hold the top exponent: rank 1 alone would pick another
    whole13, whole2, _ = cast_stacked_experts(w13.clone(), s13.clone(), w2.clone(), s2.clone(), chunk=4)
    seen: list[list[torch.Tensor]] = [[] for _ in range(tp)]
    for r in range(tp):   # first pass: each rank's own tops, in call order
        cast_stacked_experts(*_shards(w13, s13, w2, s2, tp, r), reduce_top=lambda t, r=r: seen[r].append(t.clone()),
                             chunk=4)
    maxima = [torch.maximum(a, b) for a, b in zip(*seen)]
    i = I // tp
    for r in range(tp):
        calls = iter(maxima)
        q13, q2, _ = cast_stacked_experts(*_shards(w13, s13, w2, s2, tp, r),
                                          reduce_top=lambda t: t.copy_(next(calls)), chunk=4)
        rows = torch.cat([torch.arange(r * i, (r + 1) * i), I + torch.arange(r * i, (r + 1) * i)])
        assert torch.equal(q13.global_scale, whole13.global_scale)
        assert torch.equal(q13.data, whole13.data[:, rows])
        assert torch.equal(q13.scale.view(torch.uint8), whole13.scale[:, rows].view(torch.uint8))
        assert torch.equal(q2.global_scale, whole2.global_scale)
        assert torch.equal(q2.data, whole2.data[:, :, r * i // 2:(r + 1) * i // 2])


def test_refuses_what_is_not_vllms_mxfp4_layout():
    w13, s13, w2, s2 = _experts(0, 4)
    with pytest.raises(ValueError, match=r"w13: expected stacked MXFP4 experts.*float8_e4m3fn"):
        cast_stacked_experts(w13, s13.view(torch.float8_e4m3fn), w2, s2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the load-time cast's Triton path")
@pytest.mark.parametrize("spread", [6, 24])
def test_cuda_cast_equals_the_cpu_cast(spread):
    """On the GPU the cast takes the fused Triton scale passes (given tops included: the TP path);
    the bytes must be the CPU torch path's, expert by expert."""
    w13, s13, w2, s2 = _experts(100 + spread, spread)
    want13, want2, _ = cast_stacked_experts(w13.clone(), s13.clone(), w2.clone(), s2.clone(), chunk=4)
    for reduce_top in (None, lambda t: None):   # a given top equal to the tensor's own
        got13, got2, _ = cast_stacked_experts(w13.cuda(), s13.cuda(), w2.cuda(), s2.cuda(), reduce_top=reduce_top,
                                              chunk=4)
        for got, want in ((got13, want13), (got2, want2)):
            assert got.data.is_cuda
            assert torch.equal(got.data.cpu(), want.data)
            assert torch.equal(got.scale.cpu().view(torch.uint8), want.scale.view(torch.uint8))
            assert torch.equal(got.global_scale.cpu(), want.global_scale)
