"""Paged KV caches (attention_with_kvcache) on every backend, against the float64 reference:
shuffled block tables, partial last blocks, empty caches, appends of new keys and values
(written into the caller's caches, every other row untouched), modifiers, both layouts, every
dtype (_cases.PAGED_CASES). A backend without the features a case needs must raise MFAError
UNSUPPORTED naming one (as in test_modifiers), and leave the caches as they were."""

import dataclasses

import _cases
import mfa_native
import numpy as np
import pytest
import reference
from _backends import check_forward, feature_params, forward_with_features


def assert_same_bits(actual: np.ndarray, expected: np.ndarray) -> None:
    """Compares bit patterns: numpy's NaN-aware equality does not know ml_dtypes' 16-bit floats,
    and a cache row the library did not write must keep its exact bits, NaN payloads included."""
    unsigned = np.dtype(f"u{actual.dtype.itemsize}")
    np.testing.assert_array_equal(
        np.ascontiguousarray(actual).view(unsigned), np.ascontiguousarray(expected).view(unsigned)
    )


def to_layout(array, layout):
    """[blocks or B, H, N, D] <-> the layout's order, as a contiguous array of the caller's."""
    return array if layout == "bhsd" else np.ascontiguousarray(np.swapaxes(array, 1, 2))


@pytest.mark.parametrize("backend, paged", feature_params(_cases.PAGED_CASES))
def test_paged_forward_matches_dense_attention_over_each_sequences_keys(backend, paged):
    case = paged.case
    rng = case.rng()
    lengths = [n + paged.new for n in paged.cached]
    longest = max(lengths)
    # Each sequence's keys and values as dense arrays, scattered into shuffled blocks of caches
    # filled with NaN elsewhere; the rows the call appends hold NaN before it too.
    q = case.array(rng, case.query_heads, case.num_queries, case.head_dim)
    keys = case.array(rng, case.kv_heads, longest, case.head_dim)
    values = case.array(rng, case.kv_heads, longest, case.value_dim)
    modifiers = case.modifiers(rng)
    order = rng.permutation(paged.num_blocks)
    expected_k, table = reference.scatter_keys(
        keys, lengths, paged.block_size, paged.num_blocks, order
    )
    expected_v, _ = reference.scatter_keys(
        values, lengths, paged.block_size, paged.num_blocks, order
    )
    k_cache, _ = reference.scatter_keys(
        keys, paged.cached, paged.block_size, paged.num_blocks, order
    )
    v_cache, _ = reference.scatter_keys(
        values, paged.cached, paged.block_size, paged.num_blocks, order
    )
    if table.shape[1] < paged.max_blocks:  # the case's table width, for its mask's key axis
        table = np.pad(table, ((0, 0), (0, paged.max_blocks - table.shape[1])), constant_values=-1)
    new = {}
    if paged.new:
        starts = np.array(paged.cached)
        new = {
            name: np.stack([dense[b, :, s : s + paged.new] for b, s in enumerate(starts)])
            for name, dense in (("k", keys), ("v", values))
        }
    layout = paged.layout
    given_k, given_v = to_layout(k_cache, layout), to_layout(v_cache, layout)
    before_k, before_v = given_k.copy(), given_v.copy()
    result = forward_with_features(
        backend,
        case,
        modifiers,
        mfa_native.attention_with_kvcache,
        to_layout(q, layout),
        given_k,
        given_v,
        table,
        np.array(paged.cached, np.int32),
        *(to_layout(new[name], layout) for name in ("k", "v") if new),
        features=paged.features,
        layout=layout,
    )
    if result is None:
        assert_same_bits(given_k, before_k)
        assert_same_bits(given_v, before_v)
        return
    out, lse = result
    out = to_layout(out, layout)
    # The caches now hold every sequence's keys, and nothing else changed (NaN stays NaN).
    assert_same_bits(to_layout(given_k, layout), expected_k)
    assert_same_bits(to_layout(given_v, layout), expected_v)
    for b, n in enumerate(lengths):
        alone = dataclasses.replace(case, num_keys=n, batch=1)
        options = reference.sequence_options(modifiers, b, case.num_queries, n)
        check_forward(
            alone, out[b : b + 1], lse[b : b + 1], q[b : b + 1], keys[b : b + 1, :, :n],
            values[b : b + 1, :, :n], options,
        )  # fmt: skip
