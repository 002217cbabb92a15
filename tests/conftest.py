"""Fresh random seed per test, printed so a failure can be replayed (pytest -s shows it)."""
import pytest

from nvfp4stack.formats.testing import fresh_seed, random_weights


@pytest.fixture
def seed() -> int:
    return fresh_seed()


@pytest.fixture
def make_weights():
    return random_weights


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    """The tiny DeepSeek-V4 (all layouts), built once per test session (layout_dir(root, ...))."""
    from nvfp4stack.models.tiny_dsv4 import build_tiny_dsv4

    return build_tiny_dsv4(tmp_path_factory.getbasetemp() / "tiny_dsv4_cache", seed=0)
