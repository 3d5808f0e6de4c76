"""mfa_native.attention against the float64 reference, on every available backend.

The case lists are pairwise-style rather than a cartesian product: every sequence length, head
dimension, mask kind, head grouping and dtype appears, each next to several of the others.
Lengths and head dimensions are chosen off every block size (1, 7, 33, 129, D = 3, 33, 80...)
so that partial blocks are exercised, and D up to 512 forces head-dimension blocking.
"""

import numpy as np
import pytest

import mfa_native
import reference
from _backends import DTYPES, Case, backend_only_params, backend_params, check_forward

CASES = [
    Case(1, 1, 1, 1),
    Case(1, 1000, 64, 64, query_heads=4, kv_heads=1, causal=True, dtype="f16"),
    # Bottom-right causal with Nq > Nk: all but the last 7 rows see no key.
    Case(1000, 7, 8, 3, query_heads=2, kv_heads=2, causal=True, dtype="bf16"),
    Case(7, 129, 3, 8, query_heads=2, kv_heads=1, causal=True, causal_alignment="top_left"),
    Case(129, 64, 33, 80, query_heads=4, kv_heads=2, window=(16, 0), dtype="f16"),
    Case(64, 129, 80, 33, batch=2, window=(3, 5), causal_alignment="top_left", dtype="bf16"),
    Case(2, 7, 96, 128, query_heads=3, kv_heads=1, window=(0, 0)),
    Case(129, 129, 128, 96, query_heads=2, kv_heads=1, causal=True, dtype="bf16"),
    Case(1000, 1000, 64, 64, causal=True),
    # Top-left, keys only up to one step back: rows from 3 on see nothing.
    Case(7, 2, 192, 256, query_heads=2, kv_heads=2, window=(1, None), causal_alignment="top_left",
      dtype="f16"),
    Case(129, 1000, 256, 192, query_heads=2, kv_heads=2, window=(100, 100)),
    Case(64, 7, 512, 512, causal=True, causal_alignment="top_left", dtype="bf16"),
    Case(1000, 129, 512, 64, dtype="f16"),
    Case(2, 1, 33, 1, query_heads=2, kv_heads=1, scale=2.5),
    # A large scale makes the softmax peaky, so the running maximum matters.
    Case(129, 129, 64, 80, causal=True, window=(10, -1), scale=0.9, dtype="f16"),
    Case(1000, 64, 96, 80, window=(0, 2), causal_alignment="top_left", dtype="bf16"),
    Case(7, 7, 1, 3, batch=3, causal=True, scale=-0.5, dtype="f16"),
    Case(64, 1000, 192, 8, query_heads=4, kv_heads=2, window=(None, 10)),
    # Nearly one-hot rows: the running maximum changes late and exp underflows for most keys.
    Case(129, 1000, 64, 64, scale=3.0, dtype="bf16"),
    Case(1000, 129, 64, 48, batch=2, query_heads=6, kv_heads=2, causal=True,
         causal_alignment="top_left"),
    Case(17, 40, 40, 24, batch=5, query_heads=7, kv_heads=7, causal=True),
    Case(17, 40, 24, 40, batch=2, query_heads=16, kv_heads=1, window=(3, 3), dtype="f16"),
    Case(33, 2, 256, 33, query_heads=4, kv_heads=4, causal=True, window=(0, -1), dtype="bf16"),
]

# The simulator's grid follows the planner's block tables (native/src/planner/tables.c): head
# dimensions fall into every row of each family and precision class (f32: <= 8, 16, 24, 32, 48,
# 56, 192, 384 and beyond; 16-bit: <= 32, 96, 128, 160, 224, 384 and beyond), lengths are
# off the 16 / 32 row blocks and 32 / 64 / 128 column blocks, with one exact multiple.
SIMULATOR_CASES = [
    Case(1, 1, 1, 1),
    Case(7, 33, 12, 8, query_heads=2, kv_heads=2, window=(2, 2)),
    Case(64, 64, 28, 12, causal=True),
    Case(33, 129, 33, 80, window=(16, 0)),
    Case(129, 129, 128, 128, causal=True, window=(40, -1), scale=0.3),
    Case(33, 33, 256, 200, window=(None, 0)),
    Case(2, 64, 512, 512, query_heads=2, kv_heads=1),
    Case(33, 7, 3, 1, query_heads=3, kv_heads=1, scale=2.0, dtype="f16"),
    Case(7, 129, 33, 80, query_heads=2, kv_heads=1, causal=True, dtype="f16"),
    Case(33, 64, 128, 128, causal=True, causal_alignment="top_left", dtype="f16"),
    Case(2, 7, 192, 256, window=(1, 1), causal_alignment="top_left", dtype="f16"),
    Case(129, 33, 8, 3, query_heads=4, kv_heads=2, causal=True, causal_alignment="top_left",
         dtype="bf16"),
    Case(1, 129, 256, 64, query_heads=4, kv_heads=1, dtype="bf16"),
    Case(7, 2, 512, 96, causal=True, dtype="bf16"),
    # Long sequences: decoding against many keys, and many queries of which most see nothing.
    Case(1, 1000, 64, 64, query_heads=4, kv_heads=1, causal=True, dtype="f16"),
    Case(1000, 7, 8, 3, query_heads=2, kv_heads=2, causal=True, dtype="bf16"),
]


@pytest.mark.parametrize("backend, case", backend_params(CASES, SIMULATOR_CASES))
def test_forward_matches_reference(backend, case):
    q, k, v = case.inputs(case.rng())
    out, lse = mfa_native.attention(q, k, v, **case.options, return_lse=True,
                                    backend=backend.context())
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
    out, lse = mfa_native.attention(q, k, v, **case.options, return_lse=True,
                                    backend=backend.context())
    check_forward(case, out, lse, q, k, v)


@pytest.mark.parametrize("backend", backend_only_params())
def test_forward_at_the_largest_advertised_head_dim(backend):
    context = backend.context()
    head_dim = context.capabilities["max_head_dim"]
    case = Case(9, 17, head_dim, head_dim - 24, causal=True, dtype="bf16")
    q, k, v = case.inputs(case.rng())
    out, lse = mfa_native.attention(q, k, v, **case.options, return_lse=True, backend=context)
    check_forward(case, out, lse, q, k, v)


@pytest.mark.parametrize("backend", backend_only_params())
def test_rows_whose_scores_all_lie_below_minus_1e30_still_see_their_keys(backend):
    # Finite float32 scores of -1e30 .. -3e30 (q = 1, scale 1). Gaps of 1e30 dwarf float32
    # rounding (~1e23), so the softmax is exactly one-hot on key 0 and out must be its value.
    q = np.ones((1, 1, 2, 1), dtype=np.float32)
    k = np.array([-1e30, -3e30, -2e30], dtype=np.float32).reshape(1, 1, 3, 1)
    v = np.array([1.0, 2.0, 3.0], dtype=np.float32).reshape(1, 1, 3, 1)
    out, lse = mfa_native.attention(q, k, v, scale=1.0, return_lse=True,
                                    backend=backend.context())
    expected_out, expected_lse = reference.attention_forward(q, k, v, scale=1.0)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-6)
