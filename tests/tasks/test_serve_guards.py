"""serve's guards, without a vLLM server (issues #36, #38): the API key travels only through the
child's environment, a non-loopback bind without a key is warned about, a plan where nothing fits
is refused as `plan` refuses it, and Ctrl-C exits 130 before and after ready.

The launch path runs serve.run() in process with the checkpoint, the plugin check and vLLM stood in
for: ``server.launch`` records argv and env and starts a sleeping child, ``server.wait_ready``
answers at once, and the ready banner's printing sends the Ctrl-C.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.cli import EXIT_INTERRUPTED, EXIT_PROBLEMS, EXIT_USAGE, compose_config, run_task
from nvfp4stack.engine import server
from nvfp4stack.tasks import serve

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "NVFP4STACK_TEST_SERVE_KEY"
SECRET = "k3y-9f1c2e7a-never-recorded"
DSV4_BF16_EXPERTS = ("recipe=dsv4_b200", "precision.rules=[{targets:[routed_experts],scheme:bf16}]")


def files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """serve.run() up to a stand-in server: returns the dict the stand-ins fill (argv, env, api_key)."""
    seen: dict = {}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "modelopt",
                                                                          "quant_algo": "NVFP4"}}))
    monkeypatch.setattr(serve, "resolve_checkpoint", lambda cfg, plan, build=True: ckpt)
    monkeypatch.setattr(serve, "check_plugin_installed", lambda: None)
    real_launch = server.launch

    def launch(argv, log_path, env=None):
        seen["argv"], seen["env"] = list(argv), dict(env or {})
        # stands in for vLLM; it logs its own argv where vLLM's log goes
        return real_launch([sys.executable, "-c", "import sys, time; print(sys.argv, flush=True); time.sleep(120)",
                            *argv[1:]], log_path)

    def wait_ready(proc, base_url, timeout_s, log_path, progress_every_s=10.0, api_key=None):
        seen["api_key"] = api_key
        return ["tiny-v3-nvfp4"]

    real_ready_message = server.ready_message

    def ready_message(*args, **kwargs):
        # the ready banner is printed: now a Ctrl-C stops a serving server
        os.kill(os.getpid(), signal.SIGINT)
        return real_ready_message(*args, **kwargs)

    monkeypatch.setattr(server, "launch", launch)
    monkeypatch.setattr(server, "wait_ready", wait_ready)
    monkeypatch.setattr(server, "ready_message", ready_message)
    return seen


def run_serve(tmp_path, *overrides) -> int:
    cfg = compose_config(*overrides, f"run_dir={tmp_path / 'run'}", "command=serve")
    (tmp_path / "run").mkdir(exist_ok=True)
    return run_task(lambda: serve.run(cfg), "serve", tmp_path / "run" / "cli.log")


def test_api_key_reaches_vllm_only_through_the_environment(launched, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code = run_serve(tmp_path, f"engine.api_key_env={KEY_ENV}", "engine.port=18123")
    out, err = capsys.readouterr()
    assert code == EXIT_INTERRUPTED == 130, err
    assert launched["env"]["VLLM_API_KEY"] == SECRET and launched["api_key"] == SECRET
    assert not [a for a in launched["argv"] if SECRET in a] and "--api-key" not in launched["argv"]
    run_dir = tmp_path / "run"
    assert {"serve_command.sh", "engine_plan.json", "cli.log", "vllm_server.log"} <= {p.name for p in run_dir.iterdir()}
    assert files_holding(run_dir, SECRET) == []
    assert SECRET not in out + err
    # the banner's examples read the key from the environment, with this interpreter (the venv's)
    assert f'-H "Authorization: Bearer ${KEY_ENV}"' in out
    assert f"api_key=os.environ[{KEY_ENV!r}]" in out and f"{sys.executable} - <<'EOF'" in out
    assert err.strip().splitlines()[-1].startswith("nvfp4stack serve: interrupted (Ctrl-C)")


def test_ctrl_c_after_ready_exits_130(launched, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code = run_serve(tmp_path, "engine.port=18124")
    out, err = capsys.readouterr()
    assert code == 130, err
    assert "engine ready" in out and "api_key='EMPTY'" in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["nvfp4stack serve: interrupted (Ctrl-C): server and its processes stopped"], err


def test_ctrl_c_during_start_exits_130_even_when_the_server_answers(monkeypatch):
    """Stopped before serve saw ready: 130 like any Ctrl-C, whether or not /v1/models answers by then."""
    import threading

    release = threading.Event()
    monkeypatch.setattr(server, "wait_ready", lambda *a, **k: release.wait(30) and ["never"])
    monkeypatch.setattr(server, "served_models", lambda *a, **k: ["tiny-v3-nvfp4"])
    stop = serve.StopFlag()
    stop.set(signal.SIGINT, None)
    try:
        assert serve._wait_ready_or_stop(server, None, "http://x/v1", 60, None, stop) is None
        assert stop.name() == "Ctrl-C"
    finally:
        release.set()


@pytest.mark.parametrize("value", [None, ""])
def test_api_key_env_unset_or_empty_is_a_usage_error(tmp_path, monkeypatch, capsys, value):
    if value is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, value)
    code = run_serve(tmp_path, f"engine.api_key_env={KEY_ENV}", "engine.dry_run=true")
    err = capsys.readouterr().err
    assert code == EXIT_USAGE == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"nvfp4stack serve: error: engine.api_key_env={KEY_ENV}: expected the API key in "
                               f"environment variable {KEY_ENV}, found it {'unset' if value is None else 'empty'}")
    assert f"export {KEY_ENV}=" in lines[0] and "engine.api_key_env=null" in lines[0]
    assert not (tmp_path / "run" / "serve_command.sh").exists()


@pytest.mark.parametrize("host,key,warned", [("0.0.0.0", False, True), ("0.0.0.0", True, False),
                                             ("127.0.0.1", False, False), ("localhost", False, False)])
def test_open_bind_without_a_key_warns(tmp_path, monkeypatch, capsys, host, key, warned):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv(KEY_ENV, SECRET)
    keys = [f"engine.api_key_env={KEY_ENV}"] if key else []
    code = run_serve(tmp_path, f"engine.host={host}", *keys, "engine.dry_run=true")
    err = capsys.readouterr().err
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    if warned:
        assert warnings == [f"[serve] WARNING: engine.host={host} takes connections from other machines and the "
                            "server asks them for no API key; set engine.api_key_env=NAME (an environment variable "
                            "holding a key), or engine.host=127.0.0.1"]
    else:
        assert warnings == [], err


def test_dry_run_records_no_key_anywhere(tmp_path):
    """The whole CLI (Hydra's .hydra/, config.yaml, cli.log, manifest.json, serve_command.sh)."""
    env = {**os.environ, KEY_ENV: SECRET}
    env.pop("VLLM_API_KEY", None)
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "serve", "engine.dry_run=true",
                        f"engine.api_key_env={KEY_ENV}", "engine.host=0.0.0.0", f"hydra.run.dir={tmp_path}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "WARNING" not in r.stderr and SECRET not in r.stdout + r.stderr
    assert {"config.yaml", "cli.log", "serve_command.sh", ".hydra"} <= {p.name for p in tmp_path.iterdir()}
    assert KEY_ENV in (tmp_path / "config.yaml").read_text()   # the name is recorded, the key is not
    assert files_holding(tmp_path, SECRET) == []


def test_serve_refuses_what_plan_says_cannot_fit(tmp_path, capsys):
    """V4 Pro with BF16 experts on 8x B200: `plan` exits 1 NOTHING FITS; serve (dry run included)
    exits 1 with the same message, and launches only with engine.allow_overcommit=true."""
    from nvfp4stack.tasks import plan as plan_task

    assert plan_task.run(compose_config(*DSV4_BF16_EXPERTS, f"run_dir={tmp_path / 'plan'}")) == EXIT_PROBLEMS
    plan_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert plan_line.startswith("plan: NOTHING FITS on this layout: the weights leave no room for KV cache ("), plan_line

    code = run_serve(tmp_path, *DSV4_BF16_EXPERTS, "engine.dry_run=true")
    out, err = capsys.readouterr()
    assert code == EXIT_PROBLEMS == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [plan_line.replace("plan: ", "serve: ", 1)
                     + "; or set engine.allow_overcommit=true to serve anyway"], err
    assert out == "" and not (tmp_path / "run" / "serve_command.sh").exists()

    code = run_serve(tmp_path, *DSV4_BF16_EXPERTS, "engine.dry_run=true", "engine.allow_overcommit=true")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "NOTHING FITS" in err and "serving anyway (engine.allow_overcommit=true)" in err
    assert (tmp_path / "run" / "serve_command.sh").read_text().strip() == out.strip().splitlines()[-1]


def test_a_taken_port_is_refused_before_launch(launched, tmp_path, capsys):
    """A server still running on engine.port once answered the health check for a child that had
    failed to bind (an H200 bench measured the stale server); serve now refuses before launching."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        code = run_serve(tmp_path, f"engine.port={port}")
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE == 2, err
    assert "argv" not in launched   # nothing was started
    line = err.strip().splitlines()[-1]
    assert f"engine.port={port}: 127.0.0.1:{port} is already in use" in line and "set engine.port" in line


def test_a_draft_under_cuda_graphs_is_warned_about_before_launch(tmp_path, capsys):
    """vLLM's wrong prompt_logprobs with the MTP draft and CUDA graphs (vllm-project/vllm#53488) is said before
    the server starts (here its dry run), and not where no graph runs."""
    code = run_serve(tmp_path, "recipe=dsv4_flash_h200", "engine.dry_run=true")
    err = capsys.readouterr().err
    assert code == 0, err
    warned = [line for line in err.splitlines() if "vllm-project/vllm#53488" in line]
    assert len(warned) == 1 and warned[0].startswith("[serve] WARNING: engine.speculative.method=mtp: "), err
    assert run_serve(tmp_path, "recipe=dsv4_flash_h200", "engine.dry_run=true", "engine.enforce_eager=true") == 0
    assert "vllm-project/vllm#53488" not in capsys.readouterr().err
