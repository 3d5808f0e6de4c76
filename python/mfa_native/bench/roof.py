"""The machine's roofs, measured in the same run as the benchmark, and each result's fraction.

Three probes of the small native library mfa_probes (native/src/probes; mfa_probes.h says the
method, each kernel's source the details), loaded with cffi in ABI mode from its own header:

fma_f32
    float32 FMA throughput in GFLOP/s: independent chains of the widest FMA instruction the CPU
    has (AVX-512, AVX2, NEON), no memory access, on every benchmark thread at once.
dot_bf16
    bfloat16 dot-product throughput in GFLOP/s (AVX512_BF16 vdpbf16ps, Armv8.6 bfdot), where
    the CPU has such an instruction.
read
    streaming read bandwidth in GB/s, over a buffer several times the last-level cache, in
    transparent huge pages on Linux (as numpy's large arrays are: with 4 KiB pages the
    prefetchers stop at every page and the probe would read slower than k and v are read).

The benchmark measures them before and after its cases; each roof is the best trial of both
(what the machine reaches when nothing disturbs it), with each measurement's median beside it
to show how steady the machine was. A result's roof is
the roofline's bound for its arithmetic intensity: the smaller of the compute roof of its dtype
(bf16: the dot-product roof where there is one; f32 and f16: the FMA roof) and the bandwidth
times its FLOPs per byte of compulsory traffic (``Case.bytes``). Decoding (few query rows
against a long cache) is bound by bandwidth, prefill by compute; the report says which.
"""

import dataclasses
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import cffi

from mfa_native import _library

__all__ = ["Roof", "measure", "combine", "bound", "reader", "RoofUnavailable"]

_NAMES = {"darwin": "libmfa_probes.dylib", "win32": "mfa_probes.dll"}
# Per trial: long enough to see the clock settle, short enough that all three take about a
# second. The read buffer is 256 MiB: eight times this project's 32 MiB L3, and more than the
# system-level cache of any Apple chip.
_TRIALS = 5
_SECONDS = 0.05
_READ_BYTES = 256 * 2**20
UNITS = {"fma_f32": "GFLOP/s", "dot_bf16": "GFLOP/s", "read": "GB/s"}
# The table's short names of the roofs.
SHORT = {"fma_f32": "fma", "dot_bf16": "bf16", "read": "bw"}


class RoofUnavailable(RuntimeError):
    """The probes library cannot be found or loaded beside this libmfa."""


@dataclass(frozen=True)
class Roof:
    name: str  # a key of UNITS
    rate: float  # best trial
    medians: tuple  # each measurement's median trial
    unit: str
    isa: str
    method: str
    threads: int
    trials: int

    def as_dict(self):
        return asdict(self)


def _header():
    for candidate in (
        Path(_library.header_path).parent / "mfa_probes.h",  # in the wheel, beside mfa.h
        Path(__file__).resolve().parents[3] / "native" / "src" / "probes" / "mfa_probes.h",
    ):
        if candidate.is_file():
            return candidate
    raise RoofUnavailable("no mfa_probes.h beside mfa.h or in the source tree")


def _load():
    library = Path(_library.library_path).parent / _NAMES.get(sys.platform, "libmfa_probes.so")
    if not library.is_file():
        raise RoofUnavailable(f"no {library.name} beside {_library.library_path}")
    ffi = cffi.FFI()
    ffi.cdef(_library.cdef_from_header(_header().read_text(encoding="utf-8")))
    try:
        return ffi, ffi.dlopen(str(library))
    except OSError as error:
        raise RoofUnavailable(f"cannot load {library}: {error}") from error


def _probes():
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded


_loaded = None


def measure(threads):
    """{name: Roof} for the probes that run on this machine, and {name: reason} for those that
    do not (a CPU without a bf16 dot product). Raises RoofUnavailable without the library."""
    ffi, lib = _probes()
    calls = {
        "fma_f32": lambda r: lib.mfa_probe_fma_f32(threads, _TRIALS, _SECONDS, r),
        "dot_bf16": lambda r: lib.mfa_probe_dot_bf16(threads, _TRIALS, _SECONDS, r),
        "read": lambda r: lib.mfa_probe_read(threads, _TRIALS, 2 * _SECONDS, _READ_BYTES, r),
    }
    roofs, missing = {}, {}
    for name, call in calls.items():
        result = ffi.new("mfa_probe_result*")
        status = call(result)
        method = ffi.string(result.method).decode()
        if status == lib.MFA_PROBE_UNSUPPORTED:
            missing[name] = method
            continue
        if status != lib.MFA_PROBE_OK:
            raise RoofUnavailable(f"the {name} probe failed: {method}")
        if name == "read":
            pages = ", transparent huge pages asked for" if sys.platform.startswith("linux") else ""
            method += f"; {_READ_BYTES // 2**20} MiB{pages}"
        roofs[name] = Roof(
            name,
            result.rate,
            (result.median_rate,),
            UNITS[name],
            ffi.string(result.isa).decode(),
            method,
            result.threads,
            result.trials,
        )
    return roofs, missing


