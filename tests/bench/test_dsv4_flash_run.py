"""bench/dsv4_flash_run.py's comparison of two serve runs (issue #34): greedy equal prefixes and the
teacher-forced agreement, on runs that part at known places."""
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "dsv4_flash_run.py"


def _module():
    spec = importlib.util.spec_from_file_location("dsv4_flash_run", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(greedy, own, top1):
    return {"greedy": [{"prompt_len": n, "token_ids": t, "tokens": None, "logprobs": [lp] + [0.0] * (len(t) - 1)}
                       for n, t, lp in greedy],
            "teacher_forced": [{"prompt_len": 8, "own_logprob": own, "top1": top1}]}


def test_compare_reports_where_runs_part_and_how_far(tmp_path, capsys):
    a = _run([(1, [5, 6, 7, 8], -1.25), (4, [9, 9, 9], -0.5)], [-1.0, -2.0, -3.0, -4.0], [11, 12, 13, 14])
    b = _run([(1, [5, 6, 0, 8], -1.5), (4, [9, 9, 9], -0.5)], [-1.0, -2.5, -3.0, -3.75], [11, 12, 99, 14])
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert _module().compare(str(tmp_path / "a.json"), str(tmp_path / "b.json")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "greedy len    1: equal prefix  2 of 4; first-token logprob -1.250 vs -1.500"
    assert lines[1].startswith("greedy len    4: equal prefix  3 of 3")
    assert lines[2] == ("teacher-forced, 4 positions: top-1 token equal at 3 (75.0%); |delta logprob| of the "
                        "prompt's own token: median 0.1250, p90 0.2500, max 0.5000 nats")


def test_prompts_are_fixed_and_inside_the_token_range():
    mod = _module()
    p = mod.prompts()
    assert [len(x) for x in p] == list(mod.PROMPT_LENGTHS) and p == mod.prompts()
    assert all(300 <= t < mod.TOKEN_HI for x in p for t in x) and len({t for x in p for t in x}) > 100


def test_compare_reports_the_reference_margin_where_top1_differs(tmp_path, capsys):
    """Runs with top-2 margins (prompt_logprobs=2): the first run's margin, overall and where the two runs'
    top-1 tokens differ, so a flip can be read against how close the runner-up was."""
    a = _run([(1, [5], -1.0)], [-1.0, -2.0, -3.0, -4.0], [11, 12, 13, 14])
    b = _run([(1, [5], -1.0)], [-1.0, -2.0, -3.0, -4.0], [11, 99, 13, 98])
    a["teacher_forced"][0]["margin"] = [2.0, 0.125, 1.0, 0.5]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    _module().compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("first run's top-1 margin over the runner-up: median 0.7500 nats over 4 positions; where the "
                    "top-1 tokens differ: median 0.3125, max 0.5000 nats (2 positions)")


def test_a_cell_whose_timed_rounds_saw_a_compile_is_marked(tmp_path):
    """The real client against a stand-in OpenAI server that 'compiles' (writes a cache entry) while serving the
    fourth request of the first timed round at batch 8 (the 12th decode request: the untimed round sends 8)."""
    import http.server
    import subprocess
    import sys
    import threading
    import time

    cache = tmp_path / "dg" / "cache"
    cache.mkdir(parents=True)
    (cache / "kernel.old").mkdir()   # written before the client: never listed
    seen, lock = {"decode": 0}, threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("prompt_logprobs"):
                rows = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in body["prompt"][1:]]
                out = {"choices": [{"text": "x", "prompt_logprobs": rows}]}
            else:
                out = {"choices": [{"text": "x", "token_ids": [5], "logprobs": {"tokens": ["x"],
                                                                                "token_logprobs": [-0.5]}}],
                       "usage": {"completion_tokens": body["max_tokens"]}}
                if body.get("ignore_eos"):
                    with lock:
                        seen["decode"] += 1
                        n = seen["decode"]
                    time.sleep(0.05)   # a round lasts well past the file system's coarse timestamps
                    if n == 12:
                        (cache / "kernel.sm90_fp8_gemm_1d2d.new").mkdir()
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def client(out, *extra):
        return subprocess.run([sys.executable, str(SCRIPT), "--base-url", f"http://127.0.0.1:{srv.server_port}/v1",
                               "--model", "m", "--json", str(out), "--batches", "8", "--rounds", "3",
                               "--decode-tokens", "3", "--prefill-tokens", "16",
                               "--compile-dirs", f"{tmp_path}/dg/cache,{tmp_path}/missing/*/kernels", *extra],
                              capture_output=True, text=True, timeout=120)
    try:
        out = tmp_path / "run.json"
        r = client(out, "--retimes", "0")
        # the default: batch 8's rounds timed again once the kernel is in the cache
        (cache / "kernel.sm90_fp8_gemm_1d2d.new").rmdir()
        seen["decode"] = 0
        again = tmp_path / "again.json"
        r2 = client(again)
    finally:
        srv.shutdown()
    assert r2.returncode == 0, r2.stderr
    assert "decode batch 8: 1 compiled inside its timed rounds; timing it again (kernel.sm90_fp8_gemm_1d2d.new)" \
        in r2.stdout and "NOT A MEASUREMENT" not in r2.stdout
    res2 = json.loads(again.read_text())
    assert [Path(p).name for p in res2["decode"]["8"]["retimed_after"]] == ["kernel.sm90_fp8_gemm_1d2d.new"]
    assert res2["compiled"]["in_timed_rounds"]["decode batch 8"] == [] and "retimed_after" not in res2["prefill"]
    assert len(res2["decode"]["8"]["rounds"]) == 3 and seen["decode"] == 8 + 3 * 8 * 2
    assert r.returncode == 0, r.stderr
    assert "compiled while this client ran: 1 cache entries" in r.stdout
    assert "NOT A MEASUREMENT: decode batch 8: 1 compiled inside its timed rounds (kernel.sm90_fp8_gemm_1d2d.new)" \
        in r.stdout
    assert "NOT A MEASUREMENT: prefill" not in r.stdout
    res = json.loads(out.read_text())
    assert res["compiled"]["in_timed_rounds"]["prefill"] == [] and len(res["decode"]["8"]["window"]) == 2
    assert res["decode"]["8"]["host"]["load1"] >= 0 and "host" in res["prefill"]   # nvidia-smi: only where it is


def test_compiles_are_attributed_by_time_to_the_cells_windows():
    mod = _module()
    windows = {"prefill": (10.0, 20.0), "decode batch 1": (30.0, 40.0)}
    hit = mod.compiles_in(windows, [(5.0, "a"), (15.0, "b"), (25.0, "c"), (40.0, "d")])
    assert hit == {"prefill": ["b"], "decode batch 1": ["d"]}   # a and c fell between timed rounds


def test_ratio_per_cell_with_noise_and_compiles(tmp_path, capsys):
    def cell(med, lo, hi):
        return {"median": med, "min": lo, "max": hi}

    base = {"prefill": cell(0.0952, 0.0927, 0.0976),
            "decode": {"1": cell(127.1, 126.9, 127.6), "8": cell(601.2, 600.2, 627.5), "128": cell(3079.0, 3022, 3080)}}
    ours = {"prefill": cell(0.0806, 0.0734, 0.0809),
            "decode": {"1": cell(140.7, 140.4, 140.8), "8": cell(610.0, 590.0, 640.0), "128": cell(5516.1, 5364, 6043)},
            "compiled": {"in_timed_rounds": {"decode batch 128": ["kernel.x"], "prefill": []}}}
    (tmp_path / "b.json").write_text(json.dumps(base))
    (tmp_path / "o.json").write_text(json.dumps(ours))
    assert _module().ratio(str(tmp_path / "b.json"), str(tmp_path / "o.json")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("prefill: 1.18x (80.6 vs 95.2 ms") and out[0].endswith("ours faster")
    assert out[1].startswith("decode batch 1: 1.11x (140.7 vs 127.1 tok/s") and out[1].endswith("ours faster")
    assert out[2].endswith("within noise (the ranges overlap)")
    assert out[3].endswith("not a measurement: a compile inside its timed rounds")


def _run_client_on_a_stand_in(tmp_path, *extra):
    """The client against a stand-in server that refuses every prompt_logprobs request with HTTP 400 and answers
    the rest: (the finished process, its JSON, the request bodies the stand-in saw)."""
    import http.server
    import subprocess
    import sys
    import threading

    reason = '{"error": {"message": "prompt_logprobs refused by this stand-in", "code": 400}}'
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            code, data = 200, json.dumps({"choices": [{"text": "x", "token_ids": [5], "logprobs": {
                "tokens": ["x"], "token_logprobs": [-0.5]}}], "usage": {"completion_tokens": body["max_tokens"]}})
            if body.get("prompt_logprobs"):
                code, data = 400, reason
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    out = tmp_path / "run.json"
    try:
        r = subprocess.run([sys.executable, str(SCRIPT), "--base-url", f"http://127.0.0.1:{srv.server_port}/v1",
                            "--model", "m", "--json", str(out), "--batches", "2", "--rounds", "3",
                            "--decode-tokens", "3", "--prefill-tokens", "16", *extra],
                           capture_output=True, text=True, timeout=120)
    finally:
        srv.shutdown()
    assert r.returncode == 0, r.stderr
    return r, json.loads(out.read_text()), seen


def test_a_refused_teacher_forced_request_is_reported_and_the_timed_cells_still_run(tmp_path):
    """TP4 + EP + MTP (four H200s, 2026-11-28) answered the teacher-forced requests with HTTP 400, and the client
    died before its first timed cell. Now vLLM's reason (the body) is printed and kept, and the client goes on."""
    r, res, _ = _run_client_on_a_stand_in(tmp_path)
    skipped = [line for line in r.stdout.splitlines() if line.startswith("teacher-forced scoring skipped:")]
    assert len(skipped) == 7   # every prompt of 2 tokens or more
    assert "answered HTTP 400" in skipped[0] and "prompt_logprobs refused by this stand-in" in skipped[0]
    assert "'prompt_logprobs': 2" in skipped[0] and "a 2-token prompt" in skipped[0]
    assert [t["prompt_len"] for t in res["teacher_forced"]] == [2, 4, 8, 16, 64, 256, 600]
    assert all("HTTP 400" in t["error"] for t in res["teacher_forced"])
    assert len(res["decode"]["2"]["rounds"]) == 3 and len(res["prefill"]["rounds"]) == 3


def test_scoring_skipped_on_request_asks_for_no_prompt_logprobs_and_says_why(tmp_path, capsys):
    """A server with the MTP draft under CUDA graphs scores prompts wrongly (vllm-project/vllm#53488; TP4 + EP +
    MTP, 2026-11-28): dsv4_flash_serve.sh passes --skip-teacher-forced there, and the reason is kept."""
    why = "MTP draft with CUDA graphs"
    r, res, seen = _run_client_on_a_stand_in(tmp_path, "--skip-teacher-forced", why)
    assert f"teacher-forced scoring skipped: {why}" in r.stdout.splitlines()
    assert not any("prompt_logprobs" in body for body in seen) and len(seen) > 8
    assert res["teacher_forced"] == [] and res["teacher_forced_skipped"] == why
    assert len(res["greedy"]) == 8 and len(res["decode"]["2"]["rounds"]) == 3
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**res, "teacher_forced_skipped": None}))
    assert _module().compare(str(other), str(tmp_path / "run.json")) == 0
    said = capsys.readouterr().out
    assert f"teacher-forced: the second run scored no prompt: {why}" in said.splitlines()
    assert "the first run scored no prompt" not in said


