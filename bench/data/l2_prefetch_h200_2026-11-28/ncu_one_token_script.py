"""The ncu run of bench/data/l2_prefetch_h200_2026-11-28/ncu_one_token.csv (kept as run; the bulk / ahead options it
names were removed after this measurement: see git d5e5422). Flash 256/top-6, one token: the pick, b1, a2, a1."""
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.getcwd())
from nvfp4stack.bench.moe_kernel import random_nvfp4_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm
from nvfp4stack.kernels.moe.hopper_w4a16 import tiles

dev = torch.device("cuda")
hidden, inter, experts = 4096, 2048, 256
g = torch.Generator(device=dev).manual_seed(0)
t13, t2 = tiles.tile_experts(random_nvfp4_experts(experts, 2 * inter, hidden, dev, g),
                             random_nvfp4_experts(experts, hidden, inter, dev, g))
pick = fm.pick_call(6 / 256, 6, 256, hidden, inter, True, fm.sm_count(dev))
cfgs = {"pick": pick, "b1": tuple(replace(c, bulk=1) for c in pick), "a2": tuple(replace(c, ahead=2) for c in pick),
        "a1": tuple(replace(c, ahead=1) for c in pick)}
ids = torch.randperm(experts, device=dev, generator=g)[:6].view(1, 6).to(torch.int32)
wts = torch.softmax(torch.randn(1, 6, device=dev, generator=g), -1)
x = torch.randn(1, hidden, device=dev, dtype=torch.bfloat16, generator=g)
for name, c in cfgs.items():
    for _ in range(3):
        fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True, config=c)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True, config=c)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("=== done", name, flush=True)
