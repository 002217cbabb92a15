"""bench/tools/decode_pick_ab.py, warmup_compile_time.py and permute_k_ab.py are GPU-host scripts; on a CPU host they say so and exit 2,
and the pairs the A/B times are the ones its docstring names (the pick's own pair among them)."""
import importlib.util
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_ab_times_the_pick_against_the_old_pair_the_ring_and_a_forced_split():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16_RING, pick_call

    alts = _tool("decode_pick_ab").alternatives(6, 1, 256, 4096, 2048, 132)
    assert set(alts) == {"ring", "p1", "p2", "s2p2", "l1p1", "l1p2", "l2m1", "l2w8", "l2w2", "l1w4", "l1m2",
                         "l1k128p1", "l1p1r80", "l1k128p2r80"}
    pick = pick_call(6 / 256, 6, 256, 4096, 2048, True, 132)   # Flash one token, as the forward asks
    assert [c.split_k for c in pick] == [2, 2] and pick[1].prefetch == 2
    assert alts["l1p1r80"] == pick  # since 2026-11-29: L1 prefetches at 80 registers where its launch fits
    old = (replace(pick[0], prefetch=0, maxnreg=0), pick[1])
    assert alts["p2"] == old   # the pick until then
    assert alts["p1"] == (old[0], replace(pick[1], prefetch=1))   # the pair until 2026-11-28
    assert alts["ring"] == _DECODE_T16_RING
    assert [(c.prefetch, c.split_k) for c in alts["l1p1"]] == [(1, 2), (2, 2)]
    # the tile shapes: only one GEMM's warps and m-tiles differ from p2 (the same bits: rows are not summed)
    shape = lambda c: (c.num_warps, c.mrep)  # noqa: E731
    for gemm, names in ((1, ("l2m1", "l2w8", "l2w2")), (0, ("l1w4", "l1m2"))):
        for name in names:
            alt = alts[name]
            assert alt[1 - gemm] == old[1 - gemm], name
            assert replace(alt[gemm], num_warps=old[gemm].num_warps, mrep=old[gemm].mrep) == old[gemm], name
    assert [shape(alts[n][1]) for n in ("l2m1", "l2w8", "l2w2")] == [(4, 1), (8, 1), (2, 2)]
    assert [shape(alts[n][0]) for n in ("l1w4", "l1m2")] == [(4, 1), (4, 2)]
    # L1 prefetching at a resident size: the pick's L2 and splits, L1's step, prefetch and register cap as named
    for name, (bk, pf, cap) in {"l1k128p1": (128, 1, 0), "l1p1r80": (256, 1, 80), "l1k128p2r80": (128, 2, 80)}.items():
        alt = alts[name]
        assert alt[1] == pick[1] and (alt[0].block_k, alt[0].prefetch, alt[0].maxnreg) == (bk, pf, cap), name
        assert replace(alt[0], block_k=256, prefetch=0, maxnreg=0) == old[0], name
    # two tokens: fill_split leaves the pair whole, s2p2 splits it anyway
    two = _tool("decode_pick_ab").alternatives(6, 2, 256, 4096, 2048, 132)
    assert [c.split_k for c in two["p2"]] == [1, 1] and [c.split_k for c in two["s2p2"]] == [2, 2]
    assert two["p2"] == (_DECODE_FEW[0], replace(_DECODE_FEW[1], prefetch=2))


@pytest.mark.parametrize("name", ["decode_pick_ab", "warmup_compile_time", "permute_k_ab"])
def test_on_a_cpu_host_the_tools_say_so_and_exit_2(name):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the tool would run")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "tools" / f"{name}.py")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "needs a CUDA GPU" in r.stdout and "nothing run" in r.stdout


def test_an_unknown_alternative_is_refused_before_anything_runs():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "tools" / "decode_pick_ab.py"), "--only", "ring,b1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "nothing run" not in r.stdout, r.stdout
    assert ("--only: expected names among l1k128p1,l1k128p2r80,l1m2,l1p1,l1p1r80,l1p2,l1w4,l2m1,l2w2,l2w8,p1,p2,ring,s2p2, "
            "found b1; fix: --only ring"
            in r.stderr), r.stderr
