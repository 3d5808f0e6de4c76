"""Checks of the float64 reference itself, so that the backend tests stand on something verified:
hand-derived masks, a per-element loop implementation written separately, finite differences for
the gradients, and proof that plausible mistakes would be visible at the suite's tolerances."""

import math

import numpy as np
import pytest
import reference


def brute_force_attention(q, k, v, **options):
    """Attention one output element at a time, with the visible keys of each row taken as the
    range [first, last] rather than as a boolean mask, and each modifier applied to each score
    in mfa.h's order (the options: reference.OPTIONS)."""
    causal, causal_alignment, window, scale, mask, softcap, alibi_slopes, sinks = (
        reference.options_of(options)
    )
    batch, num_query_heads, num_queries, head_dim = q.shape
    num_kv_heads, num_keys, value_dim = v.shape[1], v.shape[2], v.shape[3]
    group = num_query_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    left, right = (-1, -1) if window is None else window
    left = -1 if left is None else left
    right = -1 if right is None else right
    if mask is not None:
        mask = np.asarray(mask)
        mask = np.broadcast_to(
            mask.reshape((1,) * (4 - mask.ndim) + mask.shape),
            (batch, num_query_heads, num_queries, num_keys),
        )
    if alibi_slopes is not None:
        alibi_slopes = np.broadcast_to(
            np.asarray(alibi_slopes, np.float64).reshape(-1, num_query_heads),
            (batch, num_query_heads),
        )

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
                keys, scores = [], []
                for j in range(first, last + 1):
                    if mask is not None and mask.dtype == bool and not mask[b, h, i, j]:
                        continue
                    score = scale * math.fsum(
                        float(q[b, h, i, d]) * float(k[b, kv_head, j, d]) for d in range(head_dim)
                    )
                    if softcap is not None:
                        score = softcap * math.tanh(score / softcap)
                    if alibi_slopes is not None:
                        score -= alibi_slopes[b, h] * abs(position - j)
                    if mask is not None and mask.dtype != bool:
                        score += float(mask[b, h, i, j])
                    if score != -math.inf:
                        keys.append(j)
                        scores.append(score)
                sink = [] if sinks is None else [float(sinks[h])]
                if not scores + sink:
                    continue
                largest = max(scores + sink)
                weights = [math.exp(s - largest) for s in scores]
                total = math.fsum(weights + [math.exp(t - largest) for t in sink])
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
# The same with score modifiers, named by what materialize() makes of them: masks (boolean or
# additive with -inf entries, full or broadcast, by size 1 or stride 0), softcaps small enough
# against the scores that tanh bends them, ALiBi per head or per batch and head with Nq != Nk in
# both alignments, sinks (on rows with and without keys), and combinations.
MODIFIER_CASES = [
    (1, 2, 1, 4, 6, 3, 2, {"softcap": 0.7}),
    (1, 2, 2, 5, 3, 2, 3, {"softcap": 1.3, "causal": True}),
    (2, 2, 1, 3, 7, 3, 2, {"alibi_slopes": "heads", "causal": True}),
    (
        2,
        3,
        1,
        6,
        4,
        2,
        2,
        {"alibi_slopes": "batch", "causal_alignment": "top_left", "window": (2, 1)},
    ),
    (1, 2, 2, 3, 5, 2, 2, {"alibi_slopes": "heads", "causal_alignment": "top_left"}),
    (2, 2, 2, 4, 5, 3, 3, {"mask": "bool"}),
    (2, 4, 2, 3, 6, 2, 2, {"mask": "bool keys", "causal": True}),
    (1, 2, 1, 5, 5, 3, 2, {"mask": "additive", "causal": True}),
    (2, 2, 1, 4, 3, 2, 2, {"mask": "additive stride 0", "window": (1, 1)}),
    (1, 2, 1, 4, 5, 3, 2, {"sinks": True}),
    (1, 2, 2, 5, 2, 2, 3, {"sinks": True, "causal": True}),
    (
        2,
        4,
        2,
        4,
        6,
        3,
        2,
        {
            "sinks": True,
            "softcap": 0.9,
            "alibi_slopes": "heads",
            "mask": "bool keys",
            "window": (3, 0),
        },
    ),
    (1, 2, 1, 3, 4, 2, 2, {"sinks": True, "mask": "additive", "softcap": 2.0, "scale": 1.5}),
]
ALL_CASES = SMALL_CASES + MODIFIER_CASES
ALL_IDS = [
    f"{b}x{hq}/{hkv}x{nq}x{nk}x{d}x{dv}-{sorted(o.items())}"
    for b, hq, hkv, nq, nk, d, dv, o in ALL_CASES
]


