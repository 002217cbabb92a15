"""tasks/convert.run on a typed config stand-in (the task never imports Hydra)."""
import json
from types import SimpleNamespace

import torch

from nvfp4stack.checkpoint.safetensors_io import save_sharded
from nvfp4stack.convert.config import ConvertConfig
from nvfp4stack.tasks import convert as task


def cfg_for(tmp_path, **kw):
    return SimpleNamespace(model=SimpleNamespace(path=str(tmp_path / "src")), run_dir=str(tmp_path / "run"),
                           convert=ConvertConfig(**kw))


def test_run_converts_and_refuses_existing(tmp_path):
    g = torch.Generator().manual_seed(7)
    save_sharded({"layers.0.ffn.experts.0.w2.weight": torch.randn(32, 64, generator=g).bfloat16(),
                  "norm.weight": torch.ones(64)}, tmp_path / "src")
    cfg = cfg_for(tmp_path, rules=["*.experts.*=bf16_to_nvfp4", "norm=passthrough"])
    assert task.run(cfg) == 0
    out = tmp_path / "run" / "checkpoint"
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert "layers.0.ffn.experts.0.w2.weight_scale_2" in idx["weight_map"]
    assert task.run(cfg) == 1  # exists, overwrite=false
    assert task.run(cfg_for(tmp_path, rules=["*=passthrough"], overwrite=True)) == 0
    bad = cfg_for(tmp_path, rules=["*.experts.*=bf16_to_nvfp4"], unknown_tensors="error", dst=str(tmp_path / "o2"))
    assert task.run(bad) == 1
    cfg.model.path = str(tmp_path / "missing")
    assert task.run(cfg) == 2


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
