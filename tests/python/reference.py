"""A float64 numpy reference for attention, independent of mfa_native.

Everything is materialized (the full score matrix), so use it on test-sized problems only.
Arrays are [B, H, N, D] ("bhsd"); callers convert other layouts before calling.

The visibility rule is the one of native/include/mfa.h: query row i has the aligned position
p(i) = i + (Nk - Nq) (bottom-right) or p(i) = i (top-left), and key j is visible when
    (not causal or j <= p(i)) and (left < 0 or j >= p(i) - left)
    and (right < 0 or j <= p(i) + right).
"""

import numpy as np

ALIGNMENTS = ("bottom_right", "top_left")


def window_bounds(window):
    """(left, right) with a negative number for each unbounded side, from None or a pair
    whose entries are None or an int (negative meaning unbounded)."""
    if window is None:
        return -1, -1
    left, right = window
    return (-1 if left is None else left), (-1 if right is None else right)


def visible_keys(
    num_queries, num_keys, *, causal=False, causal_alignment="bottom_right", window=None
):
    """Boolean [Nq, Nk]: True where query row i may attend to key j."""
    if causal_alignment not in ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {ALIGNMENTS}, got {causal_alignment!r}")
    offset = num_keys - num_queries if causal_alignment == "bottom_right" else 0
    positions = (np.arange(num_queries) + offset)[:, None]
    keys = np.arange(num_keys)[None, :]
    visible = np.ones((num_queries, num_keys), dtype=bool)
    if causal:
        visible &= keys <= positions
    left, right = window_bounds(window)
    if left >= 0:
        visible &= keys >= positions - left
    if right >= 0:
        visible &= keys <= positions + right
    return visible


