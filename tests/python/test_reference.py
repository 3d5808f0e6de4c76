"""Checks of the float64 reference itself, so that the backend tests stand on something verified:
hand-derived masks, a per-element loop implementation written separately, finite differences for
the gradients, and proof that plausible mistakes would be visible at the suite's tolerances."""

import math

import numpy as np
import pytest
import reference


def brute_force_attention(
    q, k, v, *, causal=False, causal_alignment="bottom_right", window=None, scale=None
):
    """Attention one output element at a time, with the visible keys of each row taken as the
    range [first, last] rather than as a boolean mask."""
    batch, num_query_heads, num_queries, head_dim = q.shape
    num_kv_heads, num_keys, value_dim = v.shape[1], v.shape[2], v.shape[3]
    group = num_query_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    left, right = (-1, -1) if window is None else window
    left = -1 if left is None else left
    right = -1 if right is None else right

    out = np.zeros((batch, num_query_heads, num_queries, value_dim))
    lse = np.full((batch, num_query_heads, num_queries), -math.inf)
    for b in range(batch):
        for h in range(num_query_heads):
            kv_head = h // group
            for i in range(num_queries):
                position = i + num_keys - num_queries if causal_alignment == "bottom_right" else i
                first, last = 0, num_keys - 1
                if causal:
                    last = min(last, position)
                if left >= 0:
                    first = max(first, position - left)
                if right >= 0:
                    last = min(last, position + right)
                keys = range(first, last + 1)
                if not keys:
                    continue
                scores = [
                    scale
                    * math.fsum(
                        float(q[b, h, i, d]) * float(k[b, kv_head, j, d]) for d in range(head_dim)
                    )
                    for j in keys
                ]
                largest = max(scores)
                weights = [math.exp(s - largest) for s in scores]
                total = math.fsum(weights)
                lse[b, h, i] = largest + math.log(total)
                for e in range(value_dim):
                    out[b, h, i, e] = (
                        math.fsum(w * float(v[b, kv_head, j, e]) for w, j in zip(weights, keys))
                        / total
                    )
    return out, lse


# (B, Hq, Hkv, Nq, Nk, D, Dv, options): tiny shapes covering each feature and their mixtures.
SMALL_CASES = [
    (1, 1, 1, 1, 1, 1, 1, {}),
    (2, 2, 2, 3, 5, 4, 3, {}),
    (1, 2, 1, 5, 3, 3, 2, {"causal": True}),
    (1, 2, 1, 3, 6, 3, 2, {"causal": True}),
    (1, 1, 1, 5, 3, 2, 4, {"causal": True, "causal_alignment": "top_left"}),
    (1, 1, 1, 3, 6, 2, 4, {"causal": True, "causal_alignment": "top_left"}),
    (1, 4, 2, 6, 6, 3, 3, {"window": (1, 1)}),
    (1, 3, 1, 4, 7, 2, 2, {"window": (2, 0), "causal_alignment": "top_left"}),
    (1, 2, 2, 7, 3, 2, 2, {"window": (0, None), "causal": True}),
    (1, 2, 1, 3, 8, 3, 1, {"window": (None, 1)}),
    (1, 2, 2, 4, 4, 5, 2, {"scale": 1.7, "window": (-1, 2)}),
    (2, 4, 1, 3, 3, 2, 3, {"scale": -0.4, "causal": True}),
]
SMALL_IDS = [
    f"{b}x{hq}/{hkv}x{nq}x{nk}x{d}x{dv}-{sorted(o.items())}"
    for b, hq, hkv, nq, nk, d, dv, o in SMALL_CASES
]


def small_inputs(
    seed, batch, num_query_heads, num_kv_heads, num_queries, num_keys, head_dim, value_dim
):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, num_query_heads, num_queries, head_dim))
    k = rng.standard_normal((batch, num_kv_heads, num_keys, head_dim))
    v = rng.standard_normal((batch, num_kv_heads, num_keys, value_dim))
    dout = rng.standard_normal((batch, num_query_heads, num_queries, value_dim))
    return q, k, v, dout


def test_visible_keys_follow_the_header_examples():
    # Derived by hand from mfa.h: bottom-right gives row i the position i + Nk - Nq.
    square_causal = [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    np.testing.assert_array_equal(reference.visible_keys(3, 3, causal=True), square_causal)
    np.testing.assert_array_equal(
        reference.visible_keys(2, 4, causal=True), [[1, 1, 1, 0], [1, 1, 1, 1]]
    )
    np.testing.assert_array_equal(
        reference.visible_keys(2, 4, causal=True, causal_alignment="top_left"),
        [[1, 0, 0, 0], [1, 1, 0, 0]],
    )
    # More queries than keys, bottom-right: the first Nq - Nk rows see nothing.
    np.testing.assert_array_equal(
        reference.visible_keys(4, 2, causal=True), [[0, 0], [0, 0], [1, 0], [1, 1]]
    )
    np.testing.assert_array_equal(
        reference.visible_keys(2, 4, window=(1, 0)), [[0, 1, 1, 0], [0, 0, 1, 1]]
    )
    np.testing.assert_array_equal(
        reference.visible_keys(3, 5, window=(0, 1), causal_alignment="top_left"),
        [[1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0]],
    )
    # A zero-width window keeps only the key at p(i), which does not exist for p(i) < 0.
    np.testing.assert_array_equal(
        reference.visible_keys(4, 2, window=(0, 0)), [[0, 0], [0, 0], [1, 0], [0, 1]]
    )
    assert reference.visible_keys(3, 4, window=(None, None)).all()
    assert reference.visible_keys(3, 4, window=(-1, -1)).all()


@pytest.mark.parametrize("case", SMALL_CASES, ids=SMALL_IDS)
def test_forward_matches_brute_force(case):
    *shape, options = case
    q, k, v, _ = small_inputs(1, *shape)
    expected_out, expected_lse = brute_force_attention(q, k, v, **options)
    out, lse = reference.attention_forward(q, k, v, **options)
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)
    empty_rows = np.isneginf(expected_lse)
    assert np.all(out[empty_rows] == 0)


