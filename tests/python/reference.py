"""A float64 numpy reference for attention, independent of mfa_native.

Everything is materialized (the full score matrix), so use it on test-sized problems only.
Arrays are [B, H, N, D] ("bhsd"); callers convert other layouts before calling. Packed
(variable-length) arrays are [1, H, total, D] and paged caches [num_blocks, Hkv, block_size, D],
as native/include/mfa.h views them.

The rules are those of mfa.h. Query row i has the aligned position p(i) = i + (Nk - Nq)
(bottom-right) or p(i) = i (top-left), and key j is visible when
    (not causal or j <= p(i)) and (left < 0 or j >= p(i) - left)
    and (right < 0 or j <= p(i) + right)
and, with a boolean mask, mask[b, h, i, j] is true. For a visible pair the score is
    s = scale q_i . k_j;  s = softcap tanh(s / softcap);  s -= slope(b, h) |p(i) - j|;
    s += mask[b, h, i, j] (an additive mask)
and over the visible keys of the row, with t_h = sinks[h] (a logit not multiplied by scale; no
term without sinks),
    lse_i = log(exp(t_h) + sum_j exp(s_ij)),  p_ij = exp(s_ij - lse_i),  out_i = sum_j p_ij v_j.
A row without keys gets out = 0 and lse = -inf (t_h with a sink). Masks broadcast over
[B, Hq, Nq, Nk] as numpy broadcasts (missing leading axes, size 1); ALiBi slopes are [Hq] or
[B, Hq], sinks [Hq].

Options shared by every function: causal, causal_alignment, window, scale, mask, softcap,
alibi_slopes, sinks. The backward adds out (the forward output the gradient is taken around)
and return_dsinks.
"""

import numpy as np

ALIGNMENTS = ("bottom_right", "top_left")
# Queries and keys per side of one block of a mask summary (MFA_MASK_BLOCK).
MASK_BLOCK = 64


def window_bounds(window):
    """(left, right) with a negative number for each unbounded side, from None or a pair
    whose entries are None or an int (negative meaning unbounded)."""
    if window is None:
        return -1, -1
    left, right = window
    return (-1 if left is None else left), (-1 if right is None else right)


def _positions(num_queries, num_keys, causal_alignment):
    """p(i) of every query row, [Nq, 1]."""
    if causal_alignment not in ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {ALIGNMENTS}, got {causal_alignment!r}")
    offset = num_keys - num_queries if causal_alignment == "bottom_right" else 0
    return (np.arange(num_queries) + offset)[:, None]


def visible_keys(
    num_queries, num_keys, *, causal=False, causal_alignment="bottom_right", window=None
):
    """Boolean [Nq, Nk]: True where query row i may attend to key j (the causal/window rule)."""
    positions = _positions(num_queries, num_keys, causal_alignment)
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


def alibi_bias(slopes, batch, num_queries, num_keys, causal_alignment="bottom_right"):
    """-slope(b, h) |p(i) - j| as [B, Hq, Nq, Nk], from slopes [Hq] or [B, Hq]."""
    slopes = np.asarray(slopes, dtype=np.float64)
    slopes = np.broadcast_to(
        slopes if slopes.ndim == 2 else slopes[None], (batch, slopes.shape[-1])
    )
    distance = np.abs(
        _positions(num_queries, num_keys, causal_alignment) - np.arange(num_keys)[None, :]
    )
    return -slopes[:, :, None, None] * distance


def broadcast_mask(mask, shape):
    """mask as a rank-4 array broadcast to shape [B, Hq, Nq, Nk]: bool stays bool, anything
    else becomes float64 (an additive mask)."""
    mask = np.asarray(mask)
    mask = mask if mask.dtype == bool else mask.astype(np.float64)
    return np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape), shape)


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


# The options of a dense problem, with mfa_native.attention's defaults, in the order
# options_of returns them: the reference implementations take them as keyword arguments.
OPTIONS = {
    "causal": False,
    "causal_alignment": "bottom_right",
    "window": None,
    "scale": None,
    "mask": None,
    "softcap": None,
    "alibi_slopes": None,
    "sinks": None,
}


def options_of(options):
    """The values of OPTIONS' keywords (the given ones, else the defaults), in OPTIONS' order;
    a TypeError for a keyword that is not among them."""
    unknown = sorted(set(options) - OPTIONS.keys())
    if unknown:
        raise TypeError(f"unexpected options {unknown}")
    return tuple(options.get(name, default) for name, default in OPTIONS.items())


