import pytest

from nvfp4stack.schemes import Scheme


def test_parse_and_bits():
    assert Scheme.parse("nvfp4") is Scheme.NVFP4
    assert Scheme.NVFP4.bits_per_weight == 4.5 and Scheme.MXFP4.bits_per_weight == 4.25
    assert Scheme.NVFP4_W4A16.is_nvfp4 and not Scheme.MXFP4.is_nvfp4


def test_unknown_scheme_names_where_and_lists_valid():
    with pytest.raises(ValueError, match=r"precision.x: unknown scheme 'int4'; valid: nvfp4, nvfp4_w4a16"):
        Scheme.parse("int4", where="precision.x")
