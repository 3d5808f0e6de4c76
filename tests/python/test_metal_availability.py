"""Whether this run covers the Metal backend, said out loud.

The numeric suites run on every backend in mfa_native.available_backends(); where metal is not
among them they have no metal cases at all. This test makes that visible: on a Mac it fails when
libmfa was built without the Metal backend, and skips, with the library's own reason, when the
backend is built but the machine has no usable GPU (GitHub's macOS runners expose a paravirtual
device below Apple7)."""

import sys

import mfa_native
import pytest


@pytest.mark.skipif(sys.platform != "darwin", reason="the Metal backend exists on macOS only")
def test_metal_backend_runs_here_or_says_why_not():
    try:
        context = mfa_native.Context("metal")
    except mfa_native.MFAError as error:
        assert error.status_name == "BACKEND_UNAVAILABLE", error
        assert "built but not usable" in error.message, f"a macOS libmfa lacks metal: {error}"
        pytest.skip(f"the metal backend's tests do not run here: {error.message}")
    with context:
        assert context.backend == "metal"
        assert context.capabilities["gpu_family"] in ("apple7", "apple8", "apple9")
    assert "metal" in mfa_native.available_backends()
