"""The exit-code contract (README "Exit codes"), one test per line of it: 0 done; 1 a check found
problems; 2 a usage or config error as one line naming the key, the value and the choices; 3 an
unexpected failure as one line plus the log holding the traceback; 130 Ctrl-C."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


@pytest.fixture(scope="module")
def cli(request, tmp_path_factory):
    """``cli(*args)``: ``_main(*args)`` in a directory of its own. The one-line-error tests' runs this session
    selected start up front, two at a time (each is a Python start-up on one core, ~2 s; CI has two cores), and
    each test reads its own."""
    from concurrent.futures import ThreadPoolExecutor

    tests = {"test_2_usage_or_config_error_is_one_line", "test_2_hydra_and_omegaconf_mistakes_are_one_line"}
    wanted = [it.callspec.params["args"] for it in request.session.items
              if it.path == request.path and getattr(it, "originalname", None) in tests]
    with ThreadPoolExecutor(2) as pool:
        runs = {args: pool.submit(_main, *args, tmp_path=tmp_path_factory.mktemp("cli")) for args in wanted}
        yield lambda *args: runs[args].result() if args in runs else _main(*args, tmp_path=tmp_path_factory.mktemp("cli"))


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


USAGE_ERRORS = [
    (("arch=sm100", "plan"), ("arch='sm100'", "sm100a", "valid:")),
    (("backend.moe=nope", "plan"), ("backend.moe='nope'", "valid:", "marlin")),
    (("recipe=dsv4_b300", "plan"), ("unknown recipe 'dsv4_b300'", "dsv4_b200")),
    (("precision.nonsense=1", "plan"), ("unknown config key 'precision.nonsense'", "routed_experts")),
    (("recipe=dsv4_b200", "precision.attn.wo_a=nvfp4", "serve", "engine.dry_run=true"),
     ("wo_a cannot be nvfp4", "Fix: precision.attn.wo_a=fp8_block")),
    (("recipe=tiny_dsv4", "precision.attn.wo_a=nvfp4", "eval", "eval.num_prompts=2", "eval.max_tokens=16"),
     ("nvfp4stack eval: error:", "wo_a cannot be nvfp4")),
]


@pytest.mark.parametrize("args,words", USAGE_ERRORS)
def test_2_usage_or_config_error_is_one_line(cli, args, words):
    r = cli(*args)
    assert r.returncode == EXIT_USAGE == 2
    line = _one_error_line(r)
    for w in words:
        assert w in line, line


# Hydra's and OmegaConf's own errors (exit 1, 7-8 lines) and the mistakes that surfaced as
# tracebacks or bare [Errno 2]s: each now one line naming the key, the value and the fix.
HYDRA_MISTAKES = [
    (('precision.rules=[{targets:["re:^model\\.layers\\.(1\\.mlp"],scheme:bf16}]', "plan"),
     ("precision.rules: target 're:^model\\.layers\\.(1\\.mlp' is not a valid regex", "missing )")),
    (("engine.tp=abc", "plan"), ("engine.tp=abc: expected an integer, found 'abc'", "default: 1")),
    (("precision.rules=[{targets:[routed_experts],schem:bf16}]", "plan"),
     ("precision.rules[0]: unknown key 'schem'", "valid keys: ignore, scheme, targets", "did you mean scheme?")),
    (("precision.rules=[{targets:[routed_experts],scheme:bf16}", "plan"),
     ("precision.rules:", "not valid override syntax (a [ is not closed)", "Fix: close every [")),
    (("precision.rules=[{targets:embed,scheme:bf16}]", "plan"),
     ("precision.rules[0].targets: expected a list [a string, ...], found 'embed'",)),
    (("engine.speculative={metod:mtp}", "plan"), ("engine.speculative: unknown key 'metod'", "did you mean method?")),
    (("recipe=dsv4_flash_b200", "backend.moe=trtlm", "plan"),
     ("backend.moe='trtlm' is not a moe backend", "flashinfer_cutedsl (alias cutedsl)",
      "did you mean backend.moe=flashinfer_trtllm?")),
    (("precision.routed_experts=nvpf4", "plan"), ("did you mean precision.routed_experts=nvfp4?",)),
    (("recipe=dsv4_flash_b200",), ("no command given", "plan")),
    (("recipe=dsv4_flash_b200", "pln"), ("unknown command 'pln'", "did you mean plan?")),
]


@pytest.mark.parametrize("args,words", HYDRA_MISTAKES)
def test_2_hydra_and_omegaconf_mistakes_are_one_line(cli, args, words):
    r = cli(*args)
    line = _one_error_line(r)
    assert r.returncode == EXIT_USAGE, line
    assert "+precision" not in line and "HYDRA_FULL_ERROR" not in line
    for w in words:
        assert w in line, line


@pytest.mark.parametrize("key,args", [
    ("quantize.source", ("recipe=tiny_dsv4", "quantize")),
    ("quantize.base", ("recipe=tiny_dsv4", "quantize")),
    ("model.path", ("recipe=dsv4_flash_b200", "plan")),
    ("model.path", ("recipe=tiny_dsv4", "convert")),
])
def test_2_a_missing_path_names_its_key(tmp_path, key, args):
    missing = tmp_path / "missing"
    r = _main(*args, f"{key}={missing}", tmp_path=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    line = _one_error_line(r)
    assert f"{key}='{missing}': no such directory" in line and f"Fix: set {key}=<checkpoint dir>" in line, line


def test_2_a_checkpoint_without_config_json_names_its_key(tmp_path):
    (tmp_path / "empty").mkdir()
    r = _main("recipe=dsv4_flash_b200", f"model.path={tmp_path / 'empty'}", "plan", tmp_path=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert f"model.path='{tmp_path / 'empty'}': a directory without config.json" in _one_error_line(r)


def test_0_a_rule_target_matching_nothing_is_one_warning_line(tmp_path):
    r = _main("recipe=dsv4_flash_b200", "precision.rules=[{targets:[routed_expert],scheme:bf16}]", "plan",
              tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    line = _one_error_line(r)
    assert line.startswith("nvfp4stack plan: warning: precision.rules[0] target 'routed_expert' matches no tensor "
                           "group of dsv4_flash; did you mean routed_experts?"), line
    assert "UserWarning" not in r.stderr and "warnings.warn" not in r.stderr


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


def test_130_a_task_gets_a_keyboard_interrupt_whatever_handler_was_set(tmp_path, capsys):
    """Outside a task the CLI exits at once on SIGINT; inside one, the task gets KeyboardInterrupt
    (to stop its children, leave resumable state), and the outer handler comes back afterwards."""
    def outer(signum, frame):
        raise AssertionError("the outer handler ran inside the task")

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the interrupt lands here
        return 0

    previous = signal.signal(signal.SIGINT, outer)
    try:
        assert run_task(ctrl_c, "convert", tmp_path / "cli.log") == EXIT_INTERRUPTED
        assert signal.getsignal(signal.SIGINT) is outer
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "nvfp4stack convert: interrupted (Ctrl-C)" in capsys.readouterr().err


@pytest.mark.parametrize("delay_s", [0.3, 1.0])
def test_130_ctrl_c_in_the_first_seconds_is_one_line(tmp_path, delay_s):
    """Imports and Hydra's composition take the first ~2 s: Ctrl-C there is one line and 130, not a
    KeyboardInterrupt traceback."""
    p = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "recipe=dsv4_flash_b200", "plan",
                          f"hydra.run.dir={tmp_path}"], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(delay_s)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == EXIT_INTERRUPTED, (p.returncode, err)
    assert err.strip().splitlines() == ["nvfp4stack plan: interrupted (Ctrl-C)"], err
    assert "Traceback" not in out + err
