"""Run a Triton check script on the GPU where there is one, else under the Triton interpreter on CPU, in a subprocess
(TRITON_INTERPRET is read at import, so the interpreter needs a fresh process). The script gets the device ("cuda" or
"cpu") and a seed as argv[1:3] and exits non-zero on a mismatch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run_triton_check(script: str, seed: int) -> None:
    pytest.importorskip("triton")
    env = dict(os.environ)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", script, device, str(seed)], env=env, capture_output=True, text=True,
                       timeout=300)
    print(r.stdout[-2000:], r.stderr[-2000:])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
