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


@pytest.fixture(scope="session")
def default_server(trained_default, tmp_path_factory):
    """One `python main.py serve` of the embedded default, shared by the tests that only send it requests
    (tests/support/default_server.py); it starts on a test's first ``client()``."""
    pytest.importorskip("openai")
    pytest.importorskip("vllm")
    from tests.support.default_server import DefaultServer

    srv = DefaultServer(tmp_path_factory.mktemp("default_server"))
    yield srv
    srv.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "default_server_first: runs first of the tests on the shared default_server")
    config.addinivalue_line("markers", "default_server_last: runs last of the tests on the shared default_server "
                                       "(it stops the server)")


def pytest_collection_modifyitems(config, items):
    """The tests on the shared ``default_server`` run back to back, at the first one's place, so that it starts
    once and is stopped before the tests after them: no vLLM server of its own sits beside the ones other tests
    start (a 2-core CI host has little memory to spare). The one marked ``default_server_first`` (it measures
    against a server of its own, stopped before it asks for the shared one) runs first; the one marked
    ``default_server_last`` (it stops the shared server and checks the Ctrl-C) runs last."""
    users = [it for it in items if "default_server" in getattr(it, "fixturenames", ())]
    if len(users) < 2:
        return

    def rank(item) -> int:
        return 0 if item.get_closest_marker("default_server_first") else \
            2 if item.get_closest_marker("default_server_last") else 1

    first = items.index(users[0])
    rest = [it for it in items if "default_server" not in getattr(it, "fixturenames", ())]
    items[:] = rest[:first] + sorted(users, key=rank) + rest[first:]


def pytest_terminal_summary(terminalreporter):
    """List the README commands that tests/test_readme_commands.py ran (issue #12: CI shows them)."""
    import sys

    mods = [m for name, m in list(sys.modules.items()) if name.endswith("test_readme_commands")]
    ran = getattr(mods[0], "RAN", None) if mods else None
    if ran:
        terminalreporter.write_sep("-", f"README commands run ({len(ran)})")
        for line in ran:
            terminalreporter.write_line(f"  {line}")
