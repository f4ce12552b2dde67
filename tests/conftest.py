"""Test configuration: make the shared harness (tests/opcheck.py) importable."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
