"""What the tests that start a local vLLM server share: the repository root, `serve`'s default cache_dir under this
HOME, and a free localhost port."""
from __future__ import annotations

import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path("~/.cache/nvfp4stack").expanduser()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
