"""CPU host: compile the warp-specialized prototype for sm90 (Triton 3.6 first on the path), print registers,
shared memory and the consumer loop's instruction count."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.getcwd()); sys.path.insert(0, "scratch/ws")
import torch
import triton
import ws_decode as k
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig as D


def div16(fn, sig):
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in sig
            if n.endswith("_ptr") or n.startswith("stride") or n in ("I", "H")}


def compile_one(fn, sig, consts, num_warps, maxnreg, dump=None):
    src = GluonASTSource(fn, {**sig, **{n: "constexpr" for n in consts}}, consts, attrs=div16(fn, sig))
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, maxnreg=maxnreg))
    f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(ck.asm["cubin"]); f.close()
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    if dump:
        open(dump + ".sass", "w").write(sass); open(dump + ".ptx", "w").write(ck.asm["ptx"])
    line = [l for l in out.splitlines() if "REG" in l]
    return (line[0].strip() if line else out[-300:]), ck.metadata.shared, sass


desc = mangle_type(k.weight_descriptor(torch.zeros(64 * 4096, dtype=torch.uint8), 256))
desc2 = mangle_type(k.weight_descriptor(torch.zeros(64 * 4096, dtype=torch.uint8), 128))
L1SIG = dict(w_desc=desc, x_ptr="*bf16", stride_xm="i32", w_ptr="*u8", stride_we="i64", stride_wn="i32", s_ptr="*u8",
             stride_se="i32", stride_sn="i32", gs_ptr="*fp32", out_ptr="*bf16", stride_om="i32",
             sorted_ids_ptr="*i32", expert_ids_ptr="*i32", num_padded_ptr="*i32", num_slots="i32", top_k="i32",
             I="i32", H="i32", limit="fp32", ws_ptr="*fp32", cnt_ptr="*i32")
L2SIG = dict(w_desc=desc2, a_ptr="*bf16", stride_am="i32", w_ptr="*u8", stride_we="i64", stride_wn="i32",
             s_ptr="*u8", stride_se="i32", stride_sn="i32", gs_ptr="*fp32", topk_w_ptr="*fp32", out_ptr="*fp32",
             stride_om="i32", sorted_ids_ptr="*i32", expert_ids_ptr="*i32", num_padded_ptr="*i32", num_slots="i32",
             H="i32", I="i32", stride_os="i32", sum_ptr="*bf16", sum_cnt_ptr="*i32", top_k="i32")
stages, maxnreg = int(sys.argv[1]), int(sys.argv[2])
c1 = D(8, 1, 256, int(sys.argv[3]) if len(sys.argv) > 3 else 8, 1, split_k=1)
c2 = D(8, 2, 128, 4, 2, split_k=2)
for name, fn, sig, c, extra in (("L1", k.l1_ws_kernel, L1SIG, c1, dict(HAS_LIMIT=True, PDL=True)),
                                ("L2", k.l2_ws_kernel, L2SIG, c2, dict(FUSE_SUM=True, PDL=True))):
    lay = k.layouts(c, stages, maxnreg)
    nw = lay.pop("num_warps"); mr = lay.pop("maxnreg")
    res, smem, sass = compile_one(fn, sig, {**lay, **extra}, nw, mr, dump=f"/tmp/ws_{name}")
    hmma = sass.count("HMMA")
    print(name, res, "smem", smem, "HMMA", hmma, "SYNCS" , sass.count("SYNCS"), "USETMAXREG", sass.count("USETMAXREG"))
