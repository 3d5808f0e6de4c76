"""mfa_native._measure: the time and memory that the demo and the benchmark report of a call."""

import builtins

import numpy as np
import pytest
from mfa_native import _measure
from mfa_native.bench import timing

# 64 MiB: above glibc's largest mmap threshold (32 MiB), so the array is always fresh memory
# that filling it makes resident, never a block the allocator already holds.
_LENGTH = 2**23


def test_a_call_costs_its_time_its_traced_arrays_and_its_resident_rise():
    result, cost = _measure.measure(lambda: np.ones(_LENGTH))
    assert result.shape == (_LENGTH,)
    assert cost.seconds > 0
    assert cost.traced_peak_bytes >= result.nbytes
    if cost.resident_rise_bytes is None:
        pytest.skip("the resident-set high-water mark cannot be reset here")
    assert cost.resident_rise_bytes >= result.nbytes


def test_without_proc_there_is_no_resident_rise_and_the_benchmark_skips_its_call(monkeypatch):
    # As on macOS: no /proc, so the high-water mark cannot be reset.
    def open_without_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(_measure, "open", open_without_proc, raising=False)

    result, cost = _measure.measure(lambda: np.ones(4))
    assert cost.resident_rise_bytes is None and cost.traced_peak_bytes >= result.nbytes
    calls = []
    assert timing.peak_extra_bytes(lambda: calls.append(1)) is None
    assert calls == []
