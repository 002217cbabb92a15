"""convert's pre-flight (issue #36): each bad input is refused before the first shard with one line
naming the tensor, the shard, what was found, what was expected and the fix; nothing is left on
disk (no dst, no temporary directory). Bad inputs are the tiny DeepSeek-V4 with one planted fault.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import INDEX_NAME
from nvfp4stack.cli import compose_config
from nvfp4stack.convert.stream import ConvertRefused
from nvfp4stack.tasks import convert as task
from tests.support.doctor_faults import copy_with_edit, edit_config, remove_tensor, replace_tensor

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL = ("model.source_format=official",)  # the release layout: MXFP4 experts the plan casts to NVFP4


def _convert(tmp_path: Path, src: Path, *overrides: str):
    cfg = compose_config("recipe=tiny_dsv4", *overrides, f"convert.src={src}", f"convert.dst={tmp_path / 'out'}",
                         f"run_dir={tmp_path / 'run'}")
    return task.run(cfg)


def _refused(tmp_path: Path, src: Path, *overrides: str) -> str:
    with pytest.raises(ConvertRefused) as e:
        _convert(tmp_path, src, *overrides)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"convert.src: {src} is not a valid input, nothing was written: ")
    assert "Fix: " in msg
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.tmp").exists()
    return msg.split("nothing was written: ", 1)[1]


def _shard(src: Path) -> str:
    return sorted(src.glob("*.safetensors"))[0].name


@pytest.mark.parametrize("layout,name,overrides", [
    ("bf16", "layers.1.ffn.experts.3.w2.weight", ()),        # an expert
    ("release", "layers.1.ffn.experts.3.w1.scale", OFFICIAL),  # an expert's MXFP4 scale
    ("bf16", "layers.0.attn_norm.weight", ()),               # a norm (passed through)
])
def test_a_missing_tensor_is_refused(root, tmp_path, layout, name, overrides):
    src = remove_tensor(root / layout, tmp_path / "src", name)
    first = _refused(tmp_path, src, *overrides)
    assert first.startswith(f"{name} (absent from every shard; "), first
    assert f" is in {_shard(src)}): missing: found absent; expected " in first


def test_an_expert_stored_bf16_where_the_plan_reads_mxfp4_is_refused(root, tmp_path):
    g = torch.Generator().manual_seed(3)
    name = "layers.0.ffn.experts.2.w1.weight"
    src = replace_tensor(root / "release", tmp_path / "src", name,
                         lambda t: torch.randn(t.shape[0], t.shape[1] * 2, generator=g).bfloat16())
    first = _refused(tmp_path, src, *OFFICIAL)
    assert first.startswith(f"layers.0.ffn.experts.2.w1 (in {_shard(src)}): source: found stored as bf16 (BF16 "
                            "weight); expected mxfp4, the format the plan converts this group from"), first
    assert "model.source_format" in first


def _set_header_shape(shard: Path, name: str, shape: list[int]) -> None:
    """Rewrite one header entry's shape in place; offsets and bytes stay, so they disagree."""
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header[name]["shape"] = shape
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def test_a_passthrough_header_that_disagrees_with_its_bytes_is_refused(root, tmp_path):
    name = "layers.0.ffn_norm.weight"
    src = copy_with_edit(root / "bf16", tmp_path / "src", lambda n, t: [(n, t)], only=set())
    shard = src / _shard(src)  # the tiny model's one shard
    _set_header_shape(shard, name, [3, 256])
    first = _refused(tmp_path, src)
    assert first.startswith(f"{name} (in {shard.name}): header: found "), first
    assert f"re-copy or re-download {shard.name}" in first


@pytest.mark.parametrize("experts", [8, 32])
def test_a_config_that_disagrees_with_the_shards_on_experts_is_refused(root, tmp_path, experts):
    src = edit_config(root / "bf16", tmp_path / "src", lambda c: {**c, "n_routed_experts": experts})
    first = _refused(tmp_path, src)
    assert first.startswith(f"config.json:n_routed_experts: experts: found {experts}; expected 16, the experts "
                            f"the shards hold (0..15: layers."), first
    assert f"in {_shard(src)})" in first and "set n_routed_experts: 16 in config.json" in first


def test_an_unknown_tensor_is_refused_unless_kept(root, tmp_path):
    anchor, extra = "layers.0.ffn_norm.weight", "layers.0.ffn.mystery.weight"
    g = torch.Generator().manual_seed(5)
    src = copy_with_edit(root / "bf16", tmp_path / "src",
                         lambda n, t: [(n, t), (extra, torch.randn(4, 8, generator=g))], only={anchor})
    first = _refused(tmp_path, src)
    assert first.startswith(f"{extra} (in {_shard(src)}): unknown: found F32 [4, 8]; expected only tensors the "
                            "plan (or convert.rules) names"), first
    assert "convert.unknown_tensors=keep" in first
    assert _convert(tmp_path, src, "convert.unknown_tensors=keep") == 0
    assert extra in json.loads((tmp_path / "out" / INDEX_NAME).read_text())["weight_map"]
    assert json.loads((tmp_path / "out" / "convert_report.json").read_text())["unknown_tensors"] == [extra]


def test_valid_input_converts_with_no_unknown_tensors(root, tmp_path):
    """The README's `recipe=tiny_dsv4 convert`: parameters stored without a suffix (attn_sink) are
    groups of the plan, not unknown."""
    assert _convert(tmp_path, root / "bf16") == 0
    assert json.loads((tmp_path / "out" / "convert_report.json").read_text())["unknown_tensors"] == []


def test_cli_exits_2_with_one_line(root, tmp_path):
    name = "layers.1.ffn.experts.3.w2.weight"
    src = remove_tensor(root / "bf16", tmp_path / "src", name)
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "recipe=tiny_dsv4", "convert", f"convert.src={src}",
                        f"convert.dst={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{name} (absent from every shard; " in lines[0], r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.tmp").exists()
