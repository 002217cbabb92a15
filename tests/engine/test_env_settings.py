"""nvfp4stack/engine/env_settings.py: whole-number settings from the environment."""
import logging

from nvfp4stack.engine.env_settings import env_int


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
