import pytest

from nvfp4stack.plan.rules import PrecisionRule, first_match, target_matches


def test_target_forms():
    n, r = "layers.3.attn.wo_a", "attn.wo_a"
    assert target_matches("attn.wo_a", n, r, False)          # role
    assert target_matches("attn", n, r, False)               # role subtree
    assert target_matches(n, n, r, False)                    # exact name
    assert target_matches("re:layers\\.[0-4]\\.", n, r, False)
    assert target_matches("layers.*.attn.wo_*", n, r, False)  # glob
    assert not target_matches("attn.wo_b", n, r, False)
    assert target_matches("mtp", "mtp.0.attn.wo_a", r, True)
    assert not target_matches("mtp", n, r, False)


def test_ignore_wins_and_first_rule_wins():
    rules = [
        PrecisionRule(targets=["routed_experts"], ignore=["re:^layers\\.0\\."], scheme="nvfp4"),
        PrecisionRule(targets=["re:.*"], scheme="bf16"),
    ]
    assert first_match(rules, "layers.1.ffn.experts.0.w1", "routed_experts", False).scheme == "nvfp4"
    assert first_match(rules, "layers.0.ffn.experts.0.w1", "routed_experts", False).scheme == "bf16"


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="has no targets"):
        PrecisionRule(targets=[], scheme="bf16")
    with pytest.raises(ValueError, match="unknown scheme 'fp6'"):
        PrecisionRule(targets=["embed"], scheme="fp6")


def test_an_invalid_regex_names_the_target():
    with pytest.raises(ValueError, match=r"precision.rules: target 're:\^layers\\.\(1' is not a valid regex "
                                         r"\(missing \), unterminated subpattern"):
        PrecisionRule(targets=["re:^layers\\.(1"], scheme="bf16")
    with pytest.raises(ValueError, match="target 're:\\[0-' is not a valid regex"):
        PrecisionRule(targets=["embed"], ignore=["re:[0-"], scheme="bf16")
