"""Run vLLM's OpenAI server as a child process: launch, health-check, clean shutdown of the whole tree.

The child gets its own session (process group), so stopping it reaches the API server, the
engine core and every worker it forked, and nothing else.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServerError(RuntimeError):
    """The server exited or never became ready; the message carries the log tail."""


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def check_port_free(host: str, port: int) -> None:
    """ValueError (exit 2) when something already listens on ``host:port``: vLLM's child would fail to
    bind and exit, while the health check, asking the same address, would take the other server's
    answers for its own (an H200 bench once measured a stale server this way)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does: TIME_WAIT is no conflict
        try:
            s.bind((host, int(port)))
        except OSError as e:
            raise ValueError(f"engine.port={port}: {host}:{port} is already in use ({e.strerror}), probably by "
                             f"a server still running; stop it, or set engine.port to a free port") from None


def launch(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``argv`` in a new session with stdout+stderr appended to ``log_path``."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)


def _get(url: str, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def served_models(base_url: str, timeout: float = 5.0, api_key: str | None = None) -> list[str]:
    """The model ids the server lists once /health and /v1/models both answer; [] before that.
    ``api_key``: the server's key (vLLM guards /v1 with it, not /health)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    status, _ = _get(f"{root}/health", timeout)
    if status == 200:
        status, body = _get(f"{root}/v1/models", timeout, api_key)
        if status == 200:
            return [m["id"] for m in json.loads(body)["data"]]
    return []


def wait_ready(proc: subprocess.Popen, base_url: str, timeout_s: float, log_path: Path,
               progress_every_s: float = 10.0, api_key: str | None = None) -> list[str]:
    """Poll /health then /v1/models until the model is listed; returns the served model ids.

    Raises ServerError (with the log tail) when the process exits or ``timeout_s`` passes.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    next_note = t0 + progress_every_s
    while time.monotonic() < deadline:
        if time.monotonic() >= next_note:
            # the engine takes ~45 s on CPU: say it is alive, and what vLLM is doing
            last = (log_tail(log_path, 1) or "").strip().splitlines()
            print(f"[serve] starting engine: {time.monotonic() - t0:4.0f} s; vLLM: "
                  f"{last[-1][:160] if last else '(no log line yet)'}", flush=True)
            next_note += progress_every_s
        if proc.poll() is not None:
            raise ServerError(f"vLLM server exited with code {proc.returncode} before it was ready. "
                              f"Log {log_path}, last lines:\n{log_tail(log_path)}")
        models = served_models(base_url, api_key=api_key)
        if models:
            return models
        time.sleep(1.0)
    raise ServerError(f"vLLM server not ready after {timeout_s:.0f} s (engine.ready_timeout_s); raise it "
                      f"or check the log {log_path}, last lines:\n{log_tail(log_path)}")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (psutil, which vLLM already depends on)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def shutdown(proc: subprocess.Popen, grace_s: float = 30.0) -> list[int]:
    """SIGTERM the server's process group, then SIGKILL what is left after ``grace_s``.

    Returns the pids still alive afterwards (empty when the tree is gone).
    """
    import psutil

    tree = [proc.pid, *descendants(proc.pid)]
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the group we created with start_new_session
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass

    def alive() -> list[psutil.Process]:
        out = []
        for pid in tree:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    left = alive()
    if left:
        _, left = psutil.wait_procs(left, timeout=max(1.0, grace_s / 3))
    for p in left:  # only pids of the tree we launched
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)
    return [p.pid for p in alive()]


def ready_message(base_url: str, model_id: str, key_env: str | None = None, python: str = sys.executable) -> str:
    """Ready-to-paste curl and Python examples for the running server.

    ``key_env``: the environment variable holding the server's API key; the examples read it from
    there (the key itself is never printed). ``python``: the interpreter that has ``openai`` (this
    one: the venv's), since a bare ``python`` outside the venv has not.
    """
    body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 32})
    auth = f' -H "Authorization: Bearer ${key_env}"' if key_env else ""
    key = f"os.environ[{key_env!r}]" if key_env else "'EMPTY'"
    note = (f"The server requires the API key in ${key_env}: export it in the shell you run these in.\n\n"
            if key_env else "")
    return (
        f"\nvLLM OpenAI server ready at {base_url} (model {model_id!r}). Try:\n\n{note}"
        f"curl {base_url}/chat/completions -H 'Content-Type: application/json'{auth} \\\n  -d '{body}'\n\n"
        f"{shlex.quote(python)} - <<'EOF'\n"
        + ("import os\n" if key_env else "")
        + "from openai import OpenAI\n"
        f"client = OpenAI(base_url={base_url!r}, api_key={key})\n"
        f"r = client.chat.completions.create(model={model_id!r}, max_tokens=32,\n"
        "    messages=[{'role': 'user', 'content': 'Hello!'}])\n"
        "print(r.choices[0].message.content)\n"
        "EOF\n\nCtrl-C stops the server and all its processes.\n"
    )