class _Softmax:
    """Scores, probabilities and log-sum-exp of one dense problem with every modifier.

    probs [B, Hq, Nq, Nk] (0 where hidden and on rows that see no key), lse [B, Hq, Nq]
    (-inf on such rows, t_h with a sink), sink_probs [B, Hq, Nq] (exp(t_h - lse), 0 without
    sinks), visible [B, Hq, Nq, Nk] (the causal/window rule and a boolean mask), tanh_slope
    (d capped / d raw score: 1 - tanh^2, or 1 without softcap), bias (ALiBi plus an additive
    mask, where visible) and the scale actually used."""

    def __init__(self, q, k, **options):
        causal, causal_alignment, window, scale, mask, softcap, alibi_slopes, sinks = options_of(
            options
        )
        q = np.asarray(q, dtype=np.float64)
        k = _repeat_kv_heads(np.asarray(k, dtype=np.float64), q.shape[1])
        batch, heads, num_queries, head_dim = q.shape
        num_keys = k.shape[2]
        shape = (batch, heads, num_queries, num_keys)
        self.scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
        raw = self.scale * (q @ np.swapaxes(k, -1, -2))
        if softcap is not None and softcap > 0:
            capped = np.tanh(raw / softcap)
            self.tanh_slope = 1.0 - capped**2
            scores = softcap * capped
        else:
            self.tanh_slope = np.ones(shape)
            scores = raw
        self.visible = np.broadcast_to(
            visible_keys(
                num_queries,
                num_keys,
                causal=causal,
                causal_alignment=causal_alignment,
                window=window,
            ),
            shape,
        )
        bias = np.zeros(shape)
        if alibi_slopes is not None:
            bias = bias + alibi_bias(alibi_slopes, batch, num_queries, num_keys, causal_alignment)
        if mask is not None:
            mask = broadcast_mask(mask, shape)
            if mask.dtype == bool:
                self.visible = self.visible & mask
            else:
                bias = bias + mask
        scores = np.where(self.visible, scores + bias, -np.inf)
        # An additive -inf hides its pair like a false boolean entry.
        self.visible = self.visible & ~np.isneginf(scores)
        self.bias = np.where(self.visible, bias, 0.0)
        # The sink joins the softmax as one more logit per head, with no value.
        sink = np.full((1, heads, 1), -np.inf)
        if sinks is not None:
            sink = np.asarray(sinks, dtype=np.float64).reshape(1, heads, 1)
        row_max = np.maximum(scores.max(axis=-1, initial=-np.inf), sink)[..., None]
        # Rows that see nothing have max -inf; shifting them by 0 keeps exp(-inf) = 0, not NaN.
        row_max = np.where(np.isfinite(row_max), row_max, 0.0)
        weights = np.exp(scores - row_max)
        sink_weight = np.exp(sink[..., None] - row_max)
        total = weights.sum(axis=-1, keepdims=True) + sink_weight
        with np.errstate(divide="ignore", invalid="ignore"):
            self.lse = (row_max + np.log(total))[..., 0]
            self.probs = np.where(total > 0, weights / total, 0.0)
            self.sink_probs = np.where(total > 0, sink_weight / total, 0.0)[..., 0]


def visible_pairs(q, k, **options):
    """Boolean [B, Hq, Nq, Nk]: the pairs that take part in the softmax (the causal/window
    rule, a boolean mask's true entries, an additive mask's entries other than -inf)."""
    return _Softmax(q, k, **options).visible


def attention_forward(q, k, v, **options):
    """(out [B, Hq, Nq, Dv], lse [B, Hq, Nq]) in float64. Rows that see no key: out 0, lse -inf
    (with a sink, lse = t_h)."""
    softmax = _Softmax(q, k, **options)
    v = _repeat_kv_heads(np.asarray(v, dtype=np.float64), softmax.probs.shape[1])
    return softmax.probs @ v, softmax.lse


def forward_magnitudes(q, k, v, **options):
    """Sizes for bounding floating-point errors, 0 on rows that see no key:
    out evaluated on absolute values, P |V| (the sum of the absolute values of its terms), and
    per row [B, Hq, Nq] the P-weighted mean of the size of the terms that make up the scores,
    |scale| |q| |k|^T plus |bias| (ALiBi and an additive mask) plus the softcap (tanh is
    evaluated to a few units of its own size, which a formula through exp does not keep
    relative near 0), and p_sink |t_h|: their rounding errors reach lse, P and everything
    computed from P."""
    softmax = _Softmax(q, k, **options)
    num_query_heads = softmax.probs.shape[1]
    k = _repeat_kv_heads(np.abs(np.asarray(k, dtype=np.float64)), num_query_heads)
    v = _repeat_kv_heads(np.abs(np.asarray(v, dtype=np.float64)), num_query_heads)
    q = np.abs(np.asarray(q, dtype=np.float64))
    score_terms = abs(softmax.scale) * (q @ np.swapaxes(k, -1, -2)) + np.abs(softmax.bias)
    softcap = options.get("softcap")
    if softcap is not None and softcap > 0:
        score_terms += softcap
    score_size = np.sum(softmax.probs * score_terms, axis=-1)
    sinks = options.get("sinks")
    if sinks is not None:
        score_size += softmax.sink_probs * np.abs(np.asarray(sinks, np.float64)).reshape(1, -1, 1)
    return softmax.probs @ v, score_size


