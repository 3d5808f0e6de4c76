"""Fixtures shared by the Python tests.

The tests import the installed ``mfa_native`` (``pip install .``), or, with ``PYTHONPATH=python``
and ``MFA_LIBRARY=<build>/libmfa.so``, the source tree over a CMake build.
"""

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id, so each test sees fixed but distinct inputs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
