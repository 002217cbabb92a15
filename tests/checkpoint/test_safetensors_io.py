"""Streaming reader/writer: files load with safetensors' own safe_open/load_file."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nvfp4stack.checkpoint.safetensors_io import INDEX_NAME, ShardedReader, ShardWriter, file_sha256, save_sharded
from tests.support.numerics_data import fresh_seed


@pytest.fixture
def seed():
    return fresh_seed()


def sample(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(33, 17, generator=g).bfloat16(),
        "b.weight": torch.randn(8, 64, generator=g).to(torch.float8_e4m3fn),
        "b.scale": torch.randint(100, 140, (1, 1), dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu),
        "c.weight_scale_2": torch.tensor(0.125),
        "d.bias": torch.randn(5, generator=g),
        "e.packed": torch.randint(0, 255, (4, 8), dtype=torch.uint8, generator=g),
    }


def test_writer_output_reads_with_safetensors(tmp_path, seed):
    ts = sample(seed)
    w = ShardWriter(tmp_path / "x.safetensors")
    for k, v in ts.items():
        w.add(k, v)
    w.close()
    assert w.sha256 == file_sha256(tmp_path / "x.safetensors")
    loaded = load_file(tmp_path / "x.safetensors")
    for k, v in ts.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
    with safe_open(tmp_path / "x.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_sharded_roundtrip_and_reader(tmp_path, seed):
    ts = sample(seed)
    wm = save_sharded(ts, tmp_path / "ck", max_shard_bytes=600)
    idx = json.loads((tmp_path / "ck" / INDEX_NAME).read_text())
    assert idx["weight_map"] == dict(sorted(wm.items())) and len(set(wm.values())) > 1
    r = ShardedReader(tmp_path / "ck")
    assert set(r.names()) == set(ts)
    for k, v in ts.items():
        assert torch.equal(r.get(k).reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
        assert b"".join(r.iter_raw(k)) == v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    # reader also takes files written by safetensors itself
    save_file({k: v for k, v in ts.items() if v.dtype != torch.float8_e8m0fnu}, tmp_path / "model.safetensors")
    r2 = ShardedReader(tmp_path)
    assert torch.equal(r2.get("a.weight"), ts["a.weight"])


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model.safetensors.index.json"):
        ShardedReader(tmp_path)
    w = ShardWriter(tmp_path / "y.safetensors")
    w.add("t", torch.zeros(2))
    with pytest.raises(ValueError, match="t: written twice"):
        w.add("t", torch.zeros(2))
    w.abort()
    assert not list(tmp_path.iterdir())
