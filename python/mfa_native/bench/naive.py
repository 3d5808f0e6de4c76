"""Attention as straightforward numpy code computes it: the whole N x N score matrix in memory.

The benchmark's "numpy" peer and ``python -m mfa_native demo`` both use it, as the baseline that
shows what mfa saves in time and memory. It follows mfa's semantics (``mfa_native.attention``):
grouped-query heads, causal and sliding-window masks in either alignment, a row that sees no key
gives ``out = 0`` and ``lse = -inf`` and zero gradients. It computes in the dtype of its inputs
(float32 in both users). It is not the tests' reference: that one is float64
(tests/python/reference.py).
"""

import numpy as np

__all__ = ["attention", "attention_backward"]


def _visible(seq_q, seq_k, causal, window, alignment):
    """The (seq_q, seq_k) boolean mask of visible pairs, or None when every pair is visible."""
    if not causal and window is None:
        return None
    offset = seq_k - seq_q if alignment == "bottom_right" else 0
    position = np.arange(seq_q)[:, None] + offset  # the key position query row i aligns with
    keys = np.arange(seq_k)[None, :]
    visible = np.ones((seq_q, seq_k), bool)
    if causal:
        visible &= keys <= position
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= keys >= position - left
        if right >= 0:
            visible &= keys <= position + right
    return visible


def _by_group(q, kv):
    """q as (B, Hkv, G, Nq, D), each key/value head's G query heads together, and k or v as
    (B, Hkv, 1, Nk, D): matmul broadcasts the two without copying k and v for each group."""
    batch, heads, seq_q, dim = q.shape
    kv_heads = kv.shape[1]
    return q.reshape(batch, kv_heads, heads // kv_heads, seq_q, dim), kv[:, :, None]


def _scores(q, k, scale, visible):
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    return scores if visible is None else np.where(visible, scores, -np.inf)


def attention(q, k, v, scale, causal=False, window=None, alignment="bottom_right"):
    """(out, lse) of softmax(scale * q k^T) v for q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D)."""
    grouped, k = _by_group(q, k)
    v = v[:, :, None]
    scores = _scores(grouped, k, scale, _visible(q.shape[2], k.shape[3], causal, window, alignment))
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0)  # a row that sees no key
    weights = np.exp(scores - row_max)
    row_sum = weights.sum(axis=-1, keepdims=True)
    seen = row_sum > 0
    out = (weights / np.where(seen, row_sum, 1)) @ v
    lse = np.where(seen, row_max + np.log(np.where(seen, row_sum, 1)), -np.inf)[..., 0]
    return out.reshape(q.shape[:3] + v.shape[-1:]), lse.reshape(q.shape[:3])


def attention_backward(
    dout, q, k, v, out, lse, scale, causal=False, window=None, alignment="bottom_right"
):
    """(dq, dk, dv) of attention's output, given its out and lse; dk and dv summed over the
    query heads of each key/value head."""
    grouped, k_grouped = _by_group(q, k)
    shape = grouped.shape[:4]
    dout, out = dout.reshape(shape + dout.shape[-1:]), out.reshape(shape + out.shape[-1:])
    lse = lse.reshape(shape)
    visible = _visible(q.shape[2], k.shape[2], causal, window, alignment)
    # scores stays alive to the end, as in straightforward numpy code: part of the naive peak.
    scores = _scores(grouped, k_grouped, scale, visible)
    probabilities = np.exp(scores - np.where(np.isfinite(lse), lse, 0)[..., None])
    dv = (np.swapaxes(probabilities, -1, -2) @ dout).sum(axis=2)
    delta = np.sum(dout * out, axis=-1, keepdims=True)
    dscores = probabilities * (dout @ np.swapaxes(v[:, :, None], -1, -2) - delta)
    dq = scale * (dscores @ k_grouped)
    dk = scale * (np.swapaxes(dscores, -1, -2) @ grouped).sum(axis=2)
    return dq.reshape(q.shape), dk, dv
