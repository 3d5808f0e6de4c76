"""The roof probes (native/src/probes, mfa_native.bench.roof): the kernels compute what their
sources say, the instruction set chosen matches what the CPU reports, and each result gets the
roofline's bound. No test asserts on a rate beyond its being positive."""

import platform
import sys

import mfa_native
import numpy as np
import pytest
from mfa_native.bench import roof
from mfa_native.bench.cases import Case

try:
    roof.self_check()
except roof.RoofUnavailable as error:  # a libmfa built without the probes beside it
    pytest.skip(f"no roof probes: {error}", allow_module_level=True)


def _cpu_flags():
    """The CPU's feature flags as Linux reports them, or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    return None


def test_the_fma_kernel_computes_its_closed_form():
    fma, _, _, _ = roof.self_check()
    # Every lane: 0 -> fma(lane, 1, 2^-20), 1000 times, exactly 1000 * 2^-20 (well inside f32's
    # 24 bits); the sum of the lanes is exact too (equal powers-of-two multiples).
    total, lanes = fma(1000, 1.0, 2.0**-20)
    assert lanes >= 4 and total == lanes * 1000 * 2.0**-20
    # A multiplier other than 1 is used, not folded away: lane_n = 0.5 * lane_{n-1} + 1 -> 2.
    total, lanes = fma(200, 0.5, 1.0)
    assert total == lanes * 2.0


def test_the_bf16_kernel_adds_both_products_of_each_pair():
    _, dot, _, _ = roof.self_check()
    one, half, quarter = 0x3F80, 0x3F00, 0x3E80  # bf16 bit patterns of 1, 0.5, 0.25
    total, lanes = dot(1000, one | half << 16, quarter | one << 16)  # 1*0.25 + 0.5*1 per lane
    if lanes == 0:
        pytest.skip("this CPU has no bf16 dot product")
    assert total == lanes * 1000 * 0.75


def test_the_read_kernel_sums_every_word():
    _, _, read, block = roof.self_check()
    # 8 blocks in page-aligned memory (float32 storage viewed as 64-bit words).
    words = mfa_native.empty((2 * block,), np.float32).view(np.uint64)
    words[...] = np.random.default_rng(3).integers(0, 2**64, words.size, dtype=np.uint64)
    assert read(words) == int(words.sum(dtype=np.uint64))  # both wrap modulo 2^64
    with pytest.raises(ValueError, match="size or alignment"):
        read(words[:-1])


def test_the_reader_streams_every_thread_slice_of_the_arrays_once():
    # Offsets of 8 bytes into 64-byte lines, and sizes that are no multiple of a block: the
    # reader reads from each array's first aligned line as many whole blocks as divide evenly
    # between the threads, and its sum is theirs (numpy's, wrapping at 2^64).
    block = roof.self_check()[3]
    rng = np.random.default_rng(5)
    buffers = [rng.integers(0, 2**63, size, dtype=np.uint64) for size in (9000, 4100, 70)]
    arrays = [buffer[1:] for buffer in buffers]
    for threads in (1, 2, 3):
        read, count = roof.reader(arrays, threads)
        expected, expected_bytes = 0, 0
        for array in arrays:
            start = -array.ctypes.data % 64
            usable = (array.nbytes - start) // (block * threads) * block
            words = array[start // 8 : (start + threads * usable) // 8]
            expected += int(words.sum(dtype=np.uint64))
            expected_bytes += threads * usable
        assert count == expected_bytes and count > 0
        assert read() == expected % 2**64 and read() == expected % 2**64


def test_the_bf16_probe_runs_exactly_where_the_cpu_has_the_instruction():
    roofs, missing = roof.measure(1)
    flags = _cpu_flags()
    assert set(roofs) | set(missing) == {"fma_f32", "dot_bf16", "read"}
    assert "fma_f32" in roofs and "read" in roofs
    if flags is not None and platform.machine() in ("x86_64", "AMD64"):
        assert ("dot_bf16" in roofs) == ("avx512_bf16" in flags)
        assert roofs["fma_f32"].isa == ("avx512" if "avx512f" in flags else "avx2")
    elif flags is not None and platform.machine() in ("aarch64", "arm64"):
        assert ("dot_bf16" in roofs) == ("bf16" in flags)
    for r in roofs.values():
        assert r.rate > 0 and r.medians[0] > 0 and r.threads == 1 and r.trials == 5
        assert r.method and r.unit == roof.UNITS[r.name]
    if "dot_bf16" in missing:
        assert "dot product" in missing["dot_bf16"]


def test_probes_refuse_bad_arguments():
    ffi, lib = roof._probes()
    result = ffi.new("mfa_probe_result*")
    assert lib.mfa_probe_fma_f32(0, 5, 0.05, result) == lib.MFA_PROBE_FAILED
    assert b"threads" in ffi.string(result.method) and result.rate == 0
    assert lib.mfa_probe_read(2, 5, 0.05, 100, result) == lib.MFA_PROBE_FAILED
    assert b"bytes" in ffi.string(result.method)
    assert lib.mfa_probe_fma_f32(1, 5, 0.0, result) == lib.MFA_PROBE_FAILED


def _roof(name, rate, median=None):
    return roof.Roof(name, rate, (median or rate,), roof.UNITS[name], "test", "test", 1, 5)


def test_roofs_of_two_measurements_keep_the_best_trial_and_both_medians():
    before = {"fma_f32": _roof("fma_f32", 200.0, 190.0), "read": _roof("read", 30.0)}
    after = {"fma_f32": _roof("fma_f32", 210.0, 150.0), "read": _roof("read", 20.0)}
    combined = roof.combine(before, after)
    assert combined["fma_f32"].rate == 210.0 and combined["fma_f32"].medians == (190.0, 150.0)
    assert combined["read"].rate == 30.0 and combined["read"].trials == 10
    assert roof.combine(before, {}) == before


def test_each_result_gets_the_roofline_bound_of_its_intensity():
    roofs = {
        "fma_f32": _roof("fma_f32", 200.0),
        "dot_bf16": _roof("dot_bf16", 400.0),
        "read": _roof("read", 40.0),
    }
    prefill = Case(1, 8, 2048, 128, "f32", False)
    assert roof.bound(prefill, "fwd", roofs) == ("fma_f32", 200.0)
    assert roof.bound(Case(1, 8, 2048, 128, "bf16", True), "fwd+bwd", roofs) == (
        "dot_bf16",
        400.0,
    )
    assert roof.bound(Case(1, 8, 2048, 128, "f16", False), "fwd", roofs)[0] == "fma_f32"
    decode = Case(1, 32, 1, 128, "bf16", kv_heads=8, seq_k=32768)
    name, attainable = roof.bound(decode, "fwd", roofs)
    # Bandwidth-bound: the GFLOP/s that reading its bytes at 40 GB/s allows.
    assert name == "read"
    assert attainable == pytest.approx(40.0 * decode.flops("fwd") / decode.bytes("fwd"))
    # Without a bf16 roof, bf16 is held to the FMA roof; without any, there is no bound.
    assert roof.bound(prefill, "fwd", {"fma_f32": roofs["fma_f32"]}) == ("fma_f32", 200.0)
    assert roof.bound(prefill, "fwd", {}) is None
