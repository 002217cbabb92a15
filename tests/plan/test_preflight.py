from nvfp4stack.arch import resolve
from nvfp4stack.plan.preflight import host_mismatch, recipes_for_arch


def test_b200_recipe_on_a_cpu_host_is_one_clear_paragraph():
    msg = host_mismatch("dsv4_b200", "sm100a", host=resolve("cpu"))
    assert "planned for arch sm100a, but this host is cpu (no CUDA GPU)" in msg
    assert "tiny_cpu" in msg and "arch=cpu" in msg and "engine.dry_run=true" in msg
    assert "\n" not in msg


def test_matching_or_auto_arch_passes():
    assert host_mismatch("dsv4_h200", "sm90", host=resolve("sm90")) is None
    assert host_mismatch("x", "auto", host=resolve("sm80")) is None


def test_recipes_for_arch_reads_the_recipe_files():
    assert "dsv4_b200" in recipes_for_arch(resolve("sm100a"))
    assert "tiny_cpu" in recipes_for_arch(resolve("cpu"))
