"""The exit-code contract (README "Exit codes"), one test per line of it: 0 done; 1 a check found
problems; 2 a usage or config error as one line naming the key, the value and the choices; 3 an
unexpected failure as one line plus the log holding the traceback; 130 Ctrl-C."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.cli import EXIT_INTERRUPTED, EXIT_PROBLEMS, EXIT_UNEXPECTED, EXIT_USAGE, run_task

ROOT = Path(__file__).resolve().parents[1]


def _main(*args, tmp_path):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args, f"hydra.run.dir={tmp_path}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def _one_error_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    return lines[0]


def test_0_done_and_cli_log_holds_the_output(tmp_path):
    r = _main("recipe=dsv4_flash_b200", "plan", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "cli.log").read_text()
    assert "plan written to" in log and "per-GPU weight bytes" in log


def test_1_a_check_found_problems(tmp_path):
    """V4 Pro with BF16 experts on 8x B200: the plan is valid, and nothing fits beside the weights."""
    r = _main("recipe=dsv4_b200", "precision.rules=[{targets:[routed_experts],scheme:bf16}]", "plan", tmp_path=tmp_path)
    assert r.returncode == EXIT_PROBLEMS == 1, r.stderr
    assert "NOTHING FITS" in r.stdout + r.stderr


@pytest.mark.parametrize("args,words", [
    (("arch=sm100", "plan"), ("arch='sm100'", "sm100a", "valid:")),
    (("backend.moe=nope", "plan"), ("backend.moe='nope'", "valid:", "marlin")),
    (("recipe=dsv4_b300", "plan"), ("unknown recipe 'dsv4_b300'", "dsv4_b200")),
    (("precision.nonsense=1", "plan"), ("unknown config key 'precision.nonsense'", "routed_experts")),
    (("recipe=dsv4_b200", "precision.attn.wo_a=nvfp4", "serve", "engine.dry_run=true"),
     ("wo_a cannot be nvfp4", "Fix: precision.attn.wo_a=fp8_block")),
    (("recipe=tiny_dsv4", "precision.attn.wo_a=nvfp4", "eval", "eval.num_prompts=2", "eval.max_tokens=16"),
     ("nvfp4stack eval: error:", "wo_a cannot be nvfp4")),
])
def test_2_usage_or_config_error_is_one_line(tmp_path, args, words):
    r = _main(*args, tmp_path=tmp_path)
    assert r.returncode == EXIT_USAGE == 2
    line = _one_error_line(r)
    for w in words:
        assert w in line, line


def test_3_unexpected_failure_is_one_line_and_a_logged_traceback(tmp_path, capsys):
    def broken():
        raise RuntimeError("a bug, not a user error")

    assert run_task(broken, "plan", tmp_path / "cli.log") == EXIT_UNEXPECTED == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unexpected error: RuntimeError: a bug" in err[0] and str(tmp_path / "cli.log") in err[0]
    assert "Traceback (most recent call last)" in (tmp_path / "cli.log").read_text()


def test_130_interrupted_is_one_line(tmp_path, capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert run_task(interrupted, "convert", tmp_path / "cli.log") == EXIT_INTERRUPTED == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0]
