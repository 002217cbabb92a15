"""bench/tools/make_flash_release.py (issue #36): a release-layout DeepSeek-V4 checkpoint at any depth,
with release_stream's names, dtypes and shapes, sharded with an index, that doctor and convert accept."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("make_flash_release", ROOT / "bench/tools/make_flash_release.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def made(tool, tmp_path_factory):
    """The tiny DeepSeek-V4 release config cut to 1 layer, written in ~2 MiB shards."""
    from nvfp4stack.models.deepseek_v4.tiny import release_config, tiny_dsv4_config

    d = tmp_path_factory.mktemp("flash_release")
    cfg = d / "config_in.json"
    cfg.write_text(json.dumps(release_config(tiny_dsv4_config(2048, 0, 1, 2))))
    out = d / "ckpt"
    assert tool.main([str(out), "--config", str(cfg), "--layers", "1", "--seed", "3", "--shard-mb", "2", "--jobs", "1"]) == 0
    return out


def test_layout_is_release_streams_sharded_with_an_index(made):
    from safetensors import safe_open

    from nvfp4stack.models.deepseek_v4.synthetic import release_stream

    cfg = json.loads((made / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["compress_ratios"] == [0]
    shards = sorted(made.glob("model-*.safetensors"))
    assert len(shards) >= 2
    weight_map = json.loads((made / "model.safetensors.index.json").read_text())["weight_map"]
    stored = {}
    for s in shards:
        with safe_open(str(s), "pt") as f:
            for k in f.keys():
                stored[k] = f.get_tensor(k)
                assert weight_map[k] == s.name
    expected = {k: (v.dtype, tuple(v.shape)) for k, v in release_stream(cfg, 0, "cpu")}
    assert {k: (v.dtype, tuple(v.shape)) for k, v in stored.items()} == expected
    codes = stored["layers.0.ffn.experts.5.w2.weight"].view(torch.uint8)
    counts = torch.bincount((codes & 15).reshape(-1).long(), minlength=16)
    assert (counts > 0).all() and counts.max() > 3 * counts.min()   # every E2M1 code, bell-shaped
    scales = stored["layers.0.ffn.experts.5.w2.scale"].view(torch.uint8)
    assert 3 <= scales.unique().numel() <= 12 and 110 <= int(scales.min()) and int(scales.max()) <= 130
    emb = stored["embed.weight"].float()
    assert emb.std() > 0.1 and emb.unique().numel() > 1000


def _doctor(ckpt: Path, tmp_path: Path):
    """The doctor's findings for ``ckpt`` under the RESULTS recipe's plan (vLLM's load check off: seconds)."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.doctor import diagnose
    from nvfp4stack.plan.build import plan_for_config

    plan = plan_for_config(compose_config("recipe=dsv4_flash_h200", "model.descriptor=null", f"model.path={ckpt}",
                                          f"run_dir={tmp_path / 'plan'}"))
    return diagnose(ckpt, vllm="off", plan=plan)


def test_doctor_and_convert_accept_it(made, tmp_path):
    from nvfp4stack.cli import compose_config
    from nvfp4stack.tasks import convert as task

    r = _doctor(made, tmp_path)
    assert r.exit_code == 0 and not r.warnings, [f.found for f in r.findings][:3]
    assert any("serve casts them" in n for n in r.notes)
    out = tmp_path / "nvfp4"
    cfg = compose_config("recipe=dsv4_flash_h200", f"convert.src={made}", f"convert.dst={out}",
                         f"run_dir={tmp_path / 'run'}")
    assert task.run(cfg) == 0
    assert next(out.glob("model-*.safetensors"))
    r = _doctor(out, tmp_path)
    assert r.exit_code == 0 and not r.warnings, [f.found for f in r.findings][:3]
    assert any("input_scale tensor(s) absent" in n for n in r.notes)   # weight-only NVFP4 experts


def test_unknown_descriptor_is_a_usage_error(tool, tmp_path, capsys):
    assert tool.main([str(tmp_path / "x"), "--descriptor", "dsv4_flsh"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dsv4_flsh" in err and "dsv4_flash" in err
    assert not (tmp_path / "x").exists()


def test_peak_rss_sums_a_parent_and_its_child(tmp_path):
    """bench/tools/peak_rss.py: a parent holding ~150 MB while its child holds ~150 MB peaks at their sum."""
    import subprocess
    import sys

    hold = "b = bytearray(150 << 20); b[::4096] = b'x' * len(b[::4096])"   # every page touched
    child = f"import time; {hold}; time.sleep(1.5)"
    parent = f"import subprocess, sys; {hold}; subprocess.run([sys.executable, '-c', {child!r}])"
    out = tmp_path / "peak.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench/tools/peak_rss.py"), "--json", str(out), "--",
                        sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("peak_rss: exit 0")
    d = json.loads(out.read_text())
    assert d["peak_tree_rss_bytes"] >= 300 << 20 > d["largest_process_maxrss_bytes"]


def test_drawing_on_several_threads_writes_the_same_bytes(tool, made, tmp_path):
    """--jobs only changes how many groups are drawn at once: every shard's bytes equal the one-thread run's."""
    out = tmp_path / "ckpt3"
    assert tool.main([str(out), "--config", str(made.parent / "config_in.json"), "--layers", "1", "--seed", "3",
                      "--shard-mb", "2", "--jobs", "3"]) == 0
    one = sorted(p.name for p in made.glob("*.safetensors"))
    assert one == sorted(p.name for p in out.glob("*.safetensors")) and len(one) > 1
    for name in one:
        assert (out / name).read_bytes() == (made / name).read_bytes(), name
