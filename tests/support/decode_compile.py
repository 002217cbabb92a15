"""Run as a script by tests/kernels/moe/test_decode_compile.py, in a process of its own (importing the Gluon
kernels pulls Triton in, which the CPU tests of the backend's registration check stays out): compiles the
mma.sync decode pairs for sm90 with this host's Triton and prints, as JSON, each kernel's registers and its K
loop's length and global loads by width (cuobjdump; null where it is missing), or {"skip": reason} where this
Triton cannot compile for sm90 here. bench/tools/decode_sass.py imports compile_cubin and loop_mix from here."""
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
# This mirrors the JIT's specialization (Triton's backends/compiler.py: "D", tt.divisibility 16) for a launch whose
# strides and dims are multiples of 16, as at DeepSeek-V4's Flash and Pro shapes (it holds where K % 256 == 0, so
# that the scales' row stride K/16 is one too): its pointers are 16-byte aligned (torch allocations) and its int
# operands multiples of 16, but for these three: num_slots is do_not_specialize in both kernels, top_k is the
# model's (6; 0, which the JIT would mark, where L2 does not read it), limit is a float. Without it the weight
# words load byte by byte.
_UNALIGNED = {"num_slots", "top_k", "limit"}
_ALIGNED = [["tt.divisibility", 16]]


def compile_cubin(fn, cfg, aligned: bool = True, **consts) -> bytes:
    """The kernel for one DecodeConfig (tiled weights, PDL on), as fused_moe launches it: with ``aligned`` (the
    default) every pointer and int operand but ``_UNALIGNED``'s is known divisible by 16, as the JIT builds it on a
    GPU host; without, no operand is (what this compile did until 2026-11-28: byte loads of the weights)."""
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
    attrs = {(i,): _ALIGNED for i, p in enumerate(fn.params)
             if aligned and signature[p.name] != "constexpr" and p.name not in _UNALIGNED}
    options = dict(num_warps=cfg.num_warps, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
    return triton.compile(GluonASTSource(fn, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options).asm["cubin"]


def _cuobjdump(cubin: bytes, flag: str) -> str | None:
    """``cuobjdump <flag>`` of a cubin: the one shipped in triton/backends/nvidia/bin, else PATH's; None if none."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = subprocess.run([tool, flag, f.name], capture_output=True, text=True)
    return run.stdout if run.returncode == 0 else None   # a cuobjdump that fails reads as none: nothing read


def registers(cubin: bytes) -> int | None:
    out = _cuobjdump(cubin, "--dump-resource-usage")
    found = re.search(r"REG:(\d+)", out or "")
    return int(found.group(1)) if found else None


# one SASS line of cuobjdump -sass: /*0a30*/  @!P0 LDG.E.128 R4, desc[UR6][R2.64] ;
_SASS = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def loop_mix(cubin: bytes) -> dict | None:
    """The K loop's instruction mix, or None where there is no cuobjdump: ``{"total": n, "ops": {opcode: count}}``
    over the instructions from the target to the source of the longest backward branch (a BRA to a lower address;
    both ends counted), the kernel's K loop: the epilogues' spin and sum loops are short. Opcodes keep their
    modifiers ('LDG.E.128', 'HMMA.16816.F32.BF16'), predicate guards ('@P0') are dropped; static counts, every
    path through the loop body once."""
    sass = _cuobjdump(cubin, "-sass")
    if sass is None:
        return None
    code = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(_SASS.match, sass.splitlines()) if m]
    back = [(src - int(t.group(1), 16), int(t.group(1), 16), src) for src, op, args in code
            if op.startswith("BRA") and (t := re.search(r"0x([0-9a-f]+)", args)) and int(t.group(1), 16) < src]
    if not back:
        return {"total": 0, "ops": {}}
    _, lo, hi = max(back)
    ops: dict[str, int] = {}
    for addr, op, _ in code:
        if lo <= addr <= hi:
            ops[op] = ops.get(op, 0) + 1
    return {"total": sum(ops.values()), "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))}


def mmas(mix: dict | None) -> int | None:
    """A loop mix's HMMA instructions, None where the mix is."""
    return None if mix is None else sum(n for op, n in mix["ops"].items() if op.startswith("HMMA"))


def step_mmas(cfg) -> int:
    """HMMA instructions one K step of a DecodeConfig issues a warp: mrep m-tiles x BK/16 k-chunks x BT/8 n-tiles
    (the K loop's count, which tells the longest backward branch is that loop)."""
    return cfg.mrep * (cfg.block_k // 16) * (cfg.block_t // 8)


def weight_words(cfg) -> int:
    """32-bit weight words one thread loads and dequantizes a K step: rows x BK codes over 8 codes a word and the
    CTA's threads."""
    return cfg.rows * cfg.block_k // 8 // (32 * cfg.num_warps)


def loads(mix: dict | None) -> dict | None:
    """A loop mix's global loads by width ({'LDG.E.128': 12, 'LDG.E.64': 2, ...}), None where the mix is."""
    return None if mix is None else {op: n for op, n in mix["ops"].items() if op.startswith("LDG")}


def pairs() -> dict:
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16, DecodeConfig, pick_call

    return {
        # what the forward picks at one token of Flash 256/top-6 on 132 SMs: split 2, L1 at prefetch 1 capped
        "one token (split 2, top-k sum in L2)": pick_call(6 / 256, 6, 256, 4096, 2048, True, 132),
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
            mixes = [loop_mix(c1), loop_mix(c2)]
            out[name] = {"bytes": [len(c1), len(c2)], "registers": [registers(c1), registers(c2)],
                         "caps": [l1.maxnreg, l2.maxnreg], "loop": [m and m["total"] for m in mixes],
                         "loads": [loads(m) for m in mixes],
                         "mma": [mmas(m) for m in mixes],
                         "spills": [m and sum(n for op, n in m["ops"].items() if op.startswith(("STL", "LDL")))
                                    for m in mixes]}
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
