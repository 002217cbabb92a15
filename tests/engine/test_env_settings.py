"""nvfp4stack/engine/env_settings.py: whole-number settings from the environment."""
import logging

import torch

import nvfp4stack.convert.stream as stream
from nvfp4stack.engine.env_settings import cores_per_rank, env_int


def test_unset_empty_valid_and_bad_values(monkeypatch, caplog):
    monkeypatch.delenv("NVFP4STACK_TEST_N", raising=False)
    assert env_int("NVFP4STACK_TEST_N", 7, 1) == 7
    monkeypatch.setenv("NVFP4STACK_TEST_N", "")
    assert env_int("NVFP4STACK_TEST_N", 7, 1) == 7
    monkeypatch.setenv("NVFP4STACK_TEST_N", "3")
    assert env_int("NVFP4STACK_TEST_N", 7, 1) == 3
    monkeypatch.setenv("NVFP4STACK_TEST_N", "0")
    assert env_int("NVFP4STACK_TEST_N", 7, 0) == 0
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert env_int("NVFP4STACK_TEST_N", 7, 1) == 7            # below the least
        monkeypatch.setenv("NVFP4STACK_TEST_N", "two")
        assert env_int("NVFP4STACK_TEST_N", 7, 1) == 7            # not a number
    assert "NVFP4STACK_TEST_N='0': expected a whole number >= 1; using 7" in caplog.text
    assert "NVFP4STACK_TEST_N='two': expected a whole number >= 1; using 7" in caplog.text


def test_cores_per_rank_shares_the_cores_among_the_gpus_seen(monkeypatch):
    monkeypatch.setattr(stream, "usable_cores", lambda: 64)
    for gpus, want in ((0, 32), (1, 32), (2, 32), (4, 16), (8, 8)):   # at least two shares
        monkeypatch.setattr(torch.cuda, "device_count", lambda g=gpus: g)
        assert cores_per_rank() == want
    monkeypatch.setattr(stream, "usable_cores", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert cores_per_rank() == 1
