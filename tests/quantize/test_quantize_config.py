"""QuantizeConfig validation: errors name the key, what was expected and found."""
from __future__ import annotations

import pytest

from nvfp4stack.quantize.config import QuantizeConfig


def test_defaults_are_valid():
    q = QuantizeConfig()
    assert (q.method, q.export_format, q.mtp) == ("modelopt", "dsv4", "copy")


@pytest.mark.parametrize("kwargs, key", [
    ({"method": "gptq"}, "quantize.method"),
    ({"export_format": "gguf"}, "quantize.export_format"),
    ({"mtp": "drop"}, "quantize.mtp"),
    ({"method": "cast", "export_format": "hf_unified"}, "quantize.export_format"),
    ({"export_only": True, "validate_only": True}, "quantize.export_only"),
    ({"export_format": "hf_unified", "export_only": True}, "quantize.export_only"),
    ({"calib_samples": 0}, "quantize.calib_samples"),
    ({"calib_seq_len": -4}, "quantize.calib_seq_len"),
    ({"cast_input_amax": 0.0}, "quantize.cast_input_amax"),
])
def test_invalid_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as e:
        QuantizeConfig(**kwargs)
    assert "expected" in str(e.value) and "found" in str(e.value)
