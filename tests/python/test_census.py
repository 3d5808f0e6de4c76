"""The kernel census on metal-sim: its counts against what the problem's shape implies."""

import mfa_native
import pytest
from mfa_native import census

pytestmark = pytest.mark.skipif(
    "metal-sim" not in mfa_native.available_backends(), reason="metal-sim is not built"
)


def test_forward_and_backward_counts_follow_the_shape():
    n, d = 64, 32
    rows = census.census(["apple9"], ["float16"], [d], sequence=n)
    by_kernel = {r["kernel"]: r for r in rows}
    assert set(by_kernel) == {"forward", "backward-query", "backward-key-value"}
    for row in rows:
        # The 8x8x8 products cover at least the useful FMAs (more where blocks are padded).
        assert row["products_per_useful"] >= 1.0
        assert set(row["multiplies"]) <= {"float*float", "half*half", "bfloat*bfloat"}
    forward = by_kernel["forward"]
    # The forward reads Q, K and V (2-byte elements) at least once and writes O and the f32 L.
    fmas = n * n * 2 * d
    least_device_bytes = 3 * n * d * 2 + n * d * 2 + n * 4
    assert forward["device_bytes_per_fma"] >= least_device_bytes / fmas
    # Staged operands pass through threadgroup memory: at least K and V, written once and read.
    assert forward["threadgroup_bytes_per_fma"] >= 2 * 2 * n * d / fmas
    assert forward["barriers_per_block"] > 0


def test_table_names_every_row_and_the_peers():
    rows = census.census(["apple7"], ["float32"], [64], sequence=32)
    table = census.format_table(rows)
    assert table.count("| apple7 | float32 | 64 |") == 3
    assert "MFA 0.31" in table


def test_bad_sequence():
    with pytest.raises(ValueError, match="sequence"):
        census.census(sequence=0)
