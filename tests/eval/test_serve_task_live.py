"""eval.level=serve_task against the project's embedded vLLM server (python main.py serve), slow.

The tiny model is random, so it rarely answers right; the test checks the pipeline end to end:
every task is sent through the openai client, replies are scored by number match, and the score
written to metrics.json is the re-scored replies' score.
"""
from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvfp4stack.eval.serve_task import score_reply

ROOT = Path(__file__).resolve().parents[2]
# the serving engineer's tiny_cpu engine settings (tests/tasks/test_serve.py)
TINY_ENGINE = [
    "engine.dtype=float32", "engine.attention_backend=CPU_MLA", "engine.enforce_eager=true",
    """engine.compilation_config='{"custom_ops":["all","-rotary_embedding"]}'""",
    "engine.max_model_len=1024", "engine.ready_timeout_s=900",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_task_against_embedded_server(tmp_path, request):
    openai = pytest.importorskip("openai")
    pytest.importorskip("vllm")
    request.getfixturevalue("trained_default")  # a cold cache trains here, before the ready deadline starts
    rng = random.Random(random.randrange(2**31))
    tasks = []
    for i in range(6):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        tasks.append({"id": i, "prompt": f"What is {a} + {b}? Answer with a number.", "answer": a + b})
    tf = tmp_path / "tasks.jsonl"
    tf.write_text("\n".join(json.dumps(t) for t in tasks) + "\n")
    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "main.py", "serve", f"engine.port={port}", f"run_dir={tmp_path / 'serve'}",
                             *TINY_ENGINE], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=60)
        deadline = time.monotonic() + 1200
        while True:
            assert proc.poll() is None, f"main.py serve exited with {proc.returncode}"
            try:
                client.models.list()
                break
            except Exception:
                assert time.monotonic() < deadline, "server not ready"
                time.sleep(2)
        run_dir = tmp_path / "eval"
        r = subprocess.run([sys.executable, "main.py", "recipe=tiny_cpu", "eval", "eval.level=serve_task",
                            f"eval.tasks_file={tf}", f"eval.endpoint=http://127.0.0.1:{port}/v1", "eval.max_tokens=16",
                            f"run_dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        finally:
            log.close()
    st = json.loads((run_dir / "metrics.json").read_text())["serve_task"]
    print({k: st[k] for k in ("model", "total", "correct", "accuracy")})
    assert st["total"] == len(tasks) and len(st["items"]) == len(tasks)
    assert all(isinstance(it["reply"], str) and it["reply"] for it in st["items"])
    rescored = sum(score_reply(it["reply"], it["answer"])[0] for it in st["items"])
    assert st["correct"] == rescored and st["accuracy"] == pytest.approx(rescored / len(tasks))
