"""mfa_native.attention against the float64 reference, on every available backend, on the cases
of _cases.py and a few of its own."""

import _cases
import mfa_native
import numpy as np
import pytest
import reference
from _backends import (
    DTYPES,
    UNSHUFFLED_BACKENDS,
    Case,
    backend_only_params,
    backend_params,
    check_forward,
)

CASES = _cases.CASES + [
    Case(1000, 1000, 64, 64, causal=True),
    Case(129, 1000, 256, 192, query_heads=2, kv_heads=2, window=(100, 100)),
    Case(1000, 129, 512, 64, dtype="f16"),
    Case(33, 2, 256, 33, query_heads=4, kv_heads=4, causal=True, window=(0, -1), dtype="bf16"),
]

# The shared simulator cases reach every row of the planner's forward tables (f32: <= 8, 16,
# 24, 32, 48, 56, 192, 384 and beyond; 16-bit: <= 32, 96, 128, 160, 224, 384 and beyond).
SIMULATOR_CASES = _cases.SIMULATOR_CASES


@pytest.mark.parametrize("backend, case", backend_params(CASES, SIMULATOR_CASES))
def test_forward_matches_reference(backend, case):
    q, k, v = case.inputs(case.rng())
    out, lse = mfa_native.attention(
        q, k, v, **case.options, return_lse=True, backend=backend.context()
    )
    assert out.dtype == q.dtype and lse.dtype == np.float32
    check_forward(case, out, lse, q, k, v)


@pytest.mark.parametrize("backend", backend_only_params())
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_masks_hold_when_every_score_is_far_below_zero(backend, dtype):
    # Kernels may mask with a finite sentinel instead of -inf; visible scores around -3e4 must
    # still win over masked keys, and rows must not collapse to 0 or NaN.
    case = Case(40, 70, 16, 8, causal=True, window=(5, None), scale=1e3, dtype=dtype)
    rng = case.rng()
    q, k, v = case.inputs(rng)
    q, k = np.abs(q) + DTYPES[dtype].type(0.5), -np.abs(k) - DTYPES[dtype].type(0.5)
    out, lse = mfa_native.attention(
        q, k, v, **case.options, return_lse=True, backend=backend.context()
    )
    check_forward(case, out, lse, q, k, v)


@pytest.mark.parametrize("backend", backend_only_params(UNSHUFFLED_BACKENDS))
def test_forward_at_the_largest_advertised_head_dim(backend):
    context = backend.context()
    case = _cases.at_the_largest_head_dim(context)
    q, k, v = case.inputs(case.rng())
    out, lse = mfa_native.attention(q, k, v, **case.options, return_lse=True, backend=context)
    check_forward(case, out, lse, q, k, v)


@pytest.mark.parametrize("backend", backend_only_params())
def test_a_nan_key_makes_exactly_the_rows_that_see_it_nan(backend):
    # A NaN score must never become a finite probability, nor a hidden NaN score reach a row:
    # under the causal mask, key 200 of 300, past the first block of keys, is seen by rows 200..
    # only, whose running max is finite when it arrives, and those rows alone are NaN.
    case = Case(300, 300, 32, 32, causal=True)
    q, k, v = case.inputs(case.rng())
    k[0, 0, 200, 3] = np.nan
    out, lse = mfa_native.attention(
        q, k, v, causal=True, return_lse=True, backend=backend.context()
    )
    assert np.isnan(out[0, 0, 200:]).all() and np.isnan(lse[0, 0, 200:]).all()
    # The rows before it are those of the problem without the keys they do not see.
    first = Case(200, 200, 32, 32, causal=True)
    head = (slice(None), slice(None), slice(0, 200))
    check_forward(first, out[head], lse[head], q[head], k[head], v[head])


@pytest.mark.parametrize("backend", backend_only_params())
def test_rows_whose_scores_all_lie_below_minus_1e30_still_see_their_keys(backend):
    # Finite float32 scores of -1e30 .. -3e30 (q = 1, scale 1). Gaps of 1e30 dwarf float32
    # rounding (~1e23), so the softmax is exactly one-hot on key 0 and out must be its value.
    q = np.ones((1, 1, 2, 1), dtype=np.float32)
    k = np.array([-1e30, -3e30, -2e30], dtype=np.float32).reshape(1, 1, 3, 1)
    v = np.array([1.0, 2.0, 3.0], dtype=np.float32).reshape(1, 1, 3, 1)
    out, lse = mfa_native.attention(q, k, v, scale=1.0, return_lse=True, backend=backend.context())
    expected_out, expected_lse = reference.attention_forward(q, k, v, scale=1.0)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-6)