def test_compare_leaves_out_prompts_a_server_refused_to_score(tmp_path, capsys):
    """A prompt one run refused and the other scored is left out on both sides (and said), in either direction;
    the rest pair by length, whatever their order."""
    a = _run([(1, [5], -1.0)], [-1.0, -2.0, -3.0, -4.0], [11, 12, 13, 14])
    b = _run([(1, [5], -1.0)], [-1.0, -2.5, -3.0, -4.0], [11, 12, 13, 99])
    far = {"own_logprob": [-40.0, -40.0], "top1": [1, 2]}   # would change every figure if it were paired
    a["teacher_forced"].insert(0, {"prompt_len": 4, "error": "HTTP 400"})
    b["teacher_forced"].insert(0, {"prompt_len": 4, **far})
    a["teacher_forced"].append({"prompt_len": 16, **far})
    b["teacher_forced"].append({"prompt_len": 16, "error": "HTTP 400"})
    b["teacher_forced"].reverse()
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    _module().compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "teacher-forced: prompts left out, refused by the server (lengths): first run [4], second run [16]"
    assert lines[2] == (
        "teacher-forced, 4 positions: top-1 token equal at 3 (75.0%); |delta logprob| of the prompt's own token: "
        "median 0.0000, p90 0.0000, max 0.5000 nats")
