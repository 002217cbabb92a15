"""bench/moe_few_tokens.py: its routing (distinct experts per token, Zipf skew) and the CPU refusal."""
import os

import pytest
import torch

from nvfp4stack.bench import moe_few_tokens as mf


def test_routing_distinct_per_token_and_zipf_is_skewed():
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    uni = mf.routing(4000, 64, 6, "uniform", g, "cpu")
    zipf = mf.routing(4000, 64, 6, "zipf", g, "cpu")
    for ids in (uni, zipf):
        assert ids.shape == (4000, 6) and ids.dtype == torch.int32
        assert all(len(set(row)) == 6 for row in ids.tolist())  # top-k picks distinct experts
    cu = torch.bincount(uni.reshape(-1).long(), minlength=64).float()
    cz = torch.bincount(zipf.reshape(-1).long(), minlength=64).float()
    assert cu.max() / cu.mean() < 1.3  # near balanced
    assert cz[0] > 4 * cz[32:].mean() and cz.max() / cz.mean() > 2  # the head experts are hot
    with pytest.raises(ValueError, match="--routing: expected uniform or zipf"):
        mf.routing(1, 8, 2, "pareto", g, "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a host without a GPU")
def test_no_gpu_is_said_and_nothing_runs(capsys):
    assert mf.main(["--tokens", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_rel_err_names_non_finite_outputs_and_measures():
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    ref = torch.randn(8, 64, generator=g)
    assert mf._rel_err(ref.clone(), ref) == 0.0
    assert abs(mf._rel_err(ref * 1.01, ref) - 0.01) < 1e-5
    poisoned = ref.clone()
    poisoned[3, 7] = float("nan")
    assert mf._rel_err(poisoned, ref) == float("inf")


def test_marlin_humming_and_sweep_flags_parse():
    a = mf.parser().parse_args(["--marlin", "on", "--humming", "off", "--no-sweep"])
    assert a.marlin == "on" and a.humming == "off" and a.sweep is False
    d = mf.parser().parse_args([])
    assert d.marlin == "auto" and d.humming == "auto" and d.sweep is True
    with pytest.raises(SystemExit):
        mf.parser().parse_args(["--marlin", "maybe"])
    with pytest.raises(SystemExit):
        mf.parser().parse_args(["--humming", "maybe"])


def test_rows_give_the_batch_that_reaches_each_average_and_l2_is_cold_by_default():
    # DeepSeek-V4-Pro EP: 48 local experts, top-6; Flash EP: 64, top-6 (a batch of 11 is 1.03 rows)
    assert mf.token_counts("1", "1,2,4,8,16", 48, 6) == [8, 16, 32, 64, 128]
    assert mf.token_counts("1", "1,8,16", 64, 6) == [11, 86, 171]
    assert mf.token_counts("3,5", None, 64, 6) == [3, 5]
    a = mf.parser().parse_args(["--rows", "1,2"])
    assert a.l2 == "cold" and a.rows == "1,2"
    assert mf.parser().parse_args(["--l2", "warm"]).l2 == "warm"
    assert mf.parser().parse_args(["--l2", "cold-dirty"]).l2 == "cold-dirty"  # the zeroing flush of older figures
    with pytest.raises(SystemExit):
        mf.parser().parse_args(["--l2", "lukewarm"])


def test_hbm_peak_takes_the_most_specific_name():
    """The % of HBM peak column divides by the datasheet bandwidth of the GPU torch names."""
    assert mf.hbm_peak_tbs("NVIDIA H200") == 4.8
    assert mf.hbm_peak_tbs("NVIDIA H100 80GB HBM3") == 3.35
    assert mf.hbm_peak_tbs("NVIDIA H100 PCIe") == 2.0
    assert mf.hbm_peak_tbs("NVIDIA H100 NVL") == 3.9
    assert mf.hbm_peak_tbs("NVIDIA GeForce RTX 4090") is None


def test_the_sweep_labels_tell_the_register_cap_and_prefetch_apart():
    from nvfp4stack.bench.moe_kernel import _short
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig

    capped = (DecodeConfig(8, 1, 256, 8, 2, split_k=2, maxnreg=80), DecodeConfig(8, 2, 128, 4, 2, split_k=2))
    assert _short(capped) == "gluon t8/m1/k256/w8/p2/sk2/r80+gluon t8/m2/k128/w4/p2/sk2"
    assert _short((DecodeConfig(8, 1, 256, 8, 2, split_k=2),) * 2) == "gluon t8/m1/k256/w8/p2/sk2"


def test_expert_bytes_are_the_packed_codes_and_scales_of_both_weights():
    """The "% of HBM" numerator per active expert (moe_few_tokens and bench/tools/decode_pick_ab.py): 4 bits a weight
    and one e4m3 scale a 16 of w13 [2I, H] and w2 [H, I], tiled or not."""
    from nvfp4stack.bench.moe_kernel import random_nvfp4_experts, random_tiled_experts

    hidden, inter = 256, 128
    want = 3 * hidden * inter // 2 + 3 * hidden * inter // 16
    g = torch.Generator().manual_seed(0)
    assert mf.expert_bytes(*random_tiled_experts(4, hidden, inter, "cpu", g)) == want
    rows = (random_nvfp4_experts(4, 2 * inter, hidden, "cpu", g), random_nvfp4_experts(4, hidden, inter, "cpu", g))
    assert mf.expert_bytes(*rows) == want