def test_rows_without_keys_are_exactly_zero_and_minus_infinity():
    q, k, v, dout = small_inputs(2, 1, 2, 1, 5, 2, 3, 4)
    options = {"causal": True}  # bottom-right with Nq - Nk = 3: rows 0-2 see nothing
    out, lse = reference.attention_forward(q, k, v, **options)
    dq, _, _ = reference.attention_backward(dout, q, k, v, **options)
    assert np.all(np.isneginf(lse[:, :, :3])) and np.all(np.isfinite(lse[:, :, 3:]))
    assert np.all(out[:, :, :3] == 0) and np.all(dq[:, :, :3] == 0)
    assert np.all(np.abs(out[:, :, 3:]) > 0)


def loss(q, k, v, dout, options):
    return np.sum(reference.attention_forward(q, k, v, **options)[0] * dout)


@pytest.mark.parametrize("case", SMALL_CASES, ids=SMALL_IDS)
def test_backward_matches_finite_differences(case):
    *shape, options = case
    q, k, v, dout = small_inputs(3, *shape)
    gradients = reference.attention_backward(dout, q, k, v, **options)
    # Central differences in float64: truncation ~ step^2 = 1e-10, rounding ~ 1e-16 / step = 1e-11.
    step = 1e-5
    inputs = [q, k, v]
    for index, gradient in enumerate(gradients):
        numeric = np.zeros_like(gradient)
        for element in np.ndindex(gradient.shape):
            plus = [x.copy() for x in inputs]
            minus = [x.copy() for x in inputs]
            plus[index][element] += step
            minus[index][element] -= step
            numeric[element] = (loss(*plus, dout, options) - loss(*minus, dout, options)) / (
                2 * step
            )
        np.testing.assert_allclose(gradient, numeric, rtol=1e-7, atol=1e-8)


def test_backward_uses_the_given_output_for_delta():
    q, k, v, dout = small_inputs(4, 1, 2, 1, 4, 5, 3, 2)
    exact = reference.attention_backward(dout, q, k, v)
    given = reference.attention_backward(dout, q, k, v, out=reference.attention_forward(q, k, v)[0])
    for a, b in zip(exact, given):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    shifted = reference.attention_backward(
        dout, q, k, v, out=reference.attention_forward(q, k, v)[0] + 0.1
    )
    assert not np.allclose(shifted[0], exact[0])


def interleave_kv_heads(tensor, num_query_heads):
    """The wrong GQA mapping h -> h % Hkv, expressed as one key/value head per query head."""
    return np.tile(tensor, (1, num_query_heads // tensor.shape[1], 1, 1))


@pytest.mark.parametrize(
    "mistake", ["other alignment", "window off by one", "gqa interleaved", "scale ignored"]
)
def test_plausible_mistakes_change_the_result(mistake):
    # Each mistake is one a backend could make; the suite's loosest relative tolerance (bf16) is
    # 4 * 2^-8 ~ 1.6e-2 of max |out|, so each must move the result by clearly more than that.
    q, k, v, _ = small_inputs(5, 1, 4, 2, 6, 9, 8, 5)
    options = {"causal": True, "window": (3, -1)}
    out, _ = reference.attention_forward(q, k, v, **options)
    if mistake == "other alignment":
        wrong, _ = brute_force_attention(q, k, v, causal_alignment="top_left", **options)
    elif mistake == "window off by one":
        wrong, _ = brute_force_attention(q, k, v, causal=True, window=(4, -1))
    elif mistake == "gqa interleaved":
        wrong, _ = brute_force_attention(
            q, interleave_kv_heads(k, 4), interleave_kv_heads(v, 4), **options
        )
    else:
        wrong, _ = brute_force_attention(q, k, v, scale=1.0, **options)
    assert np.max(np.abs(wrong - out)) > 0.05 * np.max(np.abs(out))


@pytest.mark.parametrize("case", SMALL_CASES, ids=SMALL_IDS)
def test_magnitudes_bound_the_results(case):
    *shape, options = case
    q, k, v, dout = small_inputs(6, *shape)
    out, _ = reference.attention_forward(q, k, v, **options)
    out_magnitude, _ = reference.forward_magnitudes(q, k, v, **options)
    assert np.all(np.abs(out) <= out_magnitude * (1 + 1e-12))
    gradients = reference.attention_backward(dout, q, k, v, **options)
    magnitudes = reference.gradient_magnitudes(dout, q, k, v, **options)
    for gradient, magnitude in zip(gradients, magnitudes):
        assert np.all(np.abs(gradient) <= magnitude * (1 + 1e-12) + 1e-15)
    # With non-negative inputs and scale nothing in out cancels: its magnitude is out itself.
    positive = {**options, "scale": abs(options.get("scale") or 1.0)}
    out, _ = reference.attention_forward(np.abs(q), np.abs(k), np.abs(v), **positive)
    out_magnitude, _ = reference.forward_magnitudes(np.abs(q), np.abs(k), np.abs(v), **positive)
    np.testing.assert_allclose(out_magnitude, out, rtol=1e-12)