def materialize(options, batch, num_query_heads, num_queries, num_keys, rng):
    """A case's options with its modifier names replaced by arrays drawn from rng."""
    options = dict(options)
    spec = options.get("mask")
    if spec is not None:
        shape = (batch, num_query_heads, num_queries, num_keys)
        if spec == "bool":
            options["mask"] = rng.random(shape) < 0.7
        elif spec == "bool keys":  # [B, 1, 1, Nk]: the same for every head and query
            options["mask"] = rng.random((batch, 1, 1, num_keys)) < 0.6
        else:
            values = rng.standard_normal(shape[2:])
            values[rng.random(values.shape) < 0.25] = -np.inf
            # Rank 2, or a full-shape view repeating it with stride 0 on the batch and heads.
            options["mask"] = values if spec == "additive" else np.broadcast_to(values, shape)
    spec = options.get("alibi_slopes")
    if spec is not None:
        shape = (num_query_heads,) if spec == "heads" else (batch, num_query_heads)
        options["alibi_slopes"] = rng.uniform(0.1, 1.0, shape)
    if options.get("sinks"):
        options["sinks"] = rng.standard_normal(num_query_heads)
    return options


def case_inputs(seed, case):
    """(q, k, v, dout, options) of a case, its modifiers materialized."""
    *shape, options = case
    q, k, v, dout = small_inputs(seed, *shape)
    batch, num_query_heads, _, num_queries, num_keys = shape[:5]
    rng = np.random.default_rng(seed + 100)
    return q, k, v, dout, materialize(options, batch, num_query_heads, num_queries, num_keys, rng)


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


@pytest.mark.parametrize("case", ALL_CASES, ids=ALL_IDS)
def test_forward_matches_brute_force(case):
    q, k, v, _, options = case_inputs(1, case)
    expected_out, expected_lse = brute_force_attention(q, k, v, **options)
    out, lse = reference.attention_forward(q, k, v, **options)
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)
    empty_rows = np.isneginf(expected_lse)
    assert np.all(out[empty_rows] == 0)
    if options.get("sinks") is not None:
        # Rows without keys (lse = t_h) exist in some of these cases; every row's lse >= t_h.
        assert np.all(lse >= np.asarray(options["sinks"])[None, :, None] - 1e-12)


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


def central_differences(function, x, step=1e-5):
    """d function / d x element by element, by central differences: in float64 with step 1e-5
    the truncation error is ~ step^2 = 1e-10 and the rounding ~ 1e-16 / step = 1e-11."""
    numeric = np.zeros(x.shape)
    for element in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[element] += step
        minus[element] -= step
        numeric[element] = (function(plus) - function(minus)) / (2 * step)
    return numeric


@pytest.mark.parametrize("case", ALL_CASES, ids=ALL_IDS)
def test_backward_matches_finite_differences(case):
    # The tanh derivative of softcap, the sink's share of the denominator, masks and ALiBi as
    # constants: all of them are in the loss that is differenced.
    q, k, v, dout, options = case_inputs(3, case)
    with_sinks = options.get("sinks") is not None
    gradients = reference.attention_backward(dout, q, k, v, return_dsinks=with_sinks, **options)
    inputs = [q, k, v]
    for index, gradient in enumerate(gradients[:3]):

        def perturbed(x, index=index):
            arrays = list(inputs)
            arrays[index] = x
            return loss(*arrays, dout, options)

        numeric = central_differences(perturbed, inputs[index])
        np.testing.assert_allclose(gradient, numeric, rtol=1e-7, atol=1e-8)
    if with_sinks:
        numeric = central_differences(
            lambda sinks: loss(q, k, v, dout, {**options, "sinks": sinks}), options["sinks"]
        )
        np.testing.assert_allclose(gradients[3], numeric, rtol=1e-7, atol=1e-8)


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


