"""Packed sequences of different lengths (attention_varlen and its backward) on every backend,
against the float64 reference sequence by sequence: lengths 0 and 1, modifiers per sequence,
both alignments, GQA, every dtype (_cases.PACKED_CASES). A backend without the features a case
needs must raise MFAError UNSUPPORTED naming one (as in test_modifiers)."""

import dataclasses

import _cases
import mfa_native
import numpy as np
import pytest
import reference
from _backends import (
    DTYPES,
    allowed_error,
    assert_close,
    backward_with_features,
    check_backward,
    check_forward,
    feature_params,
    forward_with_features,
)


def packed_inputs(packed, rng):
    """(q, k, v, dout) packed [total, H, D] in the case's dtype, and the modifiers."""
    case = packed.case
    total_q, total_k = packed.cu_seqlens_q[-1], packed.cu_seqlens_k[-1]

    def make(total, heads, dim):
        return rng.standard_normal((total, heads, dim)).astype(DTYPES[case.dtype])

    q = make(total_q, case.query_heads, case.head_dim)
    k = make(total_k, case.kv_heads, case.head_dim)
    v = make(total_k, case.kv_heads, case.value_dim)
    dout = make(total_q, case.query_heads, case.value_dim)
    return q, k, v, dout, case.modifiers(rng)


def bhsd(array):
    """A packed [total, H, D] array as the reference's [1, H, total, D]."""
    return np.swapaxes(np.asarray(array), 0, 1)[None]


def sequences(packed, modifiers):
    """(b, query rows, key rows, that sequence's Case and modifiers) for every sequence."""
    cu_q, cu_k = packed.cu_seqlens_q, packed.cu_seqlens_k
    for b in range(len(cu_q) - 1):
        nq, nk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        alone = dataclasses.replace(packed.case, num_queries=nq, num_keys=nk, batch=1)
        yield (
            slice(cu_q[b], cu_q[b + 1]),
            slice(cu_k[b], cu_k[b + 1]),
            alone,
            reference.sequence_options(modifiers, b, nq, nk),
        )


def call_args(packed, q, k, v):
    case = packed.case
    offsets = [np.array(cu, np.int32) for cu in (packed.cu_seqlens_q, packed.cu_seqlens_k)]
    return (q, k, v, *offsets, case.num_queries, case.num_keys)


@pytest.mark.parametrize("backend, packed", feature_params(_cases.PACKED_CASES))
def test_packed_forward_matches_reference_per_sequence(backend, packed):
    q, k, v, _, modifiers = packed_inputs(packed, packed.case.rng())
    result = forward_with_features(
        backend,
        packed.case,
        modifiers,
        mfa_native.attention_varlen,
        *call_args(packed, q, k, v),
        features=packed.features,
    )
    if result is None:
        return
    out, lse = result
    assert out.shape == (q.shape[0], q.shape[1], v.shape[2]) and lse.shape == (
        q.shape[1],
        q.shape[0],
    )
    q4, k4, v4, out4 = (bhsd(x) for x in (q, k, v, out))
    for rows, keys, alone, options in sequences(packed, modifiers):
        if rows.stop > rows.start:
            check_forward(
                alone, out4[:, :, rows], lse[None, :, rows], q4[:, :, rows], k4[:, :, keys],
                v4[:, :, keys], options,
            )  # fmt: skip


@pytest.mark.parametrize("backend, packed", feature_params(_cases.PACKED_CASES))
def test_packed_backward_matches_reference_per_sequence(backend, packed):
    case = packed.case
    q, k, v, dout, modifiers = packed_inputs(packed, case.rng())
    q4, k4, v4, dout4 = (bhsd(x) for x in (q, k, v, dout))
    cu = (packed.cu_seqlens_q, packed.cu_seqlens_k)
    exact_out, exact_lse = reference.varlen_attention_forward(
        q4, k4, v4, *cu, **case.options, **modifiers
    )
    out = np.swapaxes(exact_out[0], 0, 1).astype(q.dtype)  # rounded as a backend stores it
    lse = exact_lse[0].astype(np.float32)
    gradients = backward_with_features(
        backend,
        case,
        modifiers,
        mfa_native.attention_varlen_backward,
        dout,
        q,
        k,
        v,
        out,
        lse,
        *call_args(packed, q, k, v)[3:],
        features=packed.features,
    )
    if gradients is None:
        return
    dq, dk, dv = (bhsd(g) for g in gradients[:3])
    out4 = bhsd(out)
    dsinks_magnitude = np.zeros(case.query_heads)
    for rows, keys, alone, options in sequences(packed, modifiers):
        parts = [x[:, :, rows] for x in (dout4, q4)] + [x[:, :, keys] for x in (k4, v4)]
        check_backward(
            alone, [dq[:, :, rows], dk[:, :, keys], dv[:, :, keys]], parts[0], parts[1],
            parts[2], parts[3], out4[:, :, rows], options,
        )  # fmt: skip
        if case.sinks:
            dsinks_magnitude += reference.gradient_magnitudes(
                parts[0], *parts[1:], out=out4[:, :, rows], return_dsinks=True, **case.options,
                **options,
            )[3]  # fmt: skip
    if case.sinks:
        # One float32 sum over every sequence's rows (see _backends.check_backward).
        expected = reference.varlen_attention_backward(
            dout4, q4, k4, v4, *cu, out=out4, return_dsinks=True, **case.options, **modifiers
        )[3]
        size = np.max(np.abs(exact_lse[np.isfinite(exact_lse)]), initial=0.0)
        allowed = allowed_error(
            "f32", expected, dsinks_magnitude, q.shape[0] + case.value_dim, size
        )
        assert_close("dsinks", gradients[3], expected, allowed)
