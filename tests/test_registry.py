import pytest

from nvfp4stack.registry import Registry


def test_register_get_names_and_alias():
    reg: Registry[type] = Registry("widget")

    @reg.register("b")
    class B:
        pass

    @reg.register("a")
    class A:
        pass

    reg.alias("alpha", "a")
    assert reg.get("a") is A and reg.get("alpha") is A and A.name == "a"
    assert reg.names() == ["a", "b"]
    assert "alpha" in reg and "zzz" not in reg


def test_unknown_name_lists_valid_ones_and_aliases():
    reg: Registry[type] = Registry("widget")
    reg.register("a")(type("A", (), {}))
    reg.alias("alpha", "a")
    with pytest.raises(KeyError, match=r"unknown widget 'nope'; valid widgets: a \(alias alpha\)"):
        reg.get("nope")
    with pytest.raises(KeyError, match=r"valid widgets: a \(alias alpha\); did you mean alpha\?"):
        reg.get("alpah")


def test_double_registration_is_refused():
    reg: Registry[type] = Registry("widget")
    reg.register("a")(type("A", (), {}))
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(type("A2", (), {}))
