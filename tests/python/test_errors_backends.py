"""The bad inputs of the 0.2 arguments that only the library can find (it reads the integer
arrays while validating: packed offsets, block tables, cache lengths, block-mask codes) raise
mfa_native.MFAError INVALID_ARGUMENT with the library's message and write nothing, on every
backend: the reference behind the C ABI, cpu and each metal-sim run. These are rows of the C
bad-input table (tests/support/bad_inputs.h, docs/bad-inputs.md) reached through the Python API;
mfa.h orders invalid arguments before anything a backend lacks, so every backend gives the same
status and text whether or not it implements the feature."""

import mfa_native
import numpy as np
import pytest
from _backends import FEATURE_BACKENDS
from _errors import raises
from mfa_native import MFAError

HQ, HKV, D, DV = 4, 2, 8, 6
SENTINEL = np.float32(-1234.5)


def _varlen(rng, cu_q, cu_k):
    return {
        "q": rng.standard_normal((5, HQ, D)).astype(np.float32),
        "k": rng.standard_normal((7, HKV, D)).astype(np.float32),
        "v": rng.standard_normal((7, HKV, DV)).astype(np.float32),
        "cu_seqlens_q": np.array(cu_q, np.int32),
        "cu_seqlens_k": np.array(cu_k, np.int32),
        "max_seqlen_q": 3,
        "max_seqlen_k": 4,
    }


_PACKED = [
    ((0, 2, 6), (0, 4, 7), "args.cu_seqlens_q[2] = 6 must equal the packed length q.shape[2] = 5"),
    ((0, 2, 5), (0, 5, 4), "args.cu_seqlens_k[2] = 4 must equal the packed length"),
    ((0, 3, 2, 5), (0, 4, 3, 7), "args.cu_seqlens_q decreases at entry 2: 2 after 3"),
    ((0, 1, 5), (0, 4, 7), "args.cu_seqlens_q: sequence 1 has 4 queries, more than"),
    ((0, 2, 5), (0, 0, 7), "args.cu_seqlens_k: sequence 1 has 7 keys, more than"),
]


@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda b: b.id)
@pytest.mark.parametrize("cu_q, cu_k, message", _PACKED)
def test_packed_offsets_are_rejected_on_every_backend(rng, backend, cu_q, cu_k, message):
    out = np.full((5, HQ, DV), SENTINEL, np.float32)
    with raises(MFAError, message, status="INVALID_ARGUMENT"):
        mfa_native.attention_varlen(**_varlen(rng, cu_q, cu_k), out=out, backend=backend.context())
    assert np.all(out == SENTINEL)


_PAGED = [
    ([[0, 4], [2, 3]], [9, 3], "args.block_table[0, 1] = 4 is not a block of the cache"),
    ([[0, -1], [2, 3]], [9, 3], "args.block_table[0, 1] = -1 is not a block of the cache"),
    ([[0, 1], [2, 3]], [16, 3], "args.cache_seqlens[0] = 16 plus 1 new keys exceeds"),
    ([[0, 1], [2, 3]], [9, -2], "args.cache_seqlens[1] = -2 must be >= 0"),
    ([[0, 1], [1, 3]], [9, 3], "args.block_table: block 1 receives new keys at [0, 1] and at"),
    ([[0, 1], [3, 1]], [9, 12], "args.block_table: block 1 receives new keys"),
]


@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda b: b.id)
@pytest.mark.parametrize("table, lengths, message", _PAGED)
def test_block_tables_and_lengths_are_rejected_on_every_backend(
    rng, backend, table, lengths, message
):
    k_cache = rng.standard_normal((4, HKV, 8, D)).astype(np.float32)
    v_cache = rng.standard_normal((4, HKV, 8, DV)).astype(np.float32)
    caches = (k_cache.copy(), v_cache.copy())
    out = np.full((2, HQ, 1, DV), SENTINEL, np.float32)
    with raises(MFAError, message, status="INVALID_ARGUMENT"):
        mfa_native.attention_with_kvcache(
            rng.standard_normal((2, HQ, 1, D)).astype(np.float32),
            k_cache,
            v_cache,
            k=np.ones((2, HKV, 1, D), np.float32),
            v=np.ones((2, HKV, 1, DV), np.float32),
            block_table=np.array(table, np.int32),
            cache_seqlens=np.array(lengths, np.int32),
            out=out,
            backend=backend.context(),
        )
    assert np.all(out == SENTINEL)
    # The caches, which a call with new keys writes, are untouched too.
    np.testing.assert_array_equal(k_cache, caches[0])
    np.testing.assert_array_equal(v_cache, caches[1])


@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda b: b.id)
def test_a_block_mask_code_outside_the_summary_is_rejected_on_every_backend(rng, backend):
    q = rng.standard_normal((1, HQ, 5, D)).astype(np.float32)
    k = rng.standard_normal((1, HKV, 7, D)).astype(np.float32)
    v = rng.standard_normal((1, HKV, 7, DV)).astype(np.float32)
    mask = np.ones((1, 1, 5, 7), bool)
    block_mask = mfa_native.mask_summary(mask, 5, 7)
    block_mask[...] = 3
    out = np.full((1, HQ, 5, DV), SENTINEL, np.float32)
    with raises(MFAError, "args.block_mask[0, 0, 0, 0] = 3 is not a summary code"):
        mfa_native.attention(
            q, k, v, mask=mask, block_mask=block_mask, out=out, backend=backend.context()
        )
    assert np.all(out == SENTINEL)
