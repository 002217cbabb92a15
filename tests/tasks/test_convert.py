"""tasks/convert.run on a typed config stand-in (the task never imports Hydra)."""
import json
from types import SimpleNamespace

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import save_sharded
from nvfp4stack.convert.config import ConvertConfig
from nvfp4stack.tasks import convert as task


def cfg_for(tmp_path, **kw):
    return SimpleNamespace(model=SimpleNamespace(path=str(tmp_path / "src")), run_dir=str(tmp_path / "run"),
                           recipe="tiny_test", convert=ConvertConfig(**kw))


def _src(tmp_path, layers=1):
    g = torch.Generator().manual_seed(7)
    t = {f"layers.{i}.ffn.experts.0.w2.weight": torch.randn(32, 64, generator=g).bfloat16() for i in range(layers)}
    save_sharded({**t, "norm.weight": torch.ones(64)}, tmp_path / "src")


def test_run_converts_reruns_and_refuses_a_different_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _src(tmp_path)
    cfg = cfg_for(tmp_path, rules=["*.experts.*=bf16_to_nvfp4", "norm=passthrough"])
    assert task.run(cfg) == 0
    outs = list((tmp_path / "outputs" / "converted").iterdir())
    assert len(outs) == 1 and outs[0].name.startswith("tiny_test-")  # stable: recipe + source + plan
    idx = json.loads((outs[0] / "model.safetensors.index.json").read_text())
    assert "layers.0.ffn.experts.0.w2.weight_scale_2" in idx["weight_map"]
    capsys.readouterr()
    assert task.run(cfg) == 0  # the same command again: found complete, nothing rewritten
    out = capsys.readouterr().out
    assert "already complete" in out and "wrote" not in out  # one verdict, not "nothing to do" then "wrote"
    assert len(list((tmp_path / "outputs" / "converted").iterdir())) == 1
    fixed = cfg_for(tmp_path, rules=["*=passthrough"], dst=str(outs[0]))
    with pytest.raises(FileExistsError, match="convert.overwrite=true"):
        task.run(fixed)
    assert task.run(cfg_for(tmp_path, rules=["*=passthrough"], dst=str(outs[0]), overwrite=True)) == 0
    with pytest.raises(ValueError, match="convert.unknown_tensors=keep"):
        task.run(cfg_for(tmp_path, rules=["*.experts.*=bf16_to_nvfp4"], dst="o2"))
    cfg.model.path = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="model.path='.*missing': no such directory"):  # the key set
        task.run(cfg)


def test_interrupted_convert_resumes_with_the_same_bytes(tmp_path, monkeypatch, capsys):
    """Ctrl-C after the first shard; the same command again prints the resume line and ends
    byte-identical to an uninterrupted conversion."""
    from nvfp4stack.convert import stream

    monkeypatch.chdir(tmp_path)
    _src(tmp_path, layers=6)
    rules = ["*.experts.*=bf16_to_nvfp4", "norm=passthrough"]
    assert task.run(cfg_for(tmp_path, rules=rules, max_shard_bytes=1500, dst=str(tmp_path / "whole"))) == 0
    real = stream._append_journal
    calls = {"n": 0}

    def interrupt_after_first(tmp, entry):
        real(tmp, entry)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(stream, "_append_journal", interrupt_after_first)
    cfg = cfg_for(tmp_path, rules=rules, max_shard_bytes=1500)
    with pytest.raises(KeyboardInterrupt):
        task.run(cfg)
    capsys.readouterr()
    assert task.run(cfg) == 0
    assert "resuming after shard 1 (" in capsys.readouterr().out
    out = next((tmp_path / "outputs" / "converted").iterdir())
    whole = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    resumed = json.loads((out / "manifest.json").read_text())
    assert resumed == whole and len([f for f in whole if f.endswith(".safetensors")]) >= 3


def test_config_validation_names_the_key():
    import pytest

    with pytest.raises(ValueError, match="convert.unknown_tensors"):
        ConvertConfig(unknown_tensors="drop")
    with pytest.raises(ValueError, match="convert.rules"):
        ConvertConfig(rules=["*=bf16_to_nvfp5"])
    with pytest.raises(ValueError, match="glob=converter"):
        ConvertConfig(rules=["bf16_to_nvfp4"])
    with pytest.raises(ValueError, match="convert.device"):
        ConvertConfig(device="tpu")


def test_chooser_from_plan():
    groups = [SimpleNamespace(name="layers.0.ffn.experts.0.w1", converter="bf16_to_nvfp4"),
              SimpleNamespace(name="layers.0.attn.wkv", converter=None),
              SimpleNamespace(name="layers.0.attn.compressor.ape", converter=None)]
    choose = task.chooser_from_plan(SimpleNamespace(groups=groups))
    assert choose("layers.0.ffn.experts.0.w1") == "bf16_to_nvfp4"
    assert choose("layers.0.attn.wkv") == "passthrough"
    assert choose("layers.0.attn.compressor") == "passthrough"  # parent of a suffix-less param
    assert choose("layers.9.mystery") is None
