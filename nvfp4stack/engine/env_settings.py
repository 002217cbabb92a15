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
