"""nvfp4stack/config.py: model.source_format is a generic format or one the model's family declares."""
import pytest

from nvfp4stack.config import ModelConfig
from nvfp4stack.families.capabilities import GENERIC_SOURCE_FORMATS
from nvfp4stack.families.family import ModelFamily
from nvfp4stack.families.registry import get_family


def test_generic_and_family_source_formats():
    assert GENERIC_SOURCE_FORMATS == ("bf16", "modelopt")
    assert ModelFamily().accepted_source_formats == ("bf16", "modelopt")
    assert get_family("deepseek_v4").accepted_source_formats == ("bf16", "modelopt", "official")
    assert get_family("qwen3_moe").accepted_source_formats == ("bf16", "modelopt")
    assert get_family("deepseek_v3").accepted_source_formats == ("bf16", "modelopt")


@pytest.mark.parametrize("family,fmt", [("deepseek_v4", "official"), ("deepseek_v4", "modelopt"),
                                        ("qwen3_moe", "bf16"), ("deepseek_v3", "modelopt")])
def test_accepted_source_format(family, fmt):
    assert ModelConfig(name="m", family=family, factory="f", source_format=fmt).source_format == fmt


def test_a_source_format_the_family_does_not_declare_is_refused():
    with pytest.raises(ValueError) as e:
        ModelConfig(name="m", family="qwen3_moe", factory="f", source_format="official")
    msg = str(e.value)
    assert "model.source_format='official'" in msg and "'qwen3_moe'" in msg            # key, found
    assert "expected one of bf16, modelopt" in msg and "Fix: set model.source_format=bf16" in msg
    with pytest.raises(ValueError, match="expected one of bf16, modelopt, official, found 'fp8'"):
        ModelConfig(name="m", family="deepseek_v4", factory="f", source_format="fp8")


def test_a_negative_runtime_reserve_names_the_key_and_the_fix():
    from nvfp4stack.config import ArchConfig

    assert ArchConfig(name="sm90", runtime_reserve_gb=5.0).runtime_reserve_gb == 5.0
    with pytest.raises(ValueError, match=r"arch.runtime_reserve_gb=-1.0: expected GB >= 0 .* Fix: set it to 0"):
        ArchConfig(name="sm90", runtime_reserve_gb=-1.0)
