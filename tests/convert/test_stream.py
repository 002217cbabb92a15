"""Streaming conversion: plan, outputs, unknown tensors, refusal, kill + resume byte-identity."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nvfp4stack.checkpoint.safetensors_io import INDEX_NAME, file_sha256, save_sharded
from nvfp4stack.convert.stream import convert_checkpoint

RULES = {
    "*.ffn.experts.*.w1": "w13_shared_global_scale",
    "*.ffn.experts.*.w3": "w13_shared_global_scale",
    "*.ffn.experts.*.w2": "bf16_to_nvfp4",
    "*.attn.compressor.wkv": "compressor_fuse",
    "*.attn.compressor.wgate": "compressor_fuse",
    "*.attn.indexer.compressor.wkv": "compressor_fuse",
    "*.attn.indexer.compressor.wgate": "compressor_fuse",
    "*.attn.w*": "bf16_to_fp8_block",
    "*": "passthrough",
}


def make_checkpoint(path: Path, seed: int, layers=2, experts=4, hidden=256, inter=128, shard_bytes=300_000):
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.1).bfloat16()

    tensors = {"embed.weight": w(512, hidden)}
    for L in range(layers):
        p = f"layers.{L}"
        for n in ("wq_a", "wo_a"):
            tensors[f"{p}.attn.{n}.weight"] = w(hidden, hidden)
        for c in ("attn.compressor", "attn.indexer.compressor"):
            tensors[f"{p}.{c}.wkv.weight"] = w(128, hidden)
            tensors[f"{p}.{c}.wgate.weight"] = w(128, hidden)
            tensors[f"{p}.{c}.ape"] = torch.randn(4, 128, generator=g)
        for e in range(experts):
            for n, shape in (("w1", (inter, hidden)), ("w2", (hidden, inter)), ("w3", (inter, hidden))):
                tensors[f"{p}.ffn.experts.{e}.{n}.weight"] = w(*shape)
    save_sharded(tensors, path, max_shard_bytes=shard_bytes)
    (path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"]}))
    (path / "tokenizer.json").write_text("{}")
    return tensors


def tree_bytes(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_convert_layout_and_numerics(tmp_path, seed):
    src = tmp_path / "src"
    tensors = make_checkpoint(src, seed)
    tensors["mystery.blob"] = torch.ones(3)
    save_sharded({"mystery.blob": torch.ones(3)}, tmp_path / "extra")
    # an extra shard not in the index is ignored by index-driven readers: add it to the index
    os.replace(tmp_path / "extra" / "model-00001-of-00001.safetensors", src / "extra.safetensors")
    idx = json.loads((src / INDEX_NAME).read_text())
    idx["weight_map"]["mystery.blob"] = "extra.safetensors"
    (src / INDEX_NAME).write_text(json.dumps(idx))
    rules = {k: v for k, v in RULES.items() if k != "*"}
    rules.update({"embed": "passthrough", "*.ape": "passthrough", "*.compressor": "passthrough"})
    dst = tmp_path / "out"
    rep = convert_checkpoint(src, dst, rules, unknown_tensors="keep", max_shard_bytes=200_000, progress=False,
                             hf_quant_config={"quant_algo": "MIXED_PRECISION"})
    assert rep["unknown_tensors"] == ["mystery.blob"]
    out = {}
    for f in sorted(set(json.loads((dst / INDEX_NAME).read_text())["weight_map"].values())):
        with safe_open(dst / f, "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    assert torch.equal(out["mystery.blob"], torch.ones(3))  # reported, passed through, never dropped
    assert torch.equal(out["embed.weight"], tensors["embed.weight"])
    assert out["layers.1.attn.wo_a.weight"].dtype == torch.float8_e4m3fn
    assert out["layers.1.attn.wo_a.scale"].dtype == torch.float8_e8m0fnu
    fused = out["layers.0.attn.indexer.compressor.fused_wkv_wgate.weight"]
    assert torch.equal(fused[:128], tensors["layers.0.attn.indexer.compressor.wkv.weight"])
    assert "layers.0.attn.compressor.wkv.weight" not in out
    e = "layers.1.ffn.experts.3"
    assert out[f"{e}.w1.weight"].dtype == torch.uint8 and out[f"{e}.w1.weight_scale"].dtype == torch.float8_e4m3fn
    assert torch.equal(out[f"{e}.w1.weight_scale_2"], out[f"{e}.w3.weight_scale_2"])
    manifest = json.loads((dst / "manifest.json").read_text())
    assert all(file_sha256(dst / f) == h for f, h in manifest.items())
    assert (dst / "tokenizer.json").exists() and (dst / "hf_quant_config.json").exists()
    assert not (tmp_path / ".out.tmp").exists()
    with pytest.raises(FileExistsError, match="convert.overwrite=true"):
        convert_checkpoint(src, dst, rules, unknown_tensors="keep", progress=False)
    with pytest.raises(ValueError, match="mystery.blob"):
        convert_checkpoint(src, tmp_path / "out2", rules, progress=False)  # refused by default
    convert_checkpoint(src, dst, rules, unknown_tensors="keep", overwrite=True, max_shard_bytes=200_000, progress=False,
                       hf_quant_config={"quant_algo": "MIXED_PRECISION"})
    assert manifest == json.loads((dst / "manifest.json").read_text())  # deterministic


CHILD = r"""
import sys, time
from nvfp4stack.convert import shard_writer as io
from nvfp4stack.convert.stream import convert_checkpoint
close = io.ShardWriter.close
def slow_close(self):  # slows the run so the parent can kill it mid-way; bytes unchanged
    time.sleep(0.15)
    return close(self)
io.ShardWriter.close = slow_close
rules = dict(x.split("=", 1) for x in sys.argv[3:])
convert_checkpoint(sys.argv[1], sys.argv[2], rules, max_shard_bytes=100_000, progress=False)
"""


def test_kill_and_resume_is_byte_identical(tmp_path, seed):
    src = tmp_path / "src"
    make_checkpoint(src, seed)
    args = [f"{k}={v}" for k, v in RULES.items()]
    ref = tmp_path / "ref"
    convert_checkpoint(src, ref, RULES, max_shard_bytes=100_000, progress=False)
    n_shards = json.loads((ref / "convert_report.json").read_text())["shards"]
    assert n_shards >= 6
    dst = tmp_path / "out"
    journal = tmp_path / ".out.tmp" / "journal.jsonl"
    kill_after = random.Random(seed).randint(1, n_shards - 2)  # complete shards before the kill
    print(f"SIGKILL after {kill_after} of {n_shards} shards")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(dst), *args])
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) - 1 >= kill_after:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    assert proc.wait(60) == -signal.SIGKILL, "the child finished before it could be killed"
    assert not dst.exists()
    done = len(journal.read_text().splitlines()) - 1
    assert 1 <= done < n_shards
    first = tmp_path / ".out.tmp" / "shard-00000.safetensors"
    stamp = first.stat().st_mtime_ns
    convert_checkpoint(src, dst, RULES, max_shard_bytes=100_000, progress=False)
    assert tree_bytes(dst) == tree_bytes(ref)
    name = f"model-00001-of-{n_shards:05d}.safetensors"
    assert (dst / name).stat().st_mtime_ns == stamp  # resumed: the finished shard was kept, not redone
