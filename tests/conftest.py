"""Fresh random seed per test, printed so a failure can be replayed (pytest -s shows it)."""
import pytest

from tests.support.numerics_data import fresh_seed, random_weights


@pytest.fixture
def seed() -> int:
    return fresh_seed()


@pytest.fixture
def make_weights():
    return random_weights


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    """The tiny DeepSeek-V4 (all layouts), built once per test session (layout_dir(root, ...))."""
    from nvfp4stack.models.deepseek_v4.tiny import build_tiny_dsv4

    return build_tiny_dsv4(tmp_path_factory.getbasetemp() / "tiny_dsv4_cache", seed=0)


@pytest.fixture(scope="session")
def trained_default():
    """The trained embedded default (tiny_v3) in the cache the tests' servers use (RootConfig's
    ``cache_dir``, ~/.cache/nvfp4stack under this HOME), through the factory `serve` uses.

    Server tests take this fixture so that a cold cache (CI, a fresh HOME) trains the default here,
    once per session and before any server's ready deadline starts, instead of inside the first
    `serve` (158 s on free cores, over 15 minutes when the cores are shared). Returns the model dir.
    """
    from nvfp4stack.config import RootConfig
    from nvfp4stack.families.registry import factories
    from nvfp4stack.families.resolve import cache_root

    return factories()["tiny_v3"](cache_root(RootConfig.cache_dir), "bf16")


def pytest_terminal_summary(terminalreporter):
    """List the README commands that tests/test_readme_commands.py ran (issue #12: CI shows them)."""
    import sys

    mods = [m for name, m in list(sys.modules.items()) if name.endswith("test_readme_commands")]
    ran = getattr(mods[0], "RAN", None) if mods else None
    if ran:
        terminalreporter.write_sep("-", f"README commands run ({len(ran)})")
        for line in ran:
            terminalreporter.write_line(f"  {line}")
