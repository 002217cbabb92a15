"""CPU-host script (no GPU needed): the K loop's SASS instruction mix of the mma.sync decode kernels the heuristic
picks, compiled for sm90 by this host's Triton as a GPU host's JIT builds them (tests/support/decode_compile.py:
tiled weights, PDL on, pointers and strides known divisible by 16).

Pairs (tile_choice): ``one token``, pick_call's pair at one token of Flash 256 on 132 SMs (_DECODE_FEW split in 2 K
runs, L1 at prefetch 1 under 80 registers: prefetch_l1), with the top-k sum in L2; ``few tokens``, _DECODE_FEW
unsplit; ``16 tokens``, _DECODE_T16 (the ring's fallback).
A row per kernel gives:
  regs      registers a thread (cuobjdump --dump-resource-usage);
  loop      SASS instructions of the K loop, one K step (the instructions the longest backward branch spans;
            checked: its HMMA count is one step's, mrep * BK/16 * BT/8);
  words     32-bit weight words a thread dequantizes a K step: rows * BK / 8 / (32 * num_warps) (rows =
            16 * num_warps * mrep, BK codes a row, 8 codes a word), checked against the weight layout;
  /word     loop / words: the instructions a warp issues per 32-bit weight word of each of its threads;
  LDG       the loop's global loads by width: '128:12' 12 LDG.E.128 (weight words and activations), '32' LDG.E,
            'U16' and 'U8' 2-byte and byte loads (the e4m3 scales; weights in bytes where alignment is lost);
  top ops   the loop's most frequent opcodes.

Usage (repo root, any host): python3 bench/tools/decode_sass.py [--top 6] [--unaligned]
  --unaligned: compile without the divisibility-by-16 operands (what the CI compile did until 2026-11-28: the
  weights and activations load in bytes and halves)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def pairs() -> dict:
    """name -> ((L1, L2) DecodeConfigs, L2's FUSE_SUM), the decode pairs the heuristic picks."""
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16, pick_call

    return {"one token": (pick_call(6 / 256, 6, 256, 4096, 2048, True, 132), True),
            "few tokens": (_DECODE_FEW, False), "16 tokens": (_DECODE_T16, False)}


def weight_words(cfg) -> int:
    """32-bit weight words one thread loads and dequantizes a K step (decode_compile.weight_words, from the
    DecodeConfig), checked against the register layout of the weight bytes (_decode_layouts: 2 ** len(reg_bases)
    bytes a thread)."""
    from nvfp4stack.kernels.moe.hopper_w4a16._decode_layouts import decode_layouts
    from tests.support.decode_compile import weight_words as words_of

    words = words_of(cfg)
    w_bytes = decode_layouts(cfg.num_warps, cfg.mrep, cfg.block_t, cfg.block_k, cfg.prefetch)[1]
    assert 2 ** len(w_bytes.reg_bases) == 4 * words, (cfg, w_bytes.reg_bases)
    return words


def tile(cfg) -> str:
    return (f"t{cfg.block_t}/m{cfg.mrep}/k{cfg.block_k}/w{cfg.num_warps} p{cfg.prefetch}"
            + (f" s{cfg.split_k}" if cfg.split_k > 1 else ""))


def rows(aligned: bool, top: int) -> list[tuple]:
    """(pair, kernel, tile, regs, loop, words, loop/words, LDG counts, top ops) a kernel; the HMMA check of the
    module docstring raises where the loop found is not one K step."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg
    from tests.support.decode_compile import compile_cubin, loads, loop_mix, mmas, registers, step_mmas

    out = []
    for name, ((l1, l2), fuse) in pairs().items():
        for kernel, fn, cfg, consts in (("L1", dg.l1_swiglu_decode_kernel, l1, dict(HAS_LIMIT=True)),
                                        ("L2", dg.l2_decode_kernel, l2, dict(FUSE_SUM=fuse))):
            cubin = compile_cubin(fn, cfg, aligned=aligned, **consts)
            mix = loop_mix(cubin)
            if mix is None:
                return []
            found = mmas(mix)
            if found != step_mmas(cfg):
                raise RuntimeError(f"{name} {kernel}: the longest backward branch spans {found} HMMA, not one K "
                                   f"step's; the loop found is not the K loop: {mix}")
            words = weight_words(cfg)
            ldg = " ".join(f"{op.removeprefix('LDG.E').lstrip('.') or '32'}:{n}" for op, n in loads(mix).items())
            ops = ", ".join(f"{op} {n}" for op, n in list(mix["ops"].items())[:top])
            out.append((name, kernel, tile(cfg), registers(cubin), mix["total"], words, mix["total"] / words,
                        ldg, ops))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--top", type=int, default=6, help="opcodes to list a kernel (default 6)")
    p.add_argument("--unaligned", action="store_true", help="no divisibility-by-16 operands (see the docstring)")
    a = p.parse_args()
    try:
        import triton
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401
    except ImportError as exc:
        print(f"decode_sass: needs a Triton with Gluon (3.6+) that compiles for sm90; nothing run ({exc})")
        return 2
    try:
        table = rows(not a.unaligned, a.top)
    except RuntimeError as exc:   # no ptxas in this Triton: nothing to compile with
        if "ptxas" not in str(exc).lower():
            raise
        print(f"decode_sass: needs a Triton with Gluon (3.6+) that compiles for sm90; nothing run ({exc})")
        return 2
    if not table:
        print("decode_sass: needs cuobjdump (Triton's backends/nvidia/bin or PATH) to read the SASS; nothing run")
        return 2
    print(f"Triton {triton.__version__}, sm90, tiled weights, "
          + ("no divisibility attrs" if a.unaligned else "operands divisible by 16 (as the JIT at real shapes)"))
    head = ("pair", "kernel", "tile", "regs", "loop", "words", "/word", "LDG", "top ops")
    widths = (10, 6, 23, 4, 4, 5, 5, 18, 0)
    print("  ".join(f"{h:<{w}}" for h, w in zip(head, widths)).rstrip())
    for r in table:
        cells = (*r[:6], f"{r[6]:.1f}", *r[7:])
        print("  ".join(f"{c:<{w}}" if isinstance(c, str) else f"{c:>{w}}" for c, w in zip(cells, widths)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
