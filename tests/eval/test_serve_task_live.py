"""eval.level=serve_task against the project's embedded vLLM server (python main.py serve: the session's shared
``default_server``, tests/conftest.py), slow.

The tiny model is random, so it rarely answers right; the test checks the pipeline end to end:
every task is sent through the openai client, replies are scored by number match, and the score
written to metrics.json is the re-scored replies' score.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.eval.serve_task import score_reply

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_task_against_embedded_server(tmp_path, default_server):
    rng = random.Random(random.randrange(2**31))
    tasks = []
    for i in range(6):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        tasks.append({"id": i, "prompt": f"What is {a} + {b}? Answer with a number.", "answer": a + b})
    tf = tmp_path / "tasks.jsonl"
    tf.write_text("\n".join(json.dumps(t) for t in tasks) + "\n")
    default_server.client(timeout=60).models.list()   # the session's shared `python main.py serve`, up
    run_dir = tmp_path / "eval"
    r = subprocess.run([sys.executable, "main.py", "recipe=tiny_cpu", "eval", "eval.level=serve_task",
                        f"eval.tasks_file={tf}", f"eval.endpoint={default_server.base_url}", "eval.max_tokens=16",
                        f"run_dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    st = json.loads((run_dir / "metrics.json").read_text())["serve_task"]
    print({k: st[k] for k in ("model", "total", "correct", "accuracy")})
    assert st["total"] == len(tasks) and len(st["items"]) == len(tasks)
    assert all(isinstance(it["reply"], str) and it["reply"] for it in st["items"])
    rescored = sum(score_reply(it["reply"], it["answer"])[0] for it in st["items"])
    assert st["correct"] == rescored and st["accuracy"] == pytest.approx(rescored / len(tasks))