@pytest.mark.parametrize("case", ALL_CASES, ids=ALL_IDS)
def test_magnitudes_bound_the_results(case):
    q, k, v, dout, options = case_inputs(6, case)
    out, _ = reference.attention_forward(q, k, v, **options)
    out_magnitude, _ = reference.forward_magnitudes(q, k, v, **options)
    assert np.all(np.abs(out) <= out_magnitude * (1 + 1e-12))
    with_sinks = options.get("sinks") is not None
    gradients = reference.attention_backward(dout, q, k, v, return_dsinks=with_sinks, **options)
    magnitudes = reference.gradient_magnitudes(dout, q, k, v, return_dsinks=with_sinks, **options)
    for gradient, magnitude in zip(gradients, magnitudes):
        assert np.all(np.abs(gradient) <= magnitude * (1 + 1e-12) + 1e-15)
    # With non-negative inputs and scale nothing in out cancels: its magnitude is out itself.
    positive = {**options, "scale": abs(options.get("scale") or 1.0)}
    out, _ = reference.attention_forward(np.abs(q), np.abs(k), np.abs(v), **positive)
    out_magnitude, _ = reference.forward_magnitudes(np.abs(q), np.abs(k), np.abs(v), **positive)
    np.testing.assert_allclose(out_magnitude, out, rtol=1e-12)


# ---- the modifiers, by hand ----------------------------------------------------------------


def test_a_sink_takes_probability_and_adds_no_value():
    # Scores all 0 (q = 0) over 3 keys and a sink t = log 2: the denominator is 3 + 2, so each
    # key gets 1/5, out = sum(v) / 5 and lse = log 5.
    q = np.zeros((1, 1, 1, 2))
    k = np.ones((1, 1, 3, 2))
    v = np.array([1.0, 2.0, 6.0]).reshape(1, 1, 3, 1)
    out, lse = reference.attention_forward(q, k, v, sinks=[math.log(2)])
    np.testing.assert_allclose(out, [[[[9 / 5]]]], rtol=1e-15)
    np.testing.assert_allclose(lse, [[[math.log(5)]]], rtol=1e-15)


def test_a_row_without_keys_but_with_a_sink_gets_zeros_and_the_sink_logit():
    q, k, v, dout = small_inputs(7, 1, 2, 1, 5, 2, 3, 4)
    sinks = np.array([0.25, -1.5])
    options = {"causal": True, "sinks": sinks}  # rows 0-2 see no key
    out, lse = reference.attention_forward(q, k, v, **options)
    np.testing.assert_array_equal(lse[0, :, :3], np.repeat(sinks[:, None], 3, axis=1))
    assert np.all(out[:, :, :3] == 0) and np.all(lse[:, :, 3:] > sinks[None, :, None])
    dq, _, _, dsinks = reference.attention_backward(dout, q, k, v, return_dsinks=True, **options)
    assert np.all(dq[:, :, :3] == 0)
    # Only rows with keys contribute: the same dsinks from them alone.
    _, _, _, from_rows_with_keys = reference.attention_backward(
        dout[:, :, 3:], q[:, :, 3:], k, v, return_dsinks=True, **options
    )
    np.testing.assert_allclose(dsinks, from_rows_with_keys, rtol=1e-14)


