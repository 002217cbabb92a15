"""Whole-number settings read from the environment inside vLLM's processes (where no config reaches)."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.nvfp4stack")  # under vLLM's logger: its handlers, in the server log


def env_int(name: str, default: int, least: int) -> int:
    """``$name`` as a whole number of at least ``least``; ``default`` where it is unset or empty, and (with a
    warning naming the variable, what it expects, what it found and the value used) where it is not one."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        log.warning("nvfp4stack: %s=%r: expected a whole number >= %d; using %d", name, raw, least, default)
        return default
    return value


def cores_per_rank() -> int:
    """This process's usable cores shared among the GPUs it sees (one rank each, every rank busy at once in a
    warm-up; at least two shares), at least 1."""
    from nvfp4stack.convert.stream import usable_cores

    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:
        gpus = 0
    return max(1, usable_cores() // max(2, gpus))
