"""The load check's write coverage on meta parameters: boxes from views, union, and what stays unwritten."""
from __future__ import annotations

import torch

from nvfp4stack.models.deepseek_v4.load_coverage import WriteRecorder, view_box


def _meta(*shape) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


def test_missing_expert_shard_is_the_only_unwritten_slice():
    # [experts, 2 * intermediate, hidden] like FusedMoE's w13: w1 rows then w3 rows per expert
    params = {"w13": _meta(5, 6, 8), "scale": _meta(()), "sink": _meta(7)}
    half = torch.empty(3, 8, device="meta")
    with torch.no_grad(), WriteRecorder(params) as rec:
        for e in range(5):
            for shard, start in (("w1", 0), ("w3", 3)):
                if (e, shard) != (3, "w1"):
                    params["w13"].data[e].narrow(0, start, 3).copy_(half)
        params["w13"].data[1].narrow(0, 0, 3).copy_(half)   # a repeated write covers nothing new
        params["scale"].data.copy_(torch.empty((), device="meta"))
        params["sink"][:4].copy_(torch.empty(4, device="meta"))
        params["sink"][7:].fill_(0)                            # empty view: no write
    assert rec.coverage["w13"].unwritten() == (3 * 8, [3])
    assert rec.coverage["scale"].unwritten() == (0, [])
    assert rec.coverage["sink"].unwritten() == (3, [4, 5, 6])
    assert all(not c.opaque for c in rec.coverage.values())


def test_a_write_that_is_not_a_box_is_reported_opaque():
    params = {"w": _meta(4, 4)}
    with torch.no_grad(), WriteRecorder(params) as rec:
        params["w"].data.index_put_((torch.tensor([0, 2], device="meta"),), torch.empty(2, 4, device="meta"))
    assert rec.coverage["w"].opaque == ["index_put_.default"]


def test_view_box_follows_transposes_and_refuses_strided_slices():
    p = _meta(4, 6)
    assert view_box(p, p.data[1:3].t()) == ((1, 3), (0, 6))
    assert view_box(p, p.data[:, ::2]) is None
