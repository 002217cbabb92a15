"""Every command the README shows runs as written (issue #12).

The README's ```bash blocks are read line by line. A command that needs what a CPU host does not
have carries a visible marker in its trailing comment, ``[needs GPU]`` or ``[needs a real
checkpoint]``; for those the test checks that the command at least composes (every key and value
valid) and that its plan or dry run goes through. Every other command runs for real, in a scratch
directory, in README order (a later command may use an earlier one's output: ``PATH`` in
``doctor checkpoint=PATH`` is the checkpoint the README's ``quantize`` wrote), with small budgets
added where a command takes a size. ``bash install.sh`` is CI's own first step, so it is not run
again here; the test command is checked against .ci/run instead of run recursively.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.local_server import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"\[needs (GPU|a real checkpoint)\]")
TEST_COMMAND = ".venv/bin/python -m pytest -q"
# Small budgets where a command takes a size: appended after the README's own overrides.
BUDGETS = {
    "quantize": ["quantize.calib_samples=8", "quantize.calib_seq_len=32"],
    "eval": ["eval.num_prompts=2", "eval.max_tokens=16"],
}
# Placeholders the README uses for paths a user fills in, and what the test fills in.
PLACEHOLDERS = ("PATH", "REL", "BF16")
LONG_RUNNING = ("serve",)   # the server runs until Ctrl-C: wait for ready, then SIGINT
RAN: list[str] = []


def readme_commands() -> list[tuple[str, str | None]]:
    """(command, marker or None) for each command line of the README's bash blocks, in order."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            cmd, _, comment = line.partition("  #")
            m = MARKER.search(comment)
            out.append((cmd.strip(), m.group(1) if m else None))
    return out



def _check_gpu_only_command(cmd: str) -> None:
    """A `[needs GPU]` command that is not `main.py`: it must at least parse here. Scripts exist and
    pass `bash -n` (with their verb in their usage); `python -m nvfp4stack.<module>` parses its
    arguments with the module's own ``parser()``, running nothing."""
    words = shlex.split(cmd)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # leading VAR=value environment settings
        words.pop(0)
    if words[0] == "bash":
        script = ROOT / words[1]
        assert script.is_file(), f"README command names a missing script: {cmd}"
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, f"{script} has a syntax error"
        verb = words[2] if len(words) > 2 else ""
        assert verb and verb in script.read_text(), f"{script} has no verb {verb!r}: {cmd}"
        return
    assert words[:2] == ["python", "-m"] and words[2].startswith("nvfp4stack."), f"unexpected GPU-only README command: {cmd}"
    import importlib

    mod = importlib.import_module(words[2] + (".__main__" if words[2] == "nvfp4stack.bundle" else ""))
    mod.parser().parse_args(words[3:])  # the module's own parser, running nothing


def _argv(cmd: str) -> list[str]:
    """README line -> argv for this interpreter (``.venv/bin/python`` and ``python`` alike)."""
    if cmd.startswith("bash install.sh && "):
        cmd = cmd[len("bash install.sh && "):]
    words = shlex.split(cmd)
    assert words[0] in ("python", ".venv/bin/python"), f"README command does not start with python: {cmd}"
    words[1:2] = [str(ROOT / "main.py")] if words[1] == "main.py" else words[1:2]
    return [sys.executable, *words[1:]]


