"""What the tests that start a local vLLM server share: the repository root, `serve`'s default cache_dir under this
HOME, a free localhost port, and stopping the server."""
from __future__ import annotations

import signal
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path("~/.cache/nvfp4stack").expanduser()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_main(proc, log, log_path: Path) -> int:
    """Ctrl-C a ``main.py serve`` a test started (where it still runs), wait for it, close its log and print the
    log's tail; returns its exit code (130 after Ctrl-C, README "Exit codes")."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=120)
    log.close()
    print(Path(log_path).read_text(errors="replace")[-3000:])
    return code