def test_softcap_bends_scores_through_tanh_before_any_bias():
    # One key: lse is the score itself, cap tanh(scale q.k / cap) + the ALiBi bias + the mask.
    q = np.full((1, 1, 1, 4), 2.0)
    k = np.full((1, 1, 1, 4), 1.5)  # scale q.k = 0.5 * 12 = 6
    _, lse = reference.attention_forward(q, k, k, softcap=2.0)
    np.testing.assert_allclose(lse, 2.0 * math.tanh(3.0), rtol=1e-15)
    _, lse = reference.attention_forward(
        q, k, k, softcap=2.0, mask=np.full((1, 1), 0.75), alibi_slopes=[0.5], window=None
    )
    np.testing.assert_allclose(lse, 2.0 * math.tanh(3.0) + 0.75, rtol=1e-15)


@pytest.mark.parametrize("causal_alignment, position", [("bottom_right", 3), ("top_left", 0)])
def test_alibi_measures_distance_from_the_aligned_position(causal_alignment, position):
    # q = 0, so the scores are the bias alone: -slope |p(i) - j| over Nk = 4 keys for the
    # first of Nq = 1 queries, whose aligned position is Nk - Nq = 3 (bottom-right) or 0.
    slope = 0.7
    q = np.zeros((1, 1, 1, 2))
    k = np.ones((1, 1, 4, 2))
    v = np.arange(4.0).reshape(1, 1, 4, 1)
    out, lse = reference.attention_forward(
        q, k, v, alibi_slopes=[slope], causal_alignment=causal_alignment
    )
    scores = np.array([-slope * abs(position - j) for j in range(4)])
    weights = np.exp(scores) / np.exp(scores).sum()
    np.testing.assert_allclose(out[0, 0, 0, 0], weights @ np.arange(4.0), rtol=1e-14)
    np.testing.assert_allclose(lse[0, 0, 0], math.log(np.exp(scores).sum()), rtol=1e-14)


def test_alibi_slopes_per_batch_select_each_batchs_row():
    q, k, v, _ = small_inputs(8, 2, 3, 1, 4, 6, 3, 2)
    slopes = np.array([[0.1, 0.5, 0.9], [0.3, 0.2, 0.7]])
    out, _ = reference.attention_forward(q, k, v, alibi_slopes=slopes)
    for b in range(2):
        alone, _ = reference.attention_forward(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], alibi_slopes=slopes[b]
        )
        np.testing.assert_allclose(out[b : b + 1], alone, rtol=1e-14)


def test_masks_broadcast_and_agree_with_each_other():
    q, k, v, _ = small_inputs(9, 2, 2, 1, 4, 5, 3, 2)
    rng = np.random.default_rng(9)
    keep = rng.random((4, 5)) < 0.6
    keep[:, 0] = True  # every row keeps a key
    full = np.broadcast_to(keep, (2, 2, 4, 5))
    additive = np.where(keep, 0.0, -np.inf)
    expected, expected_lse = reference.attention_forward(q, k, v, mask=np.ascontiguousarray(full))
    for mask in (keep, full, additive, keep[None, None], np.broadcast_to(additive, full.shape)):
        out, lse = reference.attention_forward(q, k, v, mask=mask)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(lse, expected_lse)
    # All true / all zero change nothing; a boolean mask intersects the causal rule.
    plain = reference.attention_forward(q, k, v, causal=True)
    for mask in (np.ones((4, 5), bool), np.zeros((1, 1, 1, 5))):
        np.testing.assert_array_equal(
            reference.attention_forward(q, k, v, causal=True, mask=mask)[0], plain[0]
        )
    both = reference.attention_forward(q, k, v, causal=True, mask=keep)[0]
    causal_and_keep = keep & reference.visible_keys(4, 5, causal=True)
    np.testing.assert_array_equal(
        both, reference.attention_forward(q, k, v, mask=causal_and_keep)[0]
    )


def test_an_additive_mask_is_added_after_softcap():
    # softcap(s + m) != softcap(s) + m: the order of mfa.h (and flash-attn, Gemma) is the latter.
    q, k, v, _ = small_inputs(10, 1, 1, 1, 3, 4, 2, 2)
    q *= 3
    mask = np.random.default_rng(10).standard_normal((3, 4))
    out, _ = reference.attention_forward(q, k, v, softcap=0.5, mask=mask)
    scores = 0.5 * np.tanh((q @ np.swapaxes(k, -1, -2)) / np.sqrt(2) / 0.5) + mask
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(out, weights / weights.sum(-1, keepdims=True) @ v, rtol=1e-13)


