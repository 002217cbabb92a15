"""PlannedWeights: emulated weights start from the source checkpoint's own bytes (checked on the
tiny DeepSeek-V4's release layout against its BF16 layout)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.eval.emulate import emulate_weight
from nvfp4stack.eval.weights import PlannedWeights
from nvfp4stack.models.deepseek_v4.tiny import layout_dir
from nvfp4stack.quantize.report import dequantize_group
from nvfp4stack.schemes import Scheme

WQB, W2 = "layers.1.attn.wq_b", "layers.2.ffn.experts.5.w2"


@pytest.fixture(scope="module")
def ref(root):
    r = ShardedReader(layout_dir(root, "bf16"))
    return {n: r.get(n + ".weight").float() for n in (WQB, W2)}


def test_bf16_source_quantizes_the_reference_like_modelopt(ref):
    pw = PlannedWeights({WQB: Scheme.BF16}, None)
    assert torch.equal(pw.emulate(ref[WQB], Scheme.FP8_BLOCK, WQB), emulate_weight(ref[WQB], Scheme.FP8_BLOCK, WQB))
    assert torch.equal(pw.emulate(ref[WQB], Scheme.BF16, WQB), ref[WQB])


def test_quantized_source_starts_from_its_own_bytes(root, ref):
    release = layout_dir(root, "release")
    pw = PlannedWeights({WQB: Scheme.FP8_BLOCK, W2: Scheme.MXFP4}, release)
    stored = dequantize_group(ShardedReader(release), WQB + ".weight")
    # FP8 release -> bf16 target: the release's rounding stays (it is what the plan serves)
    got = pw.emulate(ref[WQB], Scheme.BF16, WQB)
    assert torch.equal(got, stored) and not torch.equal(got, ref[WQB])
    assert torch.equal(pw.emulate(ref[WQB], Scheme.FP8_BLOCK, WQB), stored)  # passthrough
    assert torch.equal(pw.emulate(ref[WQB], Scheme.NVFP4, WQB), emulate_weight(stored, Scheme.NVFP4, WQB))
    # MXFP4 -> NVFP4 through the plan's cast: lossless on the FP4-QAT experts, whatever the reference says
    noisy = ref[W2] + 0.01 * torch.randn_like(ref[W2])
    for scheme in (Scheme.NVFP4, Scheme.NVFP4_W4A16):
        assert torch.equal(pw.emulate(noisy, scheme, W2), ref[W2])
    assert pw.inexact_blocks == 0


def test_stacked_experts_share_one_global_scale_per_expert(root):
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import dequantize_expert

    bf16 = ShardedReader(layout_dir(root, "bf16"))
    prefix, n = "layers.2.ffn.experts", 16
    names = {f"{prefix}.{e}.{p}": Scheme.MXFP4 for e in range(n) for p in ("w1", "w2", "w3")}
    pw = PlannedWeights(names, layout_dir(root, "release"))
    gate_up = torch.stack([torch.cat([bf16.get(f"{prefix}.{e}.w1.weight"), bf16.get(f"{prefix}.{e}.w3.weight")])
                           for e in range(n)]).float()
    down = torch.stack([bf16.get(f"{prefix}.{e}.w2.weight") for e in range(n)]).float()
    w13, w2 = pw.experts_nvfp4(prefix, n, gate_up, down, proj=("w1", "w3", "w2"))
    assert w13.global_scale.shape == (n,) and w2.global_scale.shape == (n,)
    for e in (0, 7, 15):
        assert torch.equal(dequantize_expert(w13, e), gate_up[e]) and torch.equal(dequantize_expert(w2, e), down[e])


def test_errors_name_the_fix(root, ref, tmp_path):
    pw = PlannedWeights({WQB: Scheme.FP8_BLOCK}, None)
    with pytest.raises(ValueError, match="source_dir"):
        pw.emulate(ref[WQB], Scheme.BF16, WQB)
    pw = PlannedWeights({WQB: Scheme.FP8_BLOCK}, layout_dir(root, "release"))
    with pytest.raises(ValueError, match="eval.reference_path"):
        pw.emulate(ref[WQB][:, :64], Scheme.BF16, WQB)


def test_reference_dir_for_a_quantized_source(root, tmp_path):
    from nvfp4stack.cli import compose_config
    from nvfp4stack.eval.precision import bf16_checkpoint_dir, source_checkpoint_dir

    cfg = compose_config("recipe=tiny_dsv4", "model.source_format=official", "run_dir=/tmp/unused")
    ref = bf16_checkpoint_dir(cfg)
    assert ref.name == "bf16" and source_checkpoint_dir(cfg, ref).name == "release"
    release = layout_dir(root, "release")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, factory=None, path=str(release)))
    with pytest.raises(FileNotFoundError, match="eval.reference_path"):
        bf16_checkpoint_dir(cfg)
    with_ref = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, reference_path=str(layout_dir(root, "bf16"))))
    assert bf16_checkpoint_dir(with_ref) == layout_dir(root, "bf16")
    assert source_checkpoint_dir(with_ref, layout_dir(root, "bf16")) == release
