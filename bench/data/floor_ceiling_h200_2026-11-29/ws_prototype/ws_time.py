"""GPU host: the one/few-token pick with its pair replaced by the warp-specialized prototype (argv[1]: 'pick' or
'ws:STAGES:SPLIT1:MAXNREG', SPLIT1 0 = the pick's), at the 'few' loads; checks against the fp32 twin (and, for
SPLIT1 0, bit-equality with the register pair) first. Cold L2 (read flush), CUDA graphs, median of 5."""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, "scratch/ws")
import torch

from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
from nvfp4stack.bench.moe_few_tokens import call_inputs, expert_bytes, hbm_peak_tbs
from nvfp4stack.bench.moe_kernel import random_tiled_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

variant, rounds = sys.argv[1], int(sys.argv[2])
RUNS = [("flash", (4096, 2048), 256, (1, 2, 4)), ("flash", (4096, 2048), 64, (1, 2)), ("pro", (7168, 3072), 48, (1, 2))]
dev = torch.device("cuda")
flush = flush_buffer(dev)
peak = hbm_peak_tbs(torch.cuda.get_device_name())
if variant != "pick":
    import ws_decode
    _, st, sp, mr, w1 = (variant + ":0").split(":")[:5]
    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg
    reg_launch = dg.launch
    ws_decode.install(stages=int(st), split1=int(sp) or None, maxnreg=int(mr), l1_warps=int(w1))
    ws_launch = dg.launch
for shape, (hidden, inter), experts, counts in RUNS:
    g = torch.Generator(device=dev).manual_seed(0)
    t13, t2 = random_tiled_experts(experts, hidden, inter, dev, g)
    per_expert = expert_bytes(t13, t2)
    for kind in ("uniform", "zipf"):
        for t in counts:
            ids, wts, x = call_inputs(t, experts, 6, hidden, kind, g, dev)
            f = lambda: fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True)
            out = f().float()
            check = ""
            if variant != "pick":
                dg.launch = reg_launch
                reg = f().float()
                dg.launch = ws_launch
                check = f"vs register pair: equal={torch.equal(out, reg)} rel={float((out - reg).norm() / reg.norm()):.1e}"
            ok = bool(torch.isfinite(out).all())
            times = sorted(cold_time_us(f, flush) for _ in range(rounds))
            med = times[len(times) // 2]
            nbytes = int(torch.unique(ids).numel()) * per_expert
            print(f"ROW {variant} {shape}{experts} {kind} T={t} {med:.1f} [{times[0]:.1f}-{times[-1]:.1f}] "
                  f"{100 * nbytes / med / 1e6 / peak:.0f}%HBM finite={ok} {check}", flush=True)
