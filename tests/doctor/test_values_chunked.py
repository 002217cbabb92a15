"""Doctor value checks read a chunk at a time (issue #36): the findings on a tensor many chunks long
are the whole-tensor ones, NaN/Inf anywhere in it counted, byte statistics from the added-up histogram."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from nvfp4stack.doctor import stats
from nvfp4stack.doctor.files import read_checkpoint
from nvfp4stack.doctor.report import DoctorReport


@pytest.fixture
def ckpt(tmp_path, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(300, 64, generator=g).to(torch.bfloat16)       # 38,400 bytes
    w[7, 3], w[150, 0], w[-1, -1] = float("nan"), float("inf"), float("-inf")
    nv = (torch.randn(300, 4, generator=g).abs() * 100 + 1).to(torch.float8_e4m3fn)
    nv[5, 1] = float("nan")
    save_file({"m.layers.0.mlp.down_proj.weight": w,
               "m.layers.0.mlp.up_proj.weight": torch.randint(0, 256, (300, 32), generator=g, dtype=torch.uint8),
               "m.layers.0.mlp.up_proj.weight_scale": nv,
               "m.layers.0.mlp.up_proj.weight_scale_2": torch.tensor([-1.0]),
               "m.layers.0.mlp.gate_proj.scale": (120 + torch.randint(0, 5, (300, 2), generator=g)).to(torch.uint8)},
              str(tmp_path / "model.safetensors"))
    return tmp_path


def _findings(ckpt, monkeypatch, chunk: int) -> list[tuple[str, str, str]]:
    monkeypatch.setattr(stats, "CHUNK_BYTES", chunk)
    report = DoctorReport(str(ckpt))
    stats.check_values(read_checkpoint(ckpt, report), report)
    return sorted((f.check, f.where, f.found) for f in report.findings)


def test_chunked_findings_equal_whole_tensor_ones(ckpt, monkeypatch):
    whole = _findings(ckpt, monkeypatch, 1 << 20)
    assert whole == _findings(ckpt, monkeypatch, 64)   # 600 chunks for the BF16 weight
    assert ("nan_inf", "m.layers.0.mlp.down_proj.weight", "3 NaN/Inf values of 19200") in whole
    assert ("global_scale", "m.layers.0.mlp.up_proj.weight_scale_2", "[-1.0]") in whole
    (nv,) = [f for f in whole if f[1] == "m.layers.0.mlp.up_proj.weight_scale"]
    assert nv[0] == "scale_format" and nv[2].startswith("1 NaN and 0 negative e4m3 block scales")
    assert not [f for f in whole if f[1].startswith("m.layers.0.mlp.gate_proj")]   # genuine UE8M0 bytes


def test_byte_stats_from_the_histogram_match_torchs(seed):
    g = torch.Generator().manual_seed(seed)
    b = (torch.randn(4001, generator=g) * 9 + 118).clamp(0, 255).to(torch.uint8)
    h = stats.byte_histogram(b.split(333))
    assert stats._byte_stats(h) == (int(b.unique().numel()), float(b.float().median()), int(b.min()), int(b.max()))


def test_a_shard_shorter_than_its_header_names_the_file(ckpt):
    report = DoctorReport(str(ckpt))
    infos = read_checkpoint(ckpt, report)
    (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:-100])
    with stats.TensorSource(infos) as src, pytest.raises(OSError, match="model.safetensors ended at byte"):
        for name in infos:
            list(src.chunks(name))
