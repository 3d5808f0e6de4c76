"""Each 0.2 feature alone, in each direction it has, on every backend: where the backend's
capabilities lack it, the call raises MFAError UNSUPPORTED naming exactly that feature and
direction, before anything is written; where they have it, the call runs and matches the float64
reference on one small problem (the other modules' shared case lists test each in depth)."""

import mfa_native
import numpy as np
import pytest
import reference
from _backends import FEATURE_BACKENDS, Case, check_backward, check_forward
from _errors import raises
from mfa_native import MFAError

# Two sequences of 9 queries and 13 keys: a dense batch, also packed and paged below.
CASE = Case(9, 13, 8, 8, batch=2, query_heads=2, kv_heads=1, causal=True)
SENTINEL = 1234.5


def dense_modifier(feature, rng):
    """The keyword arguments of attention() that use one feature (a block mask with its mask:
    both are needed)."""
    keep = rng.random((CASE.num_queries, CASE.num_keys)) < 0.7
    return {
        "mask": {"mask": keep},
        "block_mask": {"mask": keep, "block_mask": mfa_native.mask_summary(keep, 9, 13)},
        "softcap": {"softcap": 0.75},
        "alibi": {"alibi_slopes": np.array([0.5, 0.25], np.float32)},
        "sinks": {"sinks": np.array([0.5, 1.5], np.float32)},
    }[feature]


# The order in which the library names a call's missing features (the first one).
FEATURE_ORDER = ["mask", "block_mask", "softcap", "alibi", "sinks", "varlen", "paged_kv",
                 "initial_state"]  # fmt: skip


def run_or_unsupported(backend, direction, feature, function, untouched):
    """function() where the backend has the feature (and a block mask's mask) in that
    direction; else check that it raises UNSUPPORTED naming the first one missing, leaving the
    output `untouched` (a sentinel-filled array) as it was, and return None."""
    needed = {feature, "mask"} if feature == "block_mask" else {feature}
    missing = [name for name in FEATURE_ORDER if name in needed - backend.features(direction)]
    if not missing:
        return function()
    expected = f"the {backend.context().backend} backend does not support "
    with raises(MFAError, expected, status="UNSUPPORTED") as caught:
        function()
    message = caught.value.message
    assert f"MFA_FEATURE_{missing[0].upper()}" in message, message
    assert message.endswith(f"in the {direction}"), message
    assert np.all(untouched == SENTINEL), "nothing is written before UNSUPPORTED"
    return None


def _without_block_mask(arguments):
    return {name: value for name, value in arguments.items() if name != "block_mask"}


@pytest.mark.parametrize("feature", ["mask", "block_mask", "softcap", "alibi", "sinks"])
@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda backend: backend.id)
def test_a_score_modifier_alone_in_the_forward(backend, feature):
    rng = CASE.rng()
    q, k, v = CASE.inputs(rng)
    arguments = dense_modifier(feature, rng)
    out = np.full((2, 2, 9, 8), SENTINEL, np.float32)
    result = run_or_unsupported(
        backend, "forward", feature,
        lambda: mfa_native.attention(
            q, k, v, **CASE.options, **arguments, out=out, return_lse=True,
            backend=backend.context(),
        ),
        out,
    )  # fmt: skip
    if result is not None:
        check_forward(CASE, *result, q, k, v, _without_block_mask(arguments))


@pytest.mark.parametrize("feature", ["mask", "block_mask", "softcap", "alibi", "sinks"])
@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda backend: backend.id)
def test_a_score_modifier_alone_in_the_backward(backend, feature):
    rng = CASE.rng()
    q, k, v = CASE.inputs(rng)
    dout = CASE.output_gradient(rng)
    arguments = dense_modifier(feature, rng)
    modifiers = _without_block_mask(arguments)
    exact_out, exact_lse = reference.attention_forward(q, k, v, **CASE.options, **modifiers)
    out, lse = exact_out.astype(np.float32), exact_lse.astype(np.float32)
    dq = np.full(q.shape, SENTINEL, np.float32)
    result = run_or_unsupported(
        backend, "backward", feature,
        lambda: mfa_native.attention_backward(
            dout, q, k, v, out, lse, **CASE.options, **arguments, dq=dq,
            return_dsinks=feature == "sinks", backend=backend.context(),
        ),
        dq,
    )  # fmt: skip
    if result is not None:
        check_backward(CASE, result, dout, q, k, v, out, modifiers)


