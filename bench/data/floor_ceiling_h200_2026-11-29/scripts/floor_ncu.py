"""GPU host, under ncu: one call of the one-token pick at Flash 256 with a dequant variant (argv[1])."""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, "scratch/floor")
import deq_variants

deq_variants.apply(sys.argv[1])
import torch

from nvfp4stack.bench.moe_few_tokens import call_inputs
from nvfp4stack.bench.moe_kernel import random_tiled_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
t13, t2 = random_tiled_experts(256, 4096, 2048, dev, g)
ids, wts, x = call_inputs(1, 256, 6, 4096, "uniform", g, dev)
for _ in range(3):
    fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", sys.argv[1], flush=True)
