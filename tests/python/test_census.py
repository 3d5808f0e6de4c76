"""The kernel census on metal-sim: its counts against what the problem's shape implies."""

import mfa_native
import pytest
from mfa_native import census

pytestmark = pytest.mark.skipif(
    "metal-sim" not in mfa_native.available_backends(), reason="metal-sim is not built"
)


def test_forward_and_backward_counts_follow_the_shape():
    # n fills the 128-key blocks of both plans, so no staged row is padding.
    n, d = 128, 32
    rows = census.census(["apple7", "apple9"], ["float16"], [d], sequence=n)
    by_kernel = {(r["family"], r["kernel"]): r for r in rows}
    kernels = {"forward", "backward-query", "backward-key-value"}
    assert {kernel for _, kernel in by_kernel} == kernels
    for row in rows:
        # The 8x8x8 products cover at least the useful FMAs (more where blocks are padded).
        assert row["products_per_useful"] >= 1.0
        assert set(row["multiplies"]) <= {"float*float", "half*half", "bfloat*bfloat"}
    fmas = n * n * 2 * d
    # K and V, n x d of 2-byte elements each.
    key_value_bytes = 2 * n * d * 2
    for family in ("apple7", "apple9"):
        forward = by_kernel[(family, "forward")]
        # The forward reads Q, K and V at least once and writes O and the f32 L.
        least_device_bytes = 3 * n * d * 2 + n * d * 2 + n * 4
        assert forward["device_bytes_per_fma"] >= least_device_bytes / fmas
    staged = by_kernel[("apple7", "forward")]
    # Apple7 stages K and V: written once and read at least once, as 16-bit elements. Each
    # simdgroup reads a staged element once per 8 of its FMAs: f32 tiles would read 4 bytes per
    # 8 FMAs (0.5 per FMA) for that alone.
    assert 2 * key_value_bytes / fmas <= staged["threadgroup_bytes_per_fma"] < 0.5
    assert staged["barriers_per_block"] > 0
    # Apple9 reads every operand from device memory, the cached ones included: no kernel stages
    # anything or waits at a barrier.
    for kernel in kernels:
        direct = by_kernel[("apple9", kernel)]
        assert direct["threadgroup_bytes_per_fma"] == 0
        assert direct["barriers_per_block"] == 0


def test_staging_moves_vectors():
    # The census's operands are contiguous and aligned, so Apple7 stages their 16-bit elements
    # four to a load and a store: the device traffic then averages more than 4 bytes an access.
    # Element by element it would average less (2-byte staging loads outnumber the rest).
    rows = census.census(["apple7"], ["float16"], [32], sequence=128)
    for row in rows:
        assert row["device_bytes_per_fma"] > 4 * row["device_accesses_per_fma"], row["kernel"]


def test_table_names_every_row_and_the_peers():
    rows = census.census(["apple7"], ["float32"], [64], sequence=32)
    table = census.format_table(rows)
    assert table.count("| apple7 | float32 | 64 |") == 3
    assert "MFA 0.31" in table


def test_bad_sequence():
    with pytest.raises(ValueError, match="sequence"):
        census.census(sequence=0)