# ---- packed sequences, paged caches, merges, mask summaries --------------------------------


def block_diagonal_visibility(cu_q, cu_k, **options):
    """The packed problem's visibility as one [total_q, total_k] mask: each sequence's own rule
    on its diagonal block, nothing across sequences."""
    visible = np.zeros((cu_q[-1], cu_k[-1]), dtype=bool)
    for b in range(len(cu_q) - 1):
        nq, nk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        visible[cu_q[b] : cu_q[b + 1], cu_k[b] : cu_k[b + 1]] = reference.visible_keys(
            nq, nk, **options
        )
    return visible


# Sequences of lengths 0 and 1 among others; queries without keys and keys without queries.
VARLEN_OFFSETS = [
    ([0, 3, 3, 4, 9], [0, 5, 7, 7, 13]),
    ([0, 1, 6], [0, 6, 8]),
    ([0, 0, 2], [0, 4, 4]),
]


@pytest.mark.parametrize("cu_q, cu_k", VARLEN_OFFSETS)
@pytest.mark.parametrize(
    "options",
    [{}, {"causal": True}, {"window": (1, 2), "causal_alignment": "top_left"}, {"causal": True}],
)
def test_packed_sequences_equal_one_call_with_a_block_diagonal_mask(cu_q, cu_k, options):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 4, cu_q[-1], 3))
    k = rng.standard_normal((1, 2, cu_k[-1], 3))
    v = rng.standard_normal((1, 2, cu_k[-1], 2))
    dout = rng.standard_normal((1, 4, cu_q[-1], 2))
    sinks = rng.standard_normal(4)
    # A per-sequence rule as a mask over the whole packed problem: an independent construction.
    dense = {"mask": block_diagonal_visibility(cu_q, cu_k, **options), "sinks": sinks}
    out, lse = reference.varlen_attention_forward(q, k, v, cu_q, cu_k, sinks=sinks, **options)
    expected_out, expected_lse = reference.attention_forward(q, k, v, **dense)
    np.testing.assert_allclose(out, expected_out, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-13)
    gradients = reference.varlen_attention_backward(
        dout, q, k, v, cu_q, cu_k, return_dsinks=True, sinks=sinks, **options
    )
    expected = reference.attention_backward(dout, q, k, v, return_dsinks=True, **dense)
    for actual, wanted in zip(gradients, expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-12, atol=1e-14)


def test_packed_sequences_index_masks_and_slopes_per_sequence():
    # A mask [B, Hq, max_q, max_k] is indexed with each sequence's local rows and keys, and
    # [B, Hq] slopes by sequence: sequence b alone as a dense call with its slices.
    cu_q, cu_k = [0, 2, 5], [0, 4, 7]
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 2, 5, 3))
    k, v = rng.standard_normal((2, 1, 2, 7, 3))
    mask = rng.standard_normal((2, 2, 3, 4))
    slopes = rng.uniform(0.1, 1, (2, 2))
    out, _ = reference.varlen_attention_forward(
        q, k, v, cu_q, cu_k, mask=mask, alibi_slopes=slopes, causal=True
    )
    for b in range(2):
        nq, nk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        alone, _ = reference.attention_forward(
            q[:, :, cu_q[b] : cu_q[b + 1]],
            k[:, :, cu_k[b] : cu_k[b + 1]],
            v[:, :, cu_k[b] : cu_k[b + 1]],
            mask=mask[b : b + 1, :, :nq, :nk],
            alibi_slopes=slopes[b],
            causal=True,
        )
        np.testing.assert_allclose(out[:, :, cu_q[b] : cu_q[b + 1]], alone, rtol=1e-14)


