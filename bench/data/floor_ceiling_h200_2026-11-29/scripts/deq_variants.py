"""Diagnostic only (WRONG numbers): replace the Gluon decode pair's dequant before anything compiles.

variant pick     unchanged
variant noscale  the bit placement kept, no scale multiply and no scale decode (the scale loads dropped by the compiler)
variant none     no dequant at all: the weight words go to the MMA as they are (bitcast), scales unused
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg
from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import _e2m1x4_to_bf16

_PTX_MOV = gl.constexpr("""
        mov.b32 $0, $4; mov.b32 $1, $4; mov.b32 $2, $4; mov.b32 $3, $4;
        """)


@gluon.jit
def _words_as_bf16(packed):
    return gl.inline_asm_elementwise(asm=_PTX_MOV, constraints="=r,=r,=r,=r,r", args=[packed],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)


@gluon.jit
def _dequant_noscale(w, sc, MMA: gl.constexpr, W_BLOCKS: gl.constexpr, ROWS: gl.constexpr, BK: gl.constexpr,
                     TILED: gl.constexpr):
    w3 = gl.convert_layout(gl.reshape(w, [ROWS, BK // 16, 8]), W_BLOCKS, assert_trivial=True)
    lo, hi = _e2m1x4_to_bf16(w3, TILED)
    a = gl.reshape(gl.join(lo, hi), [ROWS, BK])
    a = dg._to_mma_k(a, ROWS, BK)
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))


@gluon.jit
def _dequant_none(w, sc, MMA: gl.constexpr, W_BLOCKS: gl.constexpr, ROWS: gl.constexpr, BK: gl.constexpr,
                  TILED: gl.constexpr):
    w3 = gl.convert_layout(gl.reshape(w, [ROWS, BK // 16, 8]), W_BLOCKS, assert_trivial=True)
    lo, hi = _words_as_bf16(w3)
    a = gl.reshape(gl.join(lo, hi), [ROWS, BK])
    a = dg._to_mma_k(a, ROWS, BK)
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))


def apply(variant: str) -> None:
    if variant == "pick":
        return
    dg._dequant_a = {"noscale": _dequant_noscale, "none": _dequant_none}[variant]
