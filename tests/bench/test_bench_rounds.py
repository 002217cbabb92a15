"""bench/rounds.py: the order settings are measured in, and what a cell of rounds prints."""
import pytest

from nvfp4stack.bench.rounds import Cell, interleave, ratio_text, schedule, speedup, worst_spread

BASES = ("marlin", "humming", "bf16")


def test_ours_and_baselines_alternate_in_their_given_order():
    names = ["triton_w4a16", "triton_w4a16+fp8", "marlin", "humming", "bf16"]
    assert interleave(names, BASES) == ["triton_w4a16", "marlin", "triton_w4a16+fp8", "humming", "bf16"]
    assert interleave(["marlin", "bf16", "torch_emulation"], BASES) == ["torch_emulation", "marlin", "bf16"]
    assert interleave(["bf16"], BASES) == ["bf16"]


def test_every_odd_round_runs_backwards_and_every_setting_gets_every_round():
    order = schedule(["ours", "marlin", "bf16"], BASES, 3)
    assert order == [(0, "ours"), (0, "marlin"), (0, "bf16"),
                     (1, "bf16"), (1, "marlin"), (1, "ours"),
                     (2, "ours"), (2, "marlin"), (2, "bf16")]
    # no setting runs all its rounds before another starts its first
    assert [n for r, n in order if r == 0] == ["ours", "marlin", "bf16"]


def test_cell_median_range_and_spread():
    c = Cell((21731.0, 16168.0, 19800.0))
    assert (c.median, c.lo, c.hi) == (19800.0, 16168.0, 21731.0)
    assert c.spread == pytest.approx((21731 - 16168) / 19800)
    assert c.text() == "19,800 [16,168-21,731] 28.1%"
    assert Cell((2.134, 2.2, 2.1)).text() == "2.13 [2.10-2.20] 4.7%"
    assert Cell((583.0,)).text() == "583"   # one round: no range to show
    d = Cell((1.0, 3.0, 2.0)).to_dict()
    assert d == {"median": 2.0, "min": 1.0, "max": 3.0, "spread": 1.0, "rounds": [1.0, 3.0, 2.0]}


def test_a_ratio_whose_ranges_overlap_is_within_noise():
    ours, marlin = Cell((9021.0, 8461.0, 8800.0)), Cell((7915.0, 8500.0, 8100.0))
    assert ratio_text("decode b=32 tok/s", ours, marlin) == "within noise (1.09)"   # 8461-9021 vs 7915-8500
    clear = Cell((7915.0, 8000.0, 8100.0))
    assert ratio_text("decode b=32 tok/s", ours, clear) == "1.10"
    # latency: the baseline's over ours, same noise rule
    assert ratio_text("decode b=8 TPOT ms", Cell((2.0, 2.1, 2.05)), Cell((3.0, 3.1, 2.9))) == "1.46"
    assert ratio_text("decode b=8 TPOT ms", Cell((2.0, 3.0, 2.5)), Cell((2.9, 3.1, 3.0))) == "within noise (1.20)"
    # single rounds carry no range: the ratio is printed as it is, never called noise
    assert ratio_text("decode b=1 tok/s", Cell((550.0,)), Cell((550.0,))) == "1.00"
    assert speedup("engine ready s", 200.0, 100.0) == 0.5


def test_worst_spread_skips_single_rounds():
    cells = {"a": Cell((100.0, 101.0, 102.0)), "b": Cell((100.0, 110.0, 105.0)), "c": Cell((5.0,))}
    name, cell = worst_spread(cells)
    assert name == "b" and cell.spread == pytest.approx(10 / 105)
    assert worst_spread({"c": Cell((5.0,))}) is None