@pytest.mark.parametrize("causal_alignment", reference.ALIGNMENTS)
def test_a_paged_cache_equals_dense_attention_over_each_sequences_keys(causal_alignment):
    # Partial last blocks (lengths 5, 8, 1 with blocks of 4), an empty sequence, shuffled blocks.
    rng = np.random.default_rng(13)
    lengths, block_size = [5, 8, 0, 1], 4
    q = rng.standard_normal((4, 2, 3, 3))
    k = rng.standard_normal((4, 1, 8, 3))
    v = rng.standard_normal((4, 1, 8, 2))
    order = np.random.default_rng(1).permutation(9)
    k_cache, table = reference.scatter_keys(k, lengths, block_size, 9, order)
    v_cache, _ = reference.scatter_keys(v, lengths, block_size, 9, order)
    options = {"causal": True, "causal_alignment": causal_alignment, "sinks": [0.5, -0.5]}
    out, lse, _, _ = reference.paged_attention_forward(
        q, k_cache, v_cache, table, lengths, **options
    )
    for b, n in enumerate(lengths):
        expected = reference.attention_forward(
            q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], **options
        )
        np.testing.assert_allclose(out[b : b + 1], expected[0], rtol=1e-14)
        np.testing.assert_allclose(lse[b : b + 1], expected[1], rtol=1e-14)
    assert np.all(np.isfinite(out))  # no NaN of an unused cache row was read


