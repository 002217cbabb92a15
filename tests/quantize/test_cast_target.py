"""Which cast targets need an activation amax: the plan's served scheme for the routed experts decides
(W4A4 reads input_scale, weight-only W4A16 never does). CPU, no calibration, fake archs."""
from __future__ import annotations

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.models.deepseek_v4.quantize import cast_activation_target
from nvfp4stack.models.deepseek_v4.tiny import layout_dir


def _target(root, *overrides, quantize_mtp=False):
    cfg = compose_config("recipe=tiny_dsv4", "quantize.method=cast", "run_dir=/tmp/unused", *overrides)
    return cast_activation_target(cfg, layout_dir(root, "release"), quantize_mtp)


@pytest.mark.parametrize("overrides, needs, served", [
    ((), True, "nvfp4 on torch_emulation on cpu"),                                  # the README command
    (("precision.routed_experts=nvfp4_w4a16",), False, "nvfp4_w4a16 on torch_emulation on cpu"),
    (("arch=sm90", "backend.moe=auto"), False, "nvfp4_w4a16 on triton_w4a16 on sm90"),  # Hopper: weight-only
    (("arch=sm90", "backend.moe=marlin"), False, "nvfp4_w4a16 on marlin on sm90"),
    (("arch=sm100a", "backend.moe=auto"), True, "nvfp4 on flashinfer_trtllm on sm100a"),  # FP4 tensor cores
])
def test_served_scheme_decides(root, overrides, needs, served):
    got_needs, where = _target(root, *overrides)
    assert got_needs is needs and where == f"routed experts served {served}", where


def test_experts_kept_bf16_need_nothing(root):
    needs, where = _target(root, "precision.routed_experts=bf16")
    assert needs is False and "not as NVFP4" in where


def test_mtp_experts_count_only_when_cast(root):
    # main experts weight-only, the MTP block's experts W4A4 by a rule: they need amax only when the
    # cast writes them (quantize.mtp=nvfp4); copied untouched, they keep their MXFP4.
    rule = 'precision.rules=[{targets:["re:^mtp\\.0\\.ffn\\.experts\\."],scheme:nvfp4}]'
    assert _target(root, "precision.routed_experts=nvfp4_w4a16", rule)[0] is False
    needs, where = _target(root, "precision.routed_experts=nvfp4_w4a16", rule, quantize_mtp=True)
    assert needs is True and "nvfp4 on torch_emulation" in where and "nvfp4_w4a16" in where