def _repeat_kv_heads(tensor, num_query_heads):
    """Give every query head its own copy of the key/value head it reads (h // group)."""
    num_kv_heads = tensor.shape[1]
    if num_query_heads % num_kv_heads:
        raise ValueError(
            f"query heads ({num_query_heads}) must be a multiple of key/value heads "
            f"({num_kv_heads})"
        )
    return np.repeat(tensor, num_query_heads // num_kv_heads, axis=1)


def _sum_over_groups(tensor, num_kv_heads):
    """Inverse bookkeeping of _repeat_kv_heads for gradients: add up each group's heads."""
    batch, num_query_heads, length, dim = tensor.shape
    group = num_query_heads // num_kv_heads
    return tensor.reshape(batch, num_kv_heads, group, length, dim).sum(axis=2)


def _probabilities(q, k, *, causal, causal_alignment, window, scale):
    """Softmax probabilities [B, Hq, Nq, Nk] (0 where masked, and on rows that see no key)
    and the log-sum-exp [B, Hq, Nq] (-inf on such rows)."""
    q = np.asarray(q, dtype=np.float64)
    k = _repeat_kv_heads(np.asarray(k, dtype=np.float64), q.shape[1])
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    visible = visible_keys(
        q.shape[2], k.shape[2], causal=causal, causal_alignment=causal_alignment, window=window
    )
    scores = np.where(visible, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    # Rows that see nothing have max -inf; shifting them by 0 keeps exp(-inf) = 0 instead of NaN.
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - row_max)
    total = weights.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = (row_max + np.log(total))[..., 0]
        probs = np.where(total > 0, weights / total, 0.0)
    return probs, lse, scale


def attention_forward(
    q, k, v, *, causal=False, causal_alignment="bottom_right", window=None, scale=None
):
    """(out [B, Hq, Nq, Dv], lse [B, Hq, Nq]) in float64. Rows that see no key: out 0, lse -inf."""
    probs, lse, _ = _probabilities(
        q, k, causal=causal, causal_alignment=causal_alignment, window=window, scale=scale
    )
    v = _repeat_kv_heads(np.asarray(v, dtype=np.float64), probs.shape[1])
    return probs @ v, lse


def forward_magnitudes(
    q, k, v, *, causal=False, causal_alignment="bottom_right", window=None, scale=None
):
    """Sizes for bounding floating-point errors, 0 on rows that see no key:
    out evaluated on absolute values, P |V| (the sum of the absolute values of its terms), and
    per row [B, Hq, Nq] the P-weighted mean of |scale| |q| |k|^T, the size of the terms of the
    scores, whose rounding errors reach lse, P and everything computed from P."""
    probs, _, scale = _probabilities(
        q, k, causal=causal, causal_alignment=causal_alignment, window=window, scale=scale
    )
    num_query_heads = probs.shape[1]
    k = _repeat_kv_heads(np.abs(np.asarray(k, dtype=np.float64)), num_query_heads)
    v = _repeat_kv_heads(np.abs(np.asarray(v, dtype=np.float64)), num_query_heads)
    score_terms = abs(scale) * (np.abs(np.asarray(q, dtype=np.float64)) @ np.swapaxes(k, -1, -2))
    return probs @ v, np.sum(probs * score_terms, axis=-1)


def attention_backward(
    dout,
    q,
    k,
    v,
    *,
    out=None,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
):
    """(dq, dk, dv) in float64 for the loss <out, dout>, by the softmax-gradient formulas
        dP = dO V^T,  delta = rowsum(dO * O),  dS = P * (dP - delta),
        dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO,
    with dK and dV summed over each key/value head's group of query heads.

    `out` is the forward output the gradient is taken around; pass the (rounded) array a backend
    received so that delta is computed from the same numbers. None recomputes it exactly."""
    parts = _Backward(
        dout,
        q,
        k,
        v,
        out,
        causal=causal,
        causal_alignment=causal_alignment,
        window=window,
        scale=scale,
    )
    return parts.gradients(parts.probs * (parts.dprobs - parts.delta))


def gradient_magnitudes(
    dout,
    q,
    k,
    v,
    *,
    out=None,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
):
    """(dq, dk, dv) evaluated on absolute values: every sum replaced by the sum of the absolute
    values of its terms, including those of dP - delta, which cancel exactly when a row sees one
    key. Floating-point evaluation errors of a sum are bounded relative to these magnitudes,
    not to the (possibly cancelling) result."""
    parts = _Backward(
        dout,
        q,
        k,
        v,
        out,
        causal=causal,
        causal_alignment=causal_alignment,
        window=window,
        scale=scale,
        absolute=True,
    )
    return parts.gradients(parts.probs * (parts.dprobs + parts.delta))


class _Backward:
    """The intermediate tensors both backward functions share, per query head."""

    def __init__(
        self, dout, q, k, v, out, *, causal, causal_alignment, window, scale, absolute=False
    ):
        self.probs, _, self.scale = _probabilities(
            q, k, causal=causal, causal_alignment=causal_alignment, window=window, scale=scale
        )
        num_query_heads = self.probs.shape[1]
        self.num_kv_heads = np.asarray(k).shape[1]
        magnitude = np.abs if absolute else np.asarray
        self.q = magnitude(np.asarray(q, dtype=np.float64))
        self.k = magnitude(_repeat_kv_heads(np.asarray(k, dtype=np.float64), num_query_heads))
        v = _repeat_kv_heads(np.asarray(v, dtype=np.float64), num_query_heads)
        out = self.probs @ v if out is None else np.asarray(out, dtype=np.float64)
        self.dout = magnitude(np.asarray(dout, dtype=np.float64))
        self.dprobs = self.dout @ np.swapaxes(magnitude(v), -1, -2)
        self.delta = np.sum(self.dout * magnitude(out), axis=-1, keepdims=True)
        if absolute:
            self.scale = abs(self.scale)

    def gradients(self, dscores):
        dq = self.scale * (dscores @ self.k)
        dk = self.scale * (np.swapaxes(dscores, -1, -2) @ self.q)
        dv = np.swapaxes(self.probs, -1, -2) @ self.dout
        return dq, _sum_over_groups(dk, self.num_kv_heads), _sum_over_groups(dv, self.num_kv_heads)
