"""Run as a script by tests/kernels/moe/test_decode_compile.py, in a process of its own (importing the Gluon
kernels pulls Triton in, which the CPU tests of the backend's registration check stays out): compiles the
mma.sync decode pairs for sm90 with this host's Triton and prints, as JSON, each kernel's registers (cuobjdump;
null where it is missing), or {"skip": reason} where this Triton cannot compile for sm90 here."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace

# pointer operands by name (the rest: int32 ids and counts); the one stride that may pass 2**31, and the clamp
_PTR = {"x_ptr": "*bf16", "a_ptr": "*bf16", "out_ptr": "*bf16", "sum_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8",
        "gs_ptr": "*fp32", "topk_w_ptr": "*fp32", "ws_ptr": "*fp32"}
_SCALAR = {"stride_we": "i64", "limit": "fp32"}


def compile_cubin(fn, cfg, **consts) -> bytes:
    """The kernel for one DecodeConfig (tiled weights, PDL on), as fused_moe launches it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg

    mma, w_bytes, w_blocks, x_l, extra = dg.decode_layouts(cfg.num_warps, cfg.mrep, cfg.block_t, cfg.block_k,
                                                            cfg.prefetch)
    consts = dict(MMA=mma, W_BYTES=w_bytes, W_BLOCKS=w_blocks, X_L=x_l, ROWS=cfg.rows, BT=cfg.block_t,
                  BK=cfg.block_k, PREFETCH=cfg.prefetch, W32_L=extra, TILED=True, SPLIT=cfg.split_k, PDL=True, **consts)
    signature = {p.name: "constexpr" if p.is_constexpr else _PTR.get(p.name, "*i32") if p.name.endswith("_ptr")
                 else _SCALAR.get(p.name, "i32") for p in fn.params}
    if fn is dg.l2_decode_kernel and cfg.split_k > 1:
        signature["out_ptr"] = "*fp32"   # the split runs' fp32 partial rows
    options = dict(num_warps=cfg.num_warps, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
    return triton.compile(GluonASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32),
                          options=options).asm["cubin"]


def registers(cubin: bytes) -> int | None:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+)", out)
    return int(found.group(1)) if found else None


def pairs() -> dict:
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16, DecodeConfig

    return {
        "one token (split 2, top-k sum in L2)": tuple(replace(c, split_k=2) for c in _DECODE_FEW),
        "few tokens": _DECODE_FEW,
        "L2 at prefetch 1": (_DECODE_FEW[0], replace(_DECODE_FEW[1], prefetch=1)),
        "16-token pair": _DECODE_T16,
        "prefetch 2": (DecodeConfig(8, 1, 128, 8, 2, split_k=2), DecodeConfig(8, 2, 128, 4, 2, split_k=2)),
        "prefetch 2, capped": (DecodeConfig(8, 1, 256, 8, 2, split_k=2, maxnreg=80),
                               DecodeConfig(8, 2, 128, 4, 2, split_k=2)),
    }


def main() -> int:
    try:
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"skip": f"this Triton has no Gluon AST source: {exc}"}))
        return 0
    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg

    out = {}
    try:
        for name, (l1, l2) in pairs().items():
            c1 = compile_cubin(dg.l1_swiglu_decode_kernel, l1, HAS_LIMIT=True)
            c2 = compile_cubin(dg.l2_decode_kernel, l2, FUSE_SUM=name.startswith("one token"))
            out[name] = {"bytes": [len(c1), len(c2)], "registers": [registers(c1), registers(c2)],
                         "caps": [l1.maxnreg, l2.maxnreg]}
            if l1.maxnreg:   # the same L1 with a cap of 64 and with none
                out[name]["cap64_and_free"] = [registers(compile_cubin(dg.l1_swiglu_decode_kernel, replace(l1, maxnreg=n),
                                                                       HAS_LIMIT=True)) for n in (64, 0)]
    except RuntimeError as exc:   # no ptxas in this Triton: nothing to compile with
        if "ptxas" not in str(exc).lower():
            raise
        out = {"skip": f"this Triton cannot compile for sm90 here: {exc}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
