import pytest
import torch

from nvfp4stack.arch import KNOWN_ARCHS, detect, resolve


def test_known_archs_are_consistent():
    assert resolve("cpu").is_cuda is False
    assert resolve("sm90").sm == 90 and resolve("sm100a").family == "a"
    assert resolve("sm100f").family == "f"
    assert resolve("sm103a").at_least(10, 0) and not resolve("sm90").at_least(10, 0)
    assert set(KNOWN_ARCHS) >= {"cpu", "sm80", "sm90", "sm100a", "sm103a", "sm120"}


def test_unknown_arch_lists_valid_names():
    with pytest.raises(ValueError, match="arch='sm99' is not known; valid: auto, cpu"):
        resolve("sm99")


def test_auto_detects_this_host():
    arch = resolve("auto")
    if torch.cuda.is_available():
        assert arch.capability == torch.cuda.get_device_capability(0)
    else:
        assert arch == detect() == KNOWN_ARCHS["cpu"]
