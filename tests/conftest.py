"""Test configuration: make the shared harness (tests/opcheck.py) importable; shared fixtures."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from opcheck import RNG_SEED


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with the suite's fixed seed."""
    return np.random.default_rng(RNG_SEED)
