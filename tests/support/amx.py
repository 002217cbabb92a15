"""Why a test of vLLM's CPU kernel paths with or without AMX cannot run on this host, in words that
are true for the host (issue #38: a skip said "needs a host with AMX" on a host that has AMX)."""
from __future__ import annotations

from nvfp4stack.models.deepseek_v4.load_check import host_has_amx, vllm_importable


def amx_run_skip_reason(vllm: bool | None = None, amx: bool | None = None) -> str | None:
    """None when the host's real AMX kernel path can run here, else why not (vLLM missing, or no AMX)."""
    vllm = vllm_importable() if vllm is None else vllm
    amx = host_has_amx() if amx is None else amx
    if not vllm:
        return "vLLM is not installed: the AMX kernel path is vLLM's (the host " + \
            ("has AMX)" if amx else "has no AMX either)")
    if not amx:
        return "host has no AMX: its real kernel path cannot run here (the no_amx run covers this host)"
    return None


def mode_comparison_skip_reason(mode: str, modes_seen: set[str], amx: bool | None = None) -> str | None:
    """None when both the no_amx and the amx runs have recorded; else why this run compares nothing.

    Args:
        mode: this run's mode, "no_amx" or "amx".
        modes_seen: the modes recorded so far in this session (this one included); pytest runs every
            no_amx instance of a module-scoped fixture before the amx ones.
    """
    if {"no_amx", "amx"} <= modes_seen:
        return None
    amx = host_has_amx() if amx is None else amx
    if not amx:
        return "host has no AMX: no amx run to compare the no_amx parameters with (the no_amx run covers this host)"
    if mode == "no_amx":
        return "host has AMX: this no_amx run records its parameters, and this test's amx run compares them"
    return "host has AMX, but this test's no_amx run recorded nothing in this session (deselected or failed)"
