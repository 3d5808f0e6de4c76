"""f16 and bf16 stores round to nearest, ties to even (mfa.h), checked on results that fp32
arithmetic computes exactly (or nearly, for the backward), so that the rounding that matters
is the store's."""

import mfa_native
import numpy as np
import pytest
from _backends import BACKENDS, DTYPES

PARAMS = [
    pytest.param(backend, dtype, id=f"{backend.id}-{dtype}")
    for backend in BACKENDS
    for dtype in ("f16", "bf16")
]


def ties(exact, dtype):
    """Where `exact` lies halfway between two neighbours in dtype: the reflection 2 x - a of x
    about its rounded value a is then the other neighbour, and representable."""
    rounded = exact.astype(dtype).astype(np.float64)
    reflection = 2 * exact - rounded
    return (reflection != rounded) & (reflection.astype(dtype).astype(np.float64) == reflection)


@pytest.mark.parametrize("backend, dtype_name", PARAMS)
def test_low_precision_stores_round_to_nearest_even(backend, dtype_name):
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(7)
    num_keys = num_queries = 4
    # q = 0 makes every score 0, so each probability is exactly 1/4. Values in [1, 2) with the
    # dtype's significand add up exactly in fp32; their mean has two bits more than the dtype
    # holds, so a quarter of the means are ties.
    q = np.zeros((1, 1, num_queries, 8), dtype=dtype)
    k = rng.standard_normal((1, 1, num_keys, 8)).astype(dtype)
    v = (1 + rng.random((1, 1, num_keys, 64))).astype(dtype)
    dout = (1 + rng.random((1, 1, num_queries, 64))).astype(dtype)

    exact_out = np.broadcast_to(v.astype(np.float64).mean(axis=2, keepdims=True), dout.shape)
    # dv = P^T dout is the mean of dout's rows.
    exact_dv = np.broadcast_to(dout.astype(np.float64).mean(axis=2, keepdims=True), v.shape)
    assert ties(exact_out, dtype).any(), "no ties to test"

    context = backend.context()
    out, lse = mfa_native.attention(q, k, v, return_lse=True, backend=context)
    np.testing.assert_array_equal(
        out.astype(np.float64), exact_out.astype(dtype).astype(np.float64)
    )
    _, _, dv = mfa_native.attention_backward(dout, q, k, v, out, lse, backend=context)
    # The backward recomputes P from the stored fp32 lse, 1/4 only to within ~1e-7, which may
    # tip a tie either way but no other value past a midpoint (>= 1e-3 away).
    not_tie = ~ties(exact_dv, dtype)
    np.testing.assert_array_equal(
        dv.astype(np.float64)[not_tie], exact_dv.astype(dtype).astype(np.float64)[not_tie]
    )
