"""Fresh random seed per test, printed so a failure can be replayed (pytest -s shows it)."""
import pytest

from nvfp4stack.formats.testing import fresh_seed, random_weights


@pytest.fixture
def seed() -> int:
    return fresh_seed()


@pytest.fixture
def make_weights():
    return random_weights