def _command_word(argv: list[str]) -> str | None:
    from nvfp4stack.config import COMMANDS

    return next((w for w in argv if w in COMMANDS), None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


def _env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _quantized(recipe: str, scratch: Path) -> Path:
    """The recipe's earliest `quantize` output in the scratch dir (the README's own, when an earlier
    command made it); made here when this test runs alone (``-k``), so it needs no other test's output."""
    found = sorted(scratch.glob(f"outputs/*/*-{recipe}-quantize/quantized"))
    if not found:
        proc = subprocess.run([sys.executable, str(ROOT / "main.py"), f"recipe={recipe}", "quantize",
                               *BUDGETS["quantize"]], cwd=scratch, env=_env(), capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"recipe={recipe} quantize (for a README PATH) failed:\n{proc.stderr[-3000:]}"
        found = sorted(scratch.glob(f"outputs/*/*-{recipe}-quantize/quantized"))
    assert found, f"no `quantize` output of recipe {recipe} under {scratch}"
    return found[0]


def _uses_trained_default(argv: list[str]) -> bool:
    """The command's model is the trained default (``tiny_v3``, trained on first use); a README
    ``PATH`` is the `quantize` output of the command's own recipe, so it counts too."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.models import DEFAULT_MODEL

    given = dict(a.partition("=")[::2] for a in argv[2:] if "=" in a and not a.startswith("-"))
    factory = given.get("model.factory") or compose_config(f"recipe={given.get('recipe', 'tiny_cpu')}",
                                                           "run_dir=unused").model.factory
    return factory == DEFAULT_MODEL["factory"] and given.get("model.path", "PATH") in PLACEHOLDERS


def _fill_placeholders(argv: list[str], scratch: Path) -> list[str]:
    """PATH/REL/BF16 -> the `quantize` output of the command's own recipe (the default: tiny_cpu)."""
    recipe = next((a.partition("=")[2] for a in argv if a.startswith("recipe=")), "tiny_cpu")
    return [f"{a.partition('=')[0]}={_quantized(recipe, scratch)}" if a.partition("=")[2] in PLACEHOLDERS else a
            for a in argv]


def _run_until_ready(argv: list[str], cwd: Path, timeout_s: float = 600) -> str:
    """Start a long-running command, wait for its ready line, Ctrl-C it; returns its output."""
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    ready = False
    try:
        for line in proc.stdout:
            lines.append(line)
            if "engine ready" in line:
                ready = True
                break
            if time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rest, _ = proc.communicate()
    out = "".join(lines) + (rest or "")
    assert ready, f"{shlex.join(argv)}: no 'engine ready' line within {timeout_s} s; output ends:\n{out[-3000:]}"
    assert proc.returncode == 130, f"{shlex.join(argv)}: exit {proc.returncode} after Ctrl-C (expected 130):\n{out[-3000:]}"
    return out


COMMANDS = readme_commands()


def test_readme_has_commands():
    words = [c for c, _ in COMMANDS]
    assert "bash install.sh && .venv/bin/python main.py serve" in words
    assert f"bash install.sh && {TEST_COMMAND}" in words
    assert len(words) >= 14, words


@pytest.mark.slow
@pytest.mark.parametrize("cmd,marker", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command_runs(cmd, marker, scratch, request):
    if cmd.endswith(TEST_COMMAND):
        ci = (ROOT / ".ci" / "run").read_text()
        assert "bash install.sh" in ci and "python -m pytest -q" in ci, "CI must run the README's test command"
        RAN.append(f"(checked against .ci/run) {cmd}")
        return
    if marker == "GPU" and "main.py" not in cmd:
        _check_gpu_only_command(cmd)
        RAN.append(f"(parse only: needs GPU) {cmd}")
        return
    argv = _argv(cmd)
    word = _command_word(argv)
    if marker is not None:
        # Needs a GPU or a real checkpoint: it must still compose, and its plan / dry run go through.
        swap = {"serve": ["serve", "engine.dry_run=true"], "eval": ["plan"], "bench": ["plan"]}
        argv = [w for a in argv for w in (swap.get(a, [a]) if a == word else [a])]
        argv = [a for a in argv if a.partition("=")[2] not in PLACEHOLDERS]
        timeout = 300
    else:
        if _uses_trained_default(argv):
            # the trained default of the user's cache: a cold cache (CI) trains it here, once per
            # session, not inside a command's timeout or ready wait
            request.getfixturevalue("trained_default")
        argv = _fill_placeholders(argv, scratch)
        argv += BUDGETS.get(word, [])
        timeout = 900
    if word in LONG_RUNNING and "engine.dry_run=true" not in argv:
        argv.append(f"engine.port={free_port()}")
        out = _run_until_ready(argv, scratch)
    else:
        if word == "bench":
            argv.append(f"engine.port={free_port()}")
        proc = subprocess.run(argv, cwd=scratch, env=_env(), capture_output=True, text=True, timeout=timeout)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"README command failed (exit {proc.returncode}): {shlex.join(argv)}\n{out[-4000:]}"
    assert "Traceback" not in out, f"{shlex.join(argv)} printed a traceback:\n{out[-4000:]}"
    RAN.append(("(parse/plan only: needs " + marker + ") " if marker else "") + shlex.join(argv[1:]))
    print(f"ran: {shlex.join(argv[1:])}")


def test_lists_the_commands_it_ran():
    """Printed with -s and in CI's log: the README commands this run executed."""
    if not RAN:
        pytest.skip("the README commands were deselected (-m 'not slow')")
    assert len(RAN) == len(COMMANDS), f"ran {len(RAN)} of {len(COMMANDS)} README commands"
    assert all(r.strip() for r in RAN)
