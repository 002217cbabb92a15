"""For the GPU tests of the DeepGEMM warm-up: vLLM 0.26's DeepGEMM on a cold cache, and calls in fresh processes
(DeepGEMM reads its cache directory once a process, so a check of what a call compiles needs its own process)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def cold_cache(tmp_path: Path, monkeypatch) -> None:
    """Skip unless vLLM 0.26 with a DeepGEMM this GPU runs; point DeepGEMM's cache (children's too) at tmp_path."""
    vllm = pytest.importorskip("vllm")
    if not vllm.__version__.startswith("0.26"):
        pytest.skip(f"vLLM {vllm.__version__}: the warm-up extends vLLM 0.26's only")
    from vllm.utils.deep_gemm import is_deep_gemm_supported

    if not is_deep_gemm_supported():
        pytest.skip("DeepGEMM is not supported on this GPU or build")
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path))


def kernel_dirs(cache: Path) -> set[str]:
    """The kernels DeepGEMM has compiled into ``cache`` (one directory each)."""
    d = cache / "cache"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def run_fresh(code: str, *args) -> None:
    """``code`` in a fresh Python process (the environment as it is now), which must succeed."""
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
