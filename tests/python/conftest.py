"""Fixtures shared by the Python tests.

The tests import the installed ``mfa_native`` (``pip install .``), or, with ``PYTHONPATH=python``
and ``MFA_LIBRARY=<build>/libmfa.so``, the source tree over a CMake build.
"""

import zlib

import numpy as np
import pytest
from _abi_reference import reference_backend
from _backends import REFERENCE


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id, so each test sees fixed but distinct inputs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _through_the_reference_where_asked(request):
    """Tests given the reference backend (_backends.FEATURE_BACKENDS) run their calls through
    it."""
    callspec = getattr(request.node, "callspec", None)
    backend = callspec.params.get("backend") if callspec is not None else None
    if getattr(backend, "name", None) == REFERENCE:
        with reference_backend():
            yield
    else:
        yield
