"""Skip reasons of the AMX / no-AMX test pairs are true for the host they run on (issue #38: one
said "needs a host with AMX" on a host that has AMX)."""
from __future__ import annotations

import pytest

from tests.support.amx import amx_run_skip_reason, mode_comparison_skip_reason


@pytest.mark.parametrize("vllm,amx,start", [
    (True, True, None),
    (True, False, "host has no AMX:"),
    (False, True, "vLLM is not installed: the AMX kernel path is vLLM's (the host has AMX)"),
    (False, False, "vLLM is not installed: the AMX kernel path is vLLM's (the host has no AMX either)"),
])
def test_amx_run_reason_matches_the_host(vllm, amx, start):
    why = amx_run_skip_reason(vllm=vllm, amx=amx)
    if start is None:
        assert why is None
    else:
        assert why.startswith(start), why
        assert ("no AMX" in why) == (not amx), why


@pytest.mark.parametrize("amx", [True, False])
@pytest.mark.parametrize("mode,seen", [("no_amx", {"no_amx"}), ("amx", {"amx"})])
def test_comparison_reason_never_denies_a_present_amx(amx, mode, seen):
    why = mode_comparison_skip_reason(mode, seen, amx=amx)
    assert why, (mode, seen, amx)
    assert why.startswith("host has AMX") if amx else why.startswith("host has no AMX")
    assert "needs a host with AMX" not in why


def test_both_modes_recorded_compares():
    assert mode_comparison_skip_reason("amx", {"no_amx", "amx"}, amx=True) is None


def test_reasons_for_this_host_are_true():
    from nvfp4stack.models.deepseek_v4.load_check import host_has_amx, vllm_importable

    why = amx_run_skip_reason()
    if host_has_amx():
        assert why is None or why.startswith("vLLM is not installed"), why
    else:
        assert why is not None and "no AMX" in why
    assert (why is None) == (vllm_importable() and host_has_amx())
