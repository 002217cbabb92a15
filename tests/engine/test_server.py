"""Server process management on a stand-in process tree (no vLLM): readiness errors, clean shutdown."""
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
