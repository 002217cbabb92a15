"""Number-match scoring, and run_tasks through the official openai client.

The HTTP server here is a minimal stand-in for the scorer's unit test only; the acceptance test
against the project's embedded vLLM server is test_serve_task_live.py (slow).
"""
from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nvfp4stack.eval.serve_task import load_tasks, parse_numbers, run_tasks, score_reply


def test_parse_numbers():
    assert parse_numbers("a 1,234.5 b -7 c 3e2 d .5 and 3/4") == [1234.5, -7.0, 300.0, 0.5, 0.75]
    assert parse_numbers("no digits here") == []
    assert parse_numbers("x2 version3") == []  # digits glued to words are not answers


@pytest.mark.parametrize("reply,answer,ok", [
    ("The answer is 1,000.", 1000, True),
    ("so we get 1000.0", "1,000", True),
    ("It is 1e3", 1000, True),
    ("10", 100, False),              # a string-prefix scorer would call this a match
    ("100", 10, False),
    ("First 12, then 7 + 5 = 12", 12, True),   # the last number is the answer
    ("3 apples and 4 pears, 7", 3, False),
    ("half: 0.5", "1/2", True),
    ("no number", 5, False),
    ("-3.50", -3.5, True),
])
def test_score_reply(reply, answer, ok):
    assert score_reply(reply, answer)[0] is ok


def test_score_reply_tolerance():
    assert score_reply("3.1416", 3.14159, rel_tol=1e-4)[0]
    assert not score_reply("3.1416", 3.14159, rel_tol=1e-6)[0]


def test_load_tasks_errors(tmp_path):
    with pytest.raises(ValueError, match="eval.tasks_file"):
        load_tasks(None)
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="t.jsonl:1"):
        load_tasks(bad)


class _Handler(BaseHTTPRequestHandler):
    replies: dict = {}

    def log_message(self, *a):
        pass

    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "t"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = self.replies[req["messages"][-1]["content"]]
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": req["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def test_run_tasks_through_openai_client(tmp_path):
    rng = random.Random(random.randrange(2**31))
    tasks, replies, want = [], {}, 0
    for i in range(12):
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        right = rng.random() < 0.5
        reply = f"{a} + {b} = {a + b:,}" if right else f"{a} + {b} = {a + b + rng.choice([1, 10, -100])}"
        want += right
        tasks.append({"id": i, "prompt": f"q{i}: {a}+{b}?", "answer": a + b})
        replies[f"q{i}: {a}+{b}?"] = reply
    f = tmp_path / "tasks.jsonl"
    f.write_text("\n".join(json.dumps(t) for t in tasks) + "\n")
    _Handler.replies = replies
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = run_tasks(f, f"http://127.0.0.1:{srv.server_address[1]}/v1", model="not-served-name")
    finally:
        srv.shutdown()
    assert r["model"] == "fake-model" and r["total"] == 12
    assert r["correct"] == want and r["accuracy"] == pytest.approx(want / 12)
    assert all(it["correct"] == (it["parsed"] == it["answer"]) for it in r["items"])