def packed(array):
    """[B, H, N, D] of equal-length sequences as packed [B * N, H, D]."""
    batch, heads, length, dim = array.shape
    return np.ascontiguousarray(np.swapaxes(array, 1, 2).reshape(batch * length, heads, dim))


def unpacked(array, batch):
    total, heads, dim = array.shape
    return np.swapaxes(np.asarray(array).reshape(batch, total // batch, heads, dim), 1, 2)


OFFSETS = (np.array([0, 9, 18], np.int32), np.array([0, 13, 26], np.int32), 9, 13)


@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda backend: backend.id)
def test_packed_sequences_alone_forward_and_backward(backend):
    rng = CASE.rng()
    q, k, v = CASE.inputs(rng)
    dout = CASE.output_gradient(rng)
    out = np.full((18, 2, 8), SENTINEL, np.float32)
    lse = np.full((2, 18), SENTINEL, np.float32)
    result = run_or_unsupported(
        backend, "forward", "varlen",
        lambda: mfa_native.attention_varlen(
            *map(packed, (q, k, v)), *OFFSETS, **CASE.options, out=out, lse=lse,
            backend=backend.context(),
        ),
        out,
    )  # fmt: skip
    if result is not None:
        check_forward(CASE, unpacked(out, 2), np.swapaxes(lse.reshape(2, 2, 9), 0, 1), q, k, v)
    exact_out, exact_lse = reference.attention_forward(q, k, v, **CASE.options)
    given_out = packed(exact_out.astype(np.float32))
    given_lse = np.ascontiguousarray(np.swapaxes(exact_lse, 0, 1).reshape(2, 18)).astype(np.float32)
    dq = np.full((18, 2, 8), SENTINEL, np.float32)
    gradients = run_or_unsupported(
        backend, "backward", "varlen",
        lambda: mfa_native.attention_varlen_backward(
            packed(dout), *map(packed, (q, k, v)), given_out, given_lse, *OFFSETS,
            **CASE.options, dq=dq, backend=backend.context(),
        ),
        dq,
    )  # fmt: skip
    if gradients is not None:
        check_backward(
            CASE, [unpacked(g, 2) for g in gradients], dout, q, k, v, unpacked(given_out, 2)
        )


@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda backend: backend.id)
def test_a_paged_cache_alone(backend):
    rng = CASE.rng()
    q, k, v = CASE.inputs(rng)
    order = rng.permutation(5)
    caches = [reference.scatter_keys(x, [13, 13], 8, 5, order) for x in (k, v)]
    out = np.full((2, 2, 9, 8), SENTINEL, np.float32)
    result = run_or_unsupported(
        backend, "forward", "paged_kv",
        lambda: mfa_native.attention_with_kvcache(
            q, caches[0][0], caches[1][0], caches[0][1], np.array([13, 13], np.int32),
            **CASE.options, out=out, return_lse=True, backend=backend.context(),
        ),
        out,
    )  # fmt: skip
    if result is not None:
        check_forward(CASE, *result, q, k, v)


@pytest.mark.parametrize("backend", FEATURE_BACKENDS, ids=lambda backend: backend.id)
def test_an_initial_state_alone(backend):
    # Folding all keys into an empty state (lse -inf; out never read) is one plain call.
    q, k, v = CASE.inputs(CASE.rng())
    out = np.full((2, 2, 9, 8), SENTINEL, np.float32)
    lse = np.full((2, 2, 9), -np.inf, np.float32)
    result = run_or_unsupported(
        backend, "forward", "initial_state",
        lambda: mfa_native.attention(
            q, k, v, **CASE.options, out=out, lse=lse, accumulate=True,
            backend=backend.context(),
        ),
        out,
    )  # fmt: skip
    if result is not None:
        check_forward(CASE, out, lse, q, k, v)