def test_a_paged_cache_appends_new_keys_before_attending():
    rng = np.random.default_rng(14)
    cached, new, block_size = [3, 6], 3, 4
    q = rng.standard_normal((2, 2, 2, 3))
    k = rng.standard_normal((2, 1, 9, 3))  # sequence b: cached[b] old keys, then 3 new ones
    v = rng.standard_normal((2, 1, 9, 2))
    k_new = np.stack([k[b, :, cached[b] : cached[b] + new] for b in range(2)])
    v_new = np.stack([v[b, :, cached[b] : cached[b] + new] for b in range(2)])
    totals = [n + new for n in cached]
    order = np.random.default_rng(2).permutation(6)
    k_cache, table = reference.scatter_keys(k, totals, block_size, 6, order)
    v_cache, _ = reference.scatter_keys(v, totals, block_size, 6, order)
    before_k, before_v = k_cache.copy(), v_cache.copy()
    for b, n in enumerate(cached):  # the rows the call writes hold garbage before it
        for j in range(n, n + new):
            k_cache[table[b, j // block_size], :, j % block_size] = 1e6
            v_cache[table[b, j // block_size], :, j % block_size] = 1e6
    out, _, k_after, v_after = reference.paged_attention_forward(
        q, k_cache, v_cache, table, cached, k_new=k_new, v_new=v_new, causal=True
    )
    np.testing.assert_array_equal(k_after, before_k)
    np.testing.assert_array_equal(v_after, before_v)
    for b, n in enumerate(totals):
        expected, _ = reference.attention_forward(
            q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=True
        )
        np.testing.assert_allclose(out[b : b + 1], expected, rtol=1e-14)


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_merging_attention_over_key_partitions_equals_attention_over_all_keys(parts):
    rng = np.random.default_rng(15)
    q, k, v, _ = small_inputs(15, 2, 2, 1, 5, 16, 3, 2)
    # Random cut points, some parts empty (lse -inf, out never read: it holds NaN here).
    cuts = np.sort(rng.integers(0, 17, parts - 1))
    bounds = [0, *cuts, 16]
    outs, lses = [], []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if start == stop:
            outs.append(np.full((2, 2, 5, 2), np.nan))
            lses.append(np.full((2, 2, 5), -np.inf))
        else:
            out, lse = reference.attention_forward(q, k[:, :, start:stop], v[:, :, start:stop])
            outs.append(out)
            lses.append(lse)
    outs.append(np.full((2, 2, 5, 2), np.nan))  # one more empty part, always
    lses.append(np.full((2, 2, 5), -np.inf))
    out, lse = reference.merge_states(outs, lses)
    expected_out, expected_lse = reference.attention_forward(q, k, v)
    np.testing.assert_allclose(out, expected_out, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-14)


def test_merge_special_rows():
    outs = [
        np.array([[[[1.0], [2.0], [3.0], [4.0]]]]),
        np.array([[[[5.0], [np.nan], [7.0], [8.0]]]]),
    ]
    lses = [
        np.array([[[-np.inf, 0.0, np.nan, np.log(3)]]]),
        np.array([[[-np.inf, -np.inf, 1.0, 0.0]]]),
    ]
    out, lse = reference.merge_states(outs, lses)
    assert out[0, 0, 0, 0] == 0 and lse[0, 0, 0] == -np.inf  # no part saw a key
    assert out[0, 0, 1, 0] == 2 and lse[0, 0, 1] == 0  # the NaN of a -inf part is not read
    assert np.isnan(out[0, 0, 2, 0]) and np.isnan(lse[0, 0, 2])  # a NaN lse
    np.testing.assert_allclose(out[0, 0, 3, 0], (3 * 4 + 1 * 8) / 4, rtol=1e-15)
    np.testing.assert_allclose(lse[0, 0, 3], np.log(4), rtol=1e-15)
    lses[1][0, 0, 3] = np.inf
    assert np.isnan(reference.merge_states(outs, lses)[1][0, 0, 3])


def test_an_initial_state_is_a_merge_with_the_earlier_keys():
    # Accumulating key blocks one call at a time (state = merge(state, call)) gives one call
    # over all keys, with sinks given to the first call only.
    q, k, v, _ = small_inputs(16, 1, 2, 2, 4, 9, 3, 2)
    sinks = np.array([0.3, -0.2])
    out, lse = reference.attention_forward(q, k[:, :, :2], v[:, :, :2], sinks=sinks)
    for start, stop in [(2, 5), (5, 9)]:
        part = reference.attention_forward(q, k[:, :, start:stop], v[:, :, start:stop])
        out, lse = reference.merge_states([out, part[0]], [lse, part[1]])
    expected_out, expected_lse = reference.attention_forward(q, k, v, sinks=sinks)
    np.testing.assert_allclose(out, expected_out, rtol=1e-13)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-14)


def test_mask_summary_of_a_causal_mask_by_hand():
    # 130 x 150 causal (top-left) as a boolean mask: blocks of 64 below the diagonal are all
    # visible (2), the diagonal ones mixed (1), those above it all hidden (0).
    keep = reference.visible_keys(130, 150, causal=True, causal_alignment="top_left")
    codes = reference.mask_summary(keep, 130, 150)
    assert codes.shape == (1, 1, 3, 3) and codes.dtype == np.uint8
    np.testing.assert_array_equal(codes[0, 0], [[1, 0, 0], [2, 1, 0], [2, 2, 1]])
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(reference.mask_summary(additive, 130, 150), codes)
    # Anything added makes a block mixed, NaN included.
    additive[0, 0] = 0.5
    additive[129, 149] = np.nan
    np.testing.assert_array_equal(
        reference.mask_summary(additive, 130, 150)[0, 0], [[1, 0, 0], [2, 1, 0], [2, 2, 1]]
    )
    additive[70, 100] = np.nan  # in a hidden block
    assert reference.mask_summary(additive, 130, 150)[0, 0, 1, 1] == 1


def test_mask_summary_keeps_batches_and_heads_that_differ_and_folds_broadcast_ones():
    rng = np.random.default_rng(17)
    keep = rng.random((3, 1, 70, 65)) < 0.5
    keep[1] = True
    keep[2] = False
    codes = reference.mask_summary(keep, 70, 65)
    assert codes.shape == (3, 1, 2, 2)
    assert np.all(codes[0] == 1) and np.all(codes[1] == 2) and np.all(codes[2] == 0)
    broadcast = np.broadcast_to(keep[1:2], (3, 4, 70, 65))  # stride 0 over batch and heads
    assert reference.mask_summary(broadcast, 70, 65).shape == (1, 1, 2, 2)
    # A mask the same for every query (size 1) still gets a row of blocks per 64 queries.
    assert reference.mask_summary(keep[:, :, :1], 70, 65).shape == (3, 1, 2, 2)