def combine(*measurements):
    """{name: Roof} of several measurements in one run: the best trial of all, every
    measurement's median."""
    roofs = {}
    for measured in measurements:
        for name, r in measured.items():
            seen = roofs.get(name)
            roofs[name] = (
                r
                if seen is None
                else dataclasses.replace(
                    seen,
                    rate=max(seen.rate, r.rate),
                    medians=seen.medians + r.medians,
                    trials=seen.trials + r.trials,
                )
            )
    return roofs


def self_check():
    """The probes' kernels on small inputs, for the tests: (fma sum, fma lanes), (dot sum, dot
    lanes), and a function computing the read kernel's sum of a numpy array."""
    ffi, lib = _probes()
    lanes = ffi.new("int*")

    def fma(iterations, multiplier, addend):
        total = lib.mfa_probe_fma_f32_sum(iterations, multiplier, addend, lanes)
        return total, lanes[0]

    def dot(iterations, a_pair, b_pair):
        total = lib.mfa_probe_dot_bf16_sum(iterations, a_pair, b_pair, lanes)
        return total, lanes[0]

    def read(array):
        total = ffi.new("uint64_t*")
        status = lib.mfa_probe_read_sum(ffi.from_buffer(array), array.nbytes, total)
        if status != lib.MFA_PROBE_OK:
            raise ValueError("mfa_probe_read_sum: size or alignment not accepted")
        return total[0]

    return fma, dot, read, lib.MFA_PROBE_READ_BLOCK


def reader(arrays, threads):
    """(read, bytes): read() streams the bytes of the arrays once, on `threads` threads at once
    (each array split into one slice per thread, thread t reading slice t of every array), with
    the read probe's loop, and returns the 64-bit wrapping sum of the words it read (for the
    tests); bytes is what it reads: of each array its 64-byte-aligned whole blocks, all but
    less than 64 + threads * MFA_PROBE_READ_BLOCK bytes. The decode study times it beside mfa's
    calls, so that the bandwidth mfa reaches is compared with a read of the very bytes it
    reads, in the same minute. Raises RoofUnavailable without the probes library."""
    ffi, lib = _probes()
    block = lib.MFA_PROBE_READ_BLOCK
    slices = []
    for array in arrays:
        start = -array.ctypes.data % 64
        usable = (array.nbytes - start) // (block * threads) * block
        base = ffi.cast("const char*", array.ctypes.data) + start
        slices += [(base + t * usable, usable) for t in range(threads) if usable]
    by_thread = [slices[t::threads] for t in range(threads)]
    sums = ffi.new("uint64_t[]", threads)
    pool = ThreadPoolExecutor(threads)

    def read_slices(t):
        total = 0
        for data, size in by_thread[t]:
            lib.mfa_probe_read_sum(data, size, sums + t)  # cffi releases the GIL around it
            total += sums[t]
        return total

    def read():
        # The closure holds the arrays, into which the slices point.
        return sum(pool.map(read_slices, range(threads))) % 2**64 if arrays else 0

    weakref.finalize(read, pool.shutdown, wait=False)
    return read, sum(size for _, size in slices)


def bound(case, which, roofs):
    """(roof name, attainable GFLOP/s) of one result: the roofline's bound at the case's
    arithmetic intensity; None where the roofs needed were not measured."""
    compute = roofs.get("dot_bf16") if case.dtype == "bf16" else None
    compute = compute or roofs.get("fma_f32")
    if compute is None:
        return None
    read = roofs.get("read")
    if read is not None:
        memory_bound = read.rate * case.flops(which) / case.bytes(which)
        if memory_bound < compute.rate:
            return read.name, memory_bound
    return compute.name, compute.rate
