"""What the README's `convert` writes, `doctor` accepts for the same recipe (issue #38); a W4A4 plan from a
source without activation scales says so in one warning line naming the fix."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEIGHT_ONLY = ("recipe=tiny_dsv4", "precision.routed_experts=nvfp4_w4a16")


def _main(tmp_path, *args):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_the_readme_convert_output_passes_doctor(tmp_path):
    dst = tmp_path / "converted"
    r = _main(tmp_path, *WEIGHT_ONLY, f"convert.dst={dst}", f"run_dir={tmp_path / 'c'}", "convert")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr
    d = _main(tmp_path, *WEIGHT_ONLY, f"checkpoint={dst}", f"run_dir={tmp_path / 'd'}", "doctor")
    assert d.returncode == 0, d.stdout[-3000:] + d.stderr[-2000:]
    assert "ERRORS (0)" in d.stdout and "input_scale" in d.stdout   # the weight-only note


def test_a_w4a4_convert_without_activation_scales_warns_naming_the_fix(tmp_path):
    from nvfp4stack.cli import compose_config
    from nvfp4stack.plan.build import plan_for_config
    from nvfp4stack.tasks.convert import activation_scale_gap

    w4a4 = plan_for_config(compose_config("recipe=tiny_dsv4", f"run_dir={tmp_path}"))
    line = activation_scale_gap(w4a4)
    assert line and "W4A4" in line and "precision.routed_experts=nvfp4_w4a16" in line and "quantize" in line
    assert activation_scale_gap(plan_for_config(compose_config(*WEIGHT_ONLY, f"run_dir={tmp_path}"))) is None
