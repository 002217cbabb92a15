"""Each output shard is written once (issue #36): the header first, from the planned tensors, then
the data; a shard that turns out to hold other tensors than planned is still written correctly.
The converted bytes of the tiny DeepSeek-V4 recipes are pinned by hash (the values the two-write
stream produced before this change; re-pinned when the tiny checkpoint's square root became the correctly
rounded one, SPEC_VERSION 8: the old pins held on AVX2 EPYC hosts only)."""
import hashlib
import json
import logging
from pathlib import Path

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.convert import out_specs
from nvfp4stack.convert.stream import convert_checkpoint
from nvfp4stack.tasks import convert as task
from tests.convert.test_stream import RULES, make_checkpoint, tree_bytes

# sha256 over "name sha256\n" of every shard and the index (sorted), max_shard_bytes=200000
PINNED = {
    "bf16": ((), "9ba02f2ccd46feee656899e3dc4427169aec5d322557b2ba8fb6c7e174e2fb35"),
    "release": (("model.source_format=official", "precision.routed_experts=nvfp4_w4a16"),
                "f8204fc12a7dde0fa48cf4011511fb2ae14c2cae7cf3a89cd9fa38338f1213fe"),
}


def _wchar() -> int:
    """Bytes this process has passed to write() so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _weights_digest(out: Path) -> str:
    manifest = json.loads((out / "manifest.json").read_text())
    lines = "".join(f"{k} {v}\n" for k, v in sorted(manifest.items()) if k.endswith((".safetensors", "index.json")))
    return hashlib.sha256(lines.encode()).hexdigest()


@pytest.mark.parametrize("layout", sorted(PINNED))
def test_tiny_dsv4_converts_to_the_pinned_bytes(root, tmp_path, caplog, layout):
    overrides, digest = PINNED[layout]
    out = tmp_path / "out"
    cfg = compose_config("recipe=tiny_dsv4", *overrides, f"convert.src={root / layout}", f"convert.dst={out}",
                         f"run_dir={tmp_path / 'run'}", "convert.max_shard_bytes=200000")
    with caplog.at_level(logging.WARNING, logger="nvfp4stack.convert.shard_writer"):
        assert task.run(cfg) == 0
    assert len(list(out.glob("model-*.safetensors"))) > 40
    assert _weights_digest(out) == digest
    assert not [r for r in caplog.records if "rewriting it" in r.getMessage()]  # every shard planned right


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_bytes_written_are_the_output_once(tmp_path, seed):
    src = tmp_path / "src"
    make_checkpoint(src, seed)
    dst = tmp_path / "out"
    before = _wchar()
    convert_checkpoint(src, dst, RULES, max_shard_bytes=100_000, progress=False)
    written = _wchar() - before
    out_bytes = sum(p.stat().st_size for p in dst.iterdir())
    shards = sum(p.stat().st_size for p in dst.glob("model-*.safetensors"))
    assert shards > 0.9 * out_bytes and len(list(dst.glob("model-*.safetensors"))) >= 6
    # the output, plus the journal's few lines per shard: nothing written twice (was ~2x the shards)
    assert out_bytes <= written < out_bytes + 20_000, (written, out_bytes)


@pytest.mark.parametrize("plan", ["nothing", "one_unit_short"])
def test_a_shard_holding_other_tensors_than_planned_keeps_its_bytes(tmp_path, seed, monkeypatch, caplog, plan):
    src = tmp_path / "src"
    make_checkpoint(src, seed, layers=1)
    ref = tmp_path / "ref"
    convert_checkpoint(src, ref, RULES, max_shard_bytes=100_000, progress=False)
    real = out_specs.OutputSpecs.shard

    def wrong(self, units, start, max_shard_bytes):
        specs = real(self, units, start, max_shard_bytes)
        return [] if plan == "nothing" else specs[:-1]

    monkeypatch.setattr(out_specs.OutputSpecs, "shard", wrong)
    dst = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="nvfp4stack.convert.shard_writer"):
        convert_checkpoint(src, dst, RULES, max_shard_bytes=100_000, progress=False)
    assert tree_bytes(dst) == tree_bytes(ref)
    assert [r for r in caplog.records if "rewriting it" in r.getMessage()]
    assert not list(tmp_path.glob(".out.tmp*"))
