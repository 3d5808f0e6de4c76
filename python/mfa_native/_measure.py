"""Time and peak memory of one call: the measurements of ``python -m mfa_native demo`` and
``python -m mfa_native bench``.

What the numbers mean:

seconds
    wall time of the call (``time.perf_counter``).
traced peak
    tracemalloc's peak during the call: memory allocated through Python's allocators, which
    includes numpy's array buffers (numpy reports them to tracemalloc), outputs included.
    Allocations made directly in C (libmfa's own, BLAS workspaces, torch, MLX) are invisible
    to it. Works on every platform.
resident rise
    how far the process's resident set rose, at its highest during the call, above its size at
    the start: Linux's VmHWM after resetting it through /proc/self/clear_refs, minus VmRSS
    at the start (both read from /proc/self/status). It sees every allocation that touches
    memory, native ones included; freed heap memory is returned to the OS before the call, so
    that what the allocator kept from earlier calls does not hide the peak. None where the
    high-water mark cannot be reset: on macOS and everywhere else without /proc, and on Linux
    where clear_refs is not writable. The portable
    high-water mark, ``resource.getrusage``'s ``ru_maxrss`` (KiB on Linux, bytes on macOS),
    is no substitute: it cannot be reset, so it would report the largest peak of all the
    earlier work in the process rather than this call's.
"""

import ctypes
import gc
import sys
import time
import tracemalloc
from typing import NamedTuple, Optional


class Cost(NamedTuple):
    """What one call cost; see the module docstring for each number."""

    seconds: float
    traced_peak_bytes: int
    resident_rise_bytes: Optional[int]


def measure(function):
    """Call function() once; return (its result, its Cost).

    tracemalloc runs during the call: it slows Python-level allocation and its own records
    occupy memory that the resident rise includes, small beside arrays of a few MiB or more.
    """
    baseline = reset_resident_peak()
    tracemalloc.start()
    start = time.perf_counter()
    result = function()
    seconds = time.perf_counter() - start
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, Cost(seconds, traced_peak, resident_rise(baseline))


def reset_resident_peak():
    """Collect garbage, return freed heap memory to the OS, then reset the resident-set
    high-water mark: the resident bytes now, the baseline of resident_rise, or None where the
    mark cannot be reset."""
    gc.collect()
    _return_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return _status_kib("VmRSS") * 1024
    except OSError:
        return None


def resident_rise(baseline):
    """The highest resident bytes since reset_resident_peak() minus its baseline; None for a
    baseline of None."""
    return None if baseline is None else _status_kib("VmHWM") * 1024 - baseline


def _return_free_memory():
    """glibc's malloc_trim(0): give the pages of freed heap blocks back to the OS, in every
    arena. Without it, memory that the allocator kept after earlier frees (glibc raises its
    mmap threshold after large frees, so large blocks come to be recycled from the heap) is
    already resident and hides the next call's peak. It changes no allocator setting: the next
    allocations behave as before, they only fault their pages in again. No effect elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


def _status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")
