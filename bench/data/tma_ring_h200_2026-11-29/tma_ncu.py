# Run at git 07ad451 (the TMA ring removed after it), repo root on a GPU host: PYTHONPATH=$PWD python3 THIS
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.getcwd())
from nvfp4stack.bench.moe_kernel import random_nvfp4_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm
from nvfp4stack.kernels.moe.hopper_w4a16 import tile_choice as tc
from nvfp4stack.kernels.moe.hopper_w4a16 import tiles

dev = torch.device("cuda")
hidden, inter, experts = 4096, 2048, 256
g = torch.Generator(device=dev).manual_seed(0)
t13, t2 = tiles.tile_experts(random_nvfp4_experts(experts, 2 * inter, hidden, dev, g),
                             random_nvfp4_experts(experts, hidden, inter, dev, g))
sms = fm.sm_count(dev)
pick = fm.pick_call(6 / 256, 6, 256, hidden, inter, True, sms)
l1, l2 = tc._DECODE_FEW
def tma(w1, m2, slots):
    return tc.fill_split((replace(l1, num_warps=w1, tma=slots), replace(l2, mrep=m2, prefetch=0, tma=slots)), 6, experts, hidden, inter, sms)
from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_tma as dt

cfgs = {"pick": (pick, 64), "t4/64": (tma(8, 2, 4), 64), "t4/256": (tma(8, 2, 4), 256)}
ids = torch.randperm(experts, device=dev, generator=g)[:6].view(1, 6).to(torch.int32)
wts = torch.softmax(torch.randn(1, 6, device=dev, generator=g), -1)
x = torch.randn(1, hidden, device=dev, dtype=torch.bfloat16, generator=g)
for name, (c, lb) in cfgs.items():
    dt.LINE_BYTES = lb
    print("===", name, c, flush=True)
    for _ in range(3):
        fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True, config=c)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True, config=c)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