def attention_backward(dout, q, k, v, *, out=None, return_dsinks=False, **options):
    """(dq, dk, dv), and dsinks [Hq] with return_dsinks=True, in float64 for the loss
    <out, dout>, by the softmax-gradient formulas
        dP = dO V^T,  delta = rowsum(dO * O),  dS = P * (dP - delta) * (1 - tanh^2),
        dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO,
        dsinks(h) = -sum over b and i of p_sink(b, h, i) delta(b, h, i),
    with dK and dV summed over each key/value head's group of query heads; the tanh factor is
    the softcap's derivative (1 without softcap), masks and slopes are constants.

    `out` is the forward output the gradient is taken around; pass the (rounded) array a backend
    received so that delta is computed from the same numbers. None recomputes it exactly."""
    parts = _Backward(dout, q, k, v, out, options)
    gradients = parts.gradients(parts.probs * (parts.dprobs - parts.delta) * parts.tanh_slope)
    if return_dsinks:
        return (*gradients, -np.sum(parts.sink_probs * parts.delta[..., 0], axis=(0, 2)))
    return gradients


def gradient_magnitudes(dout, q, k, v, *, out=None, return_dsinks=False, **options):
    """(dq, dk, dv) (and dsinks) evaluated on absolute values: every sum replaced by the sum of
    the absolute values of its terms, including those of dP - delta, which cancel exactly when
    a row sees one key. Floating-point evaluation errors of a sum are bounded relative to these
    magnitudes, not to the (possibly cancelling) result."""
    parts = _Backward(dout, q, k, v, out, options, absolute=True)
    gradients = parts.gradients(parts.probs * (parts.dprobs + parts.delta) * parts.tanh_slope)
    if return_dsinks:
        return (*gradients, np.sum(parts.sink_probs * parts.delta[..., 0], axis=(0, 2)))
    return gradients


class _Backward:
    """The intermediate tensors both backward functions share, per query head."""

    def __init__(self, dout, q, k, v, out, options, absolute=False):
        softmax = _Softmax(q, k, **options)
        self.probs, self.sink_probs = softmax.probs, softmax.sink_probs
        self.tanh_slope = softmax.tanh_slope
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
        self.scale = abs(softmax.scale) if absolute else softmax.scale

    def gradients(self, dscores):
        dq = self.scale * (dscores @ self.k)
        dk = self.scale * (np.swapaxes(dscores, -1, -2) @ self.q)
        dv = np.swapaxes(self.probs, -1, -2) @ self.dout
        return dq, _sum_over_groups(dk, self.num_kv_heads), _sum_over_groups(dv, self.num_kv_heads)


# ---- packed variable-length batches --------------------------------------------------------


def sequence_options(options, b, num_queries, num_keys):
    """The options of sequence (or batch entry) b of a packed or paged problem: its row of the
    ALiBi slopes and its slice of the mask (axes of size 1 stay broadcast), everything else as
    given. The mask is indexed (b, h, i, j) with the sequence's own i and j."""
    sequence = dict(options)
    mask = options.get("mask")
    if mask is not None:
        mask = np.asarray(mask)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        mask = mask[b if mask.shape[0] > 1 else 0]
        rows = slice(None) if mask.shape[1] == 1 else slice(num_queries)
        columns = slice(None) if mask.shape[2] == 1 else slice(num_keys)
        sequence["mask"] = mask[None, :, rows, columns]
    slopes = options.get("alibi_slopes")
    if slopes is not None and np.ndim(slopes) == 2:
        slopes = np.asarray(slopes)
        sequence["alibi_slopes"] = slopes[b if slopes.shape[0] > 1 else 0]
    return sequence


def _offsets(cu_seqlens):
    return [int(x) for x in np.asarray(cu_seqlens).reshape(-1)]


def varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, **options):
    """Packed sequences: q [1, Hq, total_q, D], k and v [1, Hkv, total_k, .]; sequence b has
    the query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 and the key rows of cu_seqlens_k
    likewise, and is attended on its own with every rule applied to its local rows and keys
    (its own alignment). Returns (out [1, Hq, total_q, Dv], lse [1, Hq, total_q])."""
    cu_q, cu_k = _offsets(cu_seqlens_q), _offsets(cu_seqlens_k)
    heads, total_q = q.shape[1], q.shape[2]
    out = np.zeros((1, heads, total_q, v.shape[3]))
    lse = np.full((1, heads, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        sequence = sequence_options(options, b, rows.stop - rows.start, keys.stop - keys.start)
        out[:, :, rows], lse[:, :, rows] = attention_forward(
            q[:, :, rows], k[:, :, keys], v[:, :, keys], **sequence
        )
    return out, lse


def varlen_attention_backward(
    dout, q, k, v, cu_seqlens_q, cu_seqlens_k, *, out=None, return_dsinks=False, **options
):
    """(dq, dk, dv) (and dsinks) of varlen_attention_forward, packed like q, k and v, each
    sequence's gradients from its own rows and keys; dsinks summed over the sequences."""
    cu_q, cu_k = _offsets(cu_seqlens_q), _offsets(cu_seqlens_k)
    dq, dk, dv = (np.zeros(x.shape) for x in (q, k, v))
    dsinks = np.zeros(q.shape[1])
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        sequence = sequence_options(options, b, rows.stop - rows.start, keys.stop - keys.start)
        gradients = attention_backward(
            dout[:, :, rows],
            q[:, :, rows],
            k[:, :, keys],
            v[:, :, keys],
            out=None if out is None else out[:, :, rows],
            return_dsinks=True,
            **sequence,
        )
        dq[:, :, rows], dk[:, :, keys], dv[:, :, keys] = gradients[:3]
        dsinks += gradients[3]
    return (dq, dk, dv, dsinks) if return_dsinks else (dq, dk, dv)


# ---- paged KV caches -----------------------------------------------------------------------


def append_to_cache(cache, block_table, cache_seqlens, new):
    """A copy of cache [num_blocks, Hkv, block_size, D] with new [B, Hkv, N_new, D] written as
    keys cache_seqlens[b] .. cache_seqlens[b] + N_new - 1 of each sequence b: key j of
    sequence b is row j % block_size of block block_table[b, j // block_size]."""
    cache = np.array(cache, dtype=np.float64)
    block_size = cache.shape[2]
    table = np.asarray(block_table).reshape(len(block_table), -1)
    for b, start in enumerate(np.asarray(cache_seqlens).reshape(-1)):
        for t in range(new.shape[2]):
            j = int(start) + t
            cache[table[b, j // block_size], :, j % block_size] = new[b, :, t]
    return cache


def gather_keys(cache, block_table, b, num_keys):
    """The first num_keys keys of sequence b as [1, Hkv, num_keys, D], gathered by its row of
    the block table."""
    block_size = cache.shape[2]
    blocks = np.asarray(block_table).reshape(len(block_table), -1)[b]
    rows = [cache[blocks[j // block_size], :, j % block_size] for j in range(num_keys)]
    return (
        np.stack(rows, axis=1)[None] if rows else np.zeros((1, cache.shape[1], 0, cache.shape[3]))
    )


def scatter_keys(keys, lengths, block_size, num_blocks, order, fill=np.nan):
    """The inverse of gather_keys, for building caches: the first lengths[b] keys of each
    sequence's keys[b] ([B, Hkv, N, D]) written into blocks taken in the given order (a
    permutation of the block ids), every other row fill. Returns (cache
    [num_blocks, Hkv, block_size, D] of keys' dtype, block_table int32 [B, max_blocks] with -1
    in the entries past each sequence's blocks, which are never read)."""
    batch, heads, length, dim = keys.shape
    max_blocks = max(-(-length // block_size), 1)
    table = np.full((batch, max_blocks), -1, dtype=np.int32)
    cache = np.full((num_blocks, heads, block_size, dim), fill, dtype=keys.dtype)
    blocks = iter(order)
    for b, n in enumerate(lengths):
        for block in range(-(-n // block_size)):
            table[b, block] = next(blocks)
        for j in range(n):
            cache[table[b, j // block_size], :, j % block_size] = keys[b, :, j]
    return cache, table


def paged_attention_forward(
    q, k_cache, v_cache, block_table, cache_seqlens, *, k_new=None, v_new=None, **options
):
    """A paged KV cache (mfa.h's, flash-attn's flash_attn_with_kvcache): q [B, Hq, Nq, D],
    caches [num_blocks, Hkv, block_size, D], block_table [B, max_blocks], cache_seqlens [B];
    k_new and v_new [B, Hkv, N_new, .] are first appended at cache_seqlens. Sequence b attends
    over its Nk_b = cache_seqlens[b] + N_new keys, aligned against its Nq queries, a mask being
    indexed with the local key j. Returns (out, lse, k_cache, v_cache): the caches after the
    appends (copies, in float64)."""
    lengths = [int(x) for x in np.asarray(cache_seqlens).reshape(-1)]
    if k_new is not None:
        k_cache = append_to_cache(k_cache, block_table, lengths, k_new)
        v_cache = append_to_cache(v_cache, block_table, lengths, v_new)
        lengths = [n + k_new.shape[2] for n in lengths]
    batch, heads, num_queries = q.shape[:3]
    out = np.zeros((batch, heads, num_queries, v_cache.shape[3]))
    lse = np.full((batch, heads, num_queries), -np.inf)
    for b, num_keys in enumerate(lengths):
        sequence = sequence_options(options, b, num_queries, num_keys)
        out[b : b + 1], lse[b : b + 1] = attention_forward(
            q[b : b + 1],
            gather_keys(k_cache, block_table, b, num_keys),
            gather_keys(v_cache, block_table, b, num_keys),
            **sequence,
        )
    return out, lse, np.asarray(k_cache, np.float64), np.asarray(v_cache, np.float64)


# ---- partial states and mask summaries ------------------------------------------------------


def merge_states(outs, lses):
    """mfa_attention_merge in float64: parts (outs[i] [B, H, N, Dv], lses[i] [B, H, N]) of the
    same queries over disjoint keys, combined per row with m = max_i lses[i] as
        w_i = exp(lses[i] - m),  out = sum_i w_i outs[i] / sum_i w_i,  lse = m + log(sum_i w_i).
    A part with lse -inf contributes nothing and its out is not read; a row no part saw gets
    out 0 and lse -inf; a NaN or +inf lse makes the row's out and lse NaN."""
    outs = [np.asarray(x, dtype=np.float64) for x in outs]
    lses = np.stack([np.asarray(x, dtype=np.float64) for x in lses])
    broken = np.any(np.isnan(lses) | np.isposinf(lses), axis=0)
    largest = np.max(np.where(broken, 0.0, lses), axis=0)
    seen = np.isfinite(largest)
    shift = np.where(seen, largest, 0.0)
    weights = np.exp(np.where(np.isneginf(lses), -np.inf, lses - shift))
    total = weights.sum(axis=0)
    out = np.zeros(outs[0].shape)
    for weight, lse, part in zip(weights, lses, outs):
        out += np.where(np.isneginf(lse)[..., None], 0.0, weight[..., None] * part)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(seen[..., None], out / total[..., None], 0.0)
        lse = np.where(seen, shift + np.log(total), -np.inf)
    out[broken] = np.nan
    lse[broken] = np.nan
    return out, lse


def mask_summary(mask, seq_q, seq_k):
    """mfa_mask_summarize's codes for a numpy mask broadcastable to [M0, M1, seq_q, seq_k]:
    uint8 [S0, S1, ceil(seq_q / 64), ceil(seq_k / 64)], S0 = M0 or 1 where the mask is the same
    for every batch (size 1 or stride 0), S1 likewise for the heads. Per block of 64 x 64
    queries and keys (cut at seq_q and seq_k): 0 every pair hidden (false, or -inf), 2 every
    pair visible with nothing added (true, or 0), 1 anything else."""
    mask = np.asarray(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape) if mask.ndim < 4 else mask
    sizes = [1 if mask.shape[a] == 1 or mask.strides[a] == 0 else mask.shape[a] for a in (0, 1)]
    full = np.broadcast_to(mask, (mask.shape[0], mask.shape[1], seq_q, seq_k))[
        : sizes[0], : sizes[1]
    ]
    if mask.dtype == bool:
        hidden, untouched = ~full, full
    else:
        values = full.astype(np.float64)
        hidden, untouched = np.isneginf(values), values == 0
    rows, columns = -(-seq_q // MASK_BLOCK), -(-seq_k // MASK_BLOCK)
    codes = np.ones((*sizes, rows, columns), dtype=np.uint8)
    for r in range(rows):
        for c in range(columns):
            block = (
                slice(None),
                slice(None),
                slice(r * MASK_BLOCK, (r + 1) * MASK_BLOCK),
                slice(c * MASK_BLOCK, (c + 1) * MASK_BLOCK),
            )
            codes[:, :, r, c][np.all(hidden[block], axis=(2, 3))] = 0
            codes[:, :, r, c][np.all(untouched[block], axis=(2, 3))] = 2
    return codes
