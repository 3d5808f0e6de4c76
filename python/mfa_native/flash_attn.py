"""mfa_native.flash_attn: Dao-AILab flash-attn 2.8's functions, computed by mfa on torch tensors.

    >>> import torch
    >>> from mfa_native.flash_attn import flash_attn_func  # instead of: from flash_attn import ...
    >>> q = torch.randn(2, 128, 8, 64)                     # [batch, seqlen, nheads, headdim]
    >>> out = flash_attn_func(q, q, q, causal=True)

:func:`flash_attn_func`, :func:`flash_attn_qkvpacked_func`, :func:`flash_attn_kvpacked_func`,
:func:`flash_attn_varlen_func` and :func:`flash_attn_with_kvcache` take flash-attn's arguments
and follow its semantics: ``[batch, seqlen, nheads, headdim]`` tensors (``[total, nheads,
headdim]`` packed, with int32 ``cu_seqlens``), grouped-query attention when k and v have fewer
heads, causal masks, sliding windows and ALiBi anchored bottom-right (query i sits at key
position ``i + seqlen_k - seqlen_q``, per sequence), ``window_size=(-1, -1)`` for no window,
``softcap`` 0.0 for none, ``softmax_scale`` None for ``1 / sqrt(headdim)``, rows that see no key
giving zeros, and ``return_attn_probs=True`` returning ``(out, softmax_lse, S_dmask)`` with
softmax_lse float32 ``[batch, nheads, seqlen_q]`` (``[nheads, total_q]`` packed). All but the
KV-cache function are differentiable through :mod:`mfa_native.torch`'s operators (mfa's fused
backward, options carried from the forward) and trace under ``torch.compile``, so code written
for flash-attn on CUDA runs unchanged on CPU tensors and on MPS tensors. As in flash-attn,
``alibi_slopes`` get no gradient and :func:`flash_attn_with_kvcache` has no backward.

Beyond flash-attn: float32 as well as float16 and bfloat16, any head dimension, a value head
dimension different from the query's, any strides (inputs are never copied or padded), and
paged caches with blocks of any multiple of 8 rows up to 256 (flash-attn's multiples of 256 are
read as blocks of 256). Refused with NotImplementedError rather than ignored: ``dropout_p > 0``
(mfa has no dropout), rotary embeddings and ``cache_leftpad`` in the KV-cache function, and a
``block_table`` with packed sequences. ``deterministic`` and ``num_splits`` are accepted: mfa's
backward is always deterministic, and it splits the keys of a decoding step itself. Which
backends compute softcap, ALiBi, packed sequences and paged caches is in
``mfa_native.Context(...).capabilities``; elsewhere they raise MFAError UNSUPPORTED.

What ran where: CPU tensors are tested on every CI run (Linux); MPS tensors go to the metal
backend's device buffers as in :mod:`mfa_native.torch` (awaiting a Mac; without the metal
backend they raise NotImplementedError, never a silent copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from torch import Tensor

from . import _attention
from ._keywords import keyword_hints
from .torch import _attend, _options, attention_varlen

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
]

_FLASH_ATTN_NAMES = {
    "is_causal": "flash-attn's name for it is causal= (anchored bottom-right)",
    "scale": "flash-attn's name for it is softmax_scale=",
    "window": "flash-attn's name for it is window_size= ((-1, -1) for no window)",
    "return_lse": "flash-attn returns softmax_lse with return_attn_probs=True",
    "attn_mask": "flash-attn takes no mask: causal= and window_size= express causal and "
    "sliding-window masks (mfa_native.attention takes mask=)",
    "mask": "flash-attn takes no mask (mfa_native.attention takes mask=)",
    "sinks": "flash-attn 2 has no attention sinks (mfa_native.attention takes sinks=)",
}

Result = Union[Tensor, tuple[Tensor, Tensor, Tensor]]
# mfa's causal, window, scale, softcap and ALiBi slopes, from flash-attn's options (_translate).
_Translated = tuple[
    bool, Optional[tuple[int, int]], Optional[float], Optional[float], Optional[Tensor]
]


def _window_bounds(window_size: Any) -> tuple[int, int] | None:
    """flash-attn's (left, right), -1 meaning unbounded (as does any negative side); None for
    a window unbounded on both sides."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = window_size
    if type(left) is not int or type(right) is not int:  # bool is not int here, as below
        for side, value in enumerate(window_size):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"window_size[{side}] must be an int, got {type(value).__name__}")
    if left < 0 and right < 0:
        return None
    return max(left, -1), max(right, -1)


def _real(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _translate(
    dropout_p: Any,
    softmax_scale: Any,
    causal: Any,
    window_size: Any,
    softcap: Any,
    alibi_slopes: Any,
    deterministic: Any,
) -> _Translated:
    """mfa's (causal, window, scale, softcap, alibi_slopes) for flash-attn's options, which
    every function shares. Floats that are floats already skip their conversion, and the result
    is a tuple rather than keywords: a small call spends more time on its options than in mfa's
    kernel otherwise."""
    if type(dropout_p) is not float:
        dropout_p = _real("dropout_p", dropout_p)
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p} is not supported: mfa has no dropout (pass dropout_p=0.0, "
            "as flash-attn asks for evaluation)"
        )
    _flag("deterministic", deterministic)
    if type(softcap) is not float:
        softcap = _real("softcap", softcap)
    if softmax_scale is not None and type(softmax_scale) is not float:
        softmax_scale = _real("softmax_scale", softmax_scale)
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor):
            raise TypeError(
                f"alibi_slopes must be None or a torch.Tensor, got {type(alibi_slopes).__name__}"
            )
        # flash-attn computes no gradient for the slopes; neither does mfa.
        alibi_slopes = alibi_slopes.detach()
    # flash-attn's softcap of 0.0 (or less) turns softcapping off.
    return (
        _flag("causal", causal),
        _window_bounds(window_size),
        softmax_scale,
        softcap if softcap > 0.0 else None,
        alibi_slopes,
    )


def _keywords(translated: _Translated) -> dict[str, Any]:
    """_translate's options as mfa_native's keyword arguments (causal anchored bottom-right)."""
    causal, window, scale, softcap, alibi_slopes = translated
    return {
        "causal": causal,
        "causal_alignment": "bottom_right",
        "window": window,
        "scale": scale,
        "softcap": softcap,
        "alibi_slopes": alibi_slopes,
    }


def _results(out: Tensor, softmax_lse: Tensor | None, return_attn_probs: Any) -> Result:
    """out, or flash-attn's (out, softmax_lse, S_dmask): S_dmask exists to test the dropout
    pattern, and flash-attn returns an empty tensor in its place without dropout, as does this."""
    if not _flag("return_attn_probs", return_attn_probs):
        return out
    assert softmax_lse is not None  # computed where return_attn_probs asks for it
    return out, softmax_lse, out.new_empty((0,))


def _flash_attn(q: Tensor, k: Tensor, v: Tensor, return_attn_probs: Any, *flash: Any) -> Result:
    """The shared body of the three dense functions once q, k and v are separate [B, N, H, D]
    tensors (views into a packed tensor for the packed functions); flash: dropout_p,
    softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic."""
    causal, window, scale, softcap, alibi_slopes = _translate(*flash)
    options = _options(
        causal, "bottom_right", window, scale, None, None, softcap, alibi_slopes, None, "bshd"
    )
    probabilities = _flag("return_attn_probs", return_attn_probs)
    out, softmax_lse = _attend(q, k, v, options, probabilities)
    return _results(out, softmax_lse, probabilities)


@keyword_hints(_FLASH_ATTN_NAMES)
def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Result:
    """flash-attn's ``flash_attn_func``, computed by mfa.

    Parameters
    ----------
    q : Tensor, shape (batch, seqlen_q, nheads, headdim)
    k : Tensor, shape (batch, seqlen_k, nheads_k, headdim)
        nheads must be a multiple of nheads_k: query head h reads key/value head
        ``h // (nheads // nheads_k)``.
    v : Tensor, shape (batch, seqlen_k, nheads_k, headdim_v)
    dropout_p : float
        Must be 0.0 (mfa has no dropout).
    softmax_scale : float, optional
        Multiplies ``q @ k^T``; None means ``1 / sqrt(headdim)``.
    causal : bool
        Query i sees keys up to ``i + seqlen_k - seqlen_q`` (bottom-right).
    window_size : (left, right)
        Query i sees keys ``i + seqlen_k - seqlen_q - left .. i + seqlen_k - seqlen_q + right``;
        -1 leaves a side unbounded. Combined with causal by intersection.
    softcap : float
        Scores become ``softcap * tanh(score / softcap)`` (right after scaling); 0.0 (or
        less) for none.
    alibi_slopes : Tensor of float32, shape (nheads,) or (batch, nheads), optional
        Adds ``-slope * |i + seqlen_k - seqlen_q - j|`` to the score of query i and key j. No
        gradient, as in flash-attn.
    deterministic : bool
        Accepted; mfa's backward is always deterministic.
    return_attn_probs : bool
        Also return softmax_lse and flash-attn's S_dmask placeholder.

    Returns
    -------
    out : Tensor, shape (batch, seqlen_q, nheads, headdim_v)
    softmax_lse : Tensor of float32, shape (batch, nheads, seqlen_q)
        With ``return_attn_probs=True``: the natural-log log-sum-exp of each row of the scaled
        scores (``-inf`` for rows that see no key). It carries no gradient.
    S_dmask : Tensor, shape (0,)
        With ``return_attn_probs=True``: empty, as flash-attn returns it without dropout.
    """
    return _flash_attn(
        q, k, v, return_attn_probs, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic,
    )  # fmt: skip


def _unpack(name: str, packed: Tensor, count: int, shape: str) -> tuple[Tensor, ...]:
    """The `count` views of a packed tensor along its axis 2 (its shape in words), in place."""
    if packed.dim() != 5 or packed.shape[2] != count:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(packed.shape)}")
    return packed.unbind(2)


@keyword_hints(_FLASH_ATTN_NAMES)
def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Result:
    """flash-attn's ``flash_attn_qkvpacked_func``: :func:`flash_attn_func` on
    ``qkv`` of shape (batch, seqlen, 3, nheads, headdim), read in place as three views."""
    q, k, v = _unpack("qkv", qkv, 3, "(batch, seqlen, 3, nheads, headdim)")
    return _flash_attn(
        q, k, v, return_attn_probs, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic,
    )  # fmt: skip


@keyword_hints(_FLASH_ATTN_NAMES)
def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Result:
    """flash-attn's ``flash_attn_kvpacked_func``: :func:`flash_attn_func` on q and
    ``kv`` of shape (batch, seqlen_k, 2, nheads_k, headdim), read in place as two views."""
    k, v = _unpack("kv", kv, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return _flash_attn(
        q, k, v, return_attn_probs, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic,
    )  # fmt: skip


@keyword_hints(_FLASH_ATTN_NAMES)
def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Tensor | None = None,
) -> Result:
    """flash-attn's ``flash_attn_varlen_func``: packed sequences of different lengths.

    Parameters
    ----------
    q : Tensor, shape (total_q, nheads, headdim)
        Every sequence's queries one after the other: sequence b has rows
        ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1``.
    k : Tensor, shape (total_k, nheads_k, headdim)
    v : Tensor, shape (total_k, nheads_k, headdim_v)
    cu_seqlens_q, cu_seqlens_k : Tensor of int32, shape (batch + 1,)
        The offsets of the sequences: 0, never decreasing, ending at total_q (total_k).
    max_seqlen_q, max_seqlen_k : int
        Bounds on the sequences' lengths.
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        As for :func:`flash_attn_func`, within each sequence (causal and the window aligned
        with its own lengths).
    return_attn_probs : bool
        Also return softmax_lse, float32 (nheads, total_q), and the S_dmask placeholder.
    block_table : None
        Paged caches with packed queries are not supported (NotImplementedError): use
        :func:`flash_attn_with_kvcache`.

    Returns
    -------
    out : Tensor, shape (total_q, nheads, headdim_v)
        Differentiable (mfa's fused backward), as is the whole call.
    """
    if block_table is not None:
        raise NotImplementedError(
            "flash_attn_varlen_func(block_table=...) is not supported: mfa reads paged KV "
            "caches with dense queries only (flash_attn_with_kvcache)"
        )
    keywords = _keywords(
        _translate(
            dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        )
    )
    out, softmax_lse = attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **keywords,
        return_lse=True,
    )  # fmt: skip
    return _results(out, softmax_lse, return_attn_probs)


# mfa's paged caches have blocks of a multiple of 8 rows, at most this many.
_MAX_BLOCK = 256


def _dense_cache_as_blocks(
    k_cache: Tensor, v_cache: Tensor, batch: int, cache_batch_idx: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """A dense cache (batch_cache, seqlen_cache, nheads_k, headdim) as views of blocks of its
    rows, with the block table that gives sequence b the rows of cache entry
    cache_batch_idx[b] (or b): no copy."""
    batch_cache, seqlen = k_cache.shape[0], k_cache.shape[1]
    block = next((size for size in range(_MAX_BLOCK, 0, -8) if seqlen % size == 0), None)
    if block is None:
        raise NotImplementedError(
            f"a dense KV cache of seqlen_cache = {seqlen} keys: mfa reads caches in blocks of "
            f"a multiple of 8 rows (up to {_MAX_BLOCK}), so seqlen_cache must be a multiple of 8"
        )
    per_entry = seqlen // block
    try:
        k_blocks = k_cache.view(batch_cache * per_entry, block, *k_cache.shape[2:])
        v_blocks = v_cache.view(batch_cache * per_entry, block, *v_cache.shape[2:])
    except RuntimeError as error:
        raise NotImplementedError(
            "the dense KV cache's batch and sequence axes cannot be viewed as one axis of "
            f"blocks without a copy ({error}); give it contiguous rows per batch entry"
        ) from None
    if cache_batch_idx is None:
        if batch > batch_cache:
            raise ValueError(
                f"k_cache has {batch_cache} entries for a batch of {batch} (cache_batch_idx "
                "chooses entries for a larger batch)"
            )
        entries = torch.arange(batch, dtype=torch.int32)
    else:
        entries = cache_batch_idx.to(torch.int32)
        if entries.shape != (batch,) or not bool(((entries >= 0) & (entries < batch_cache)).all()):
            raise ValueError(
                f"cache_batch_idx must hold {batch} entries in [0, {batch_cache}), got "
                f"{cache_batch_idx.tolist()}"
            )
    table = entries[:, None] * per_entry + torch.arange(per_entry, dtype=torch.int32)[None]
    return k_blocks, v_blocks, table.to(torch.int32)


def _reblocked(
    k_cache: Tensor, v_cache: Tensor, block_table: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """flash-attn's paged cache as mfa reads it: pages of a multiple of 8 rows up to 256 as
    they are, larger pages of a multiple of 256 as runs of 256-row blocks (a view)."""
    page = k_cache.shape[1]
    if page % 8 == 0 and page <= _MAX_BLOCK:
        return k_cache, v_cache, block_table
    if page % _MAX_BLOCK:
        raise NotImplementedError(
            f"a paged KV cache with page_block_size = {page}: mfa reads blocks of a multiple "
            f"of 8 rows up to {_MAX_BLOCK}, and larger pages of a multiple of {_MAX_BLOCK}"
        )
    split = page // _MAX_BLOCK
    k_blocks = k_cache.view(k_cache.shape[0] * split, _MAX_BLOCK, *k_cache.shape[2:])
    v_blocks = v_cache.view(v_cache.shape[0] * split, _MAX_BLOCK, *v_cache.shape[2:])
    runs = block_table.to(torch.int32)[:, :, None] * split + torch.arange(split, dtype=torch.int32)
    return k_blocks, v_blocks, runs.reshape(block_table.shape[0], -1)


@keyword_hints(_FLASH_ATTN_NAMES)
def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None = None,
    v: Tensor | None = None,
    rotary_cos: Tensor | None = None,
    rotary_sin: Tensor | None = None,
    cache_seqlens: int | Tensor | None = None,
    cache_batch_idx: Tensor | None = None,
    cache_leftpad: Tensor | None = None,
    block_table: Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """flash-attn's ``flash_attn_with_kvcache``: decoding (or chunked prefill) over a KV cache,
    after writing new keys and values into it in place. No backward, as in flash-attn: the
    result carries no gradient.

    Parameters
    ----------
    q : Tensor, shape (batch, seqlen_q, nheads, headdim)
    k_cache, v_cache : Tensor
        (batch_cache, seqlen_cache, nheads_k, headdim) without ``block_table`` (seqlen_cache a
        multiple of 8, each entry's rows contiguous), or (num_blocks, page_block_size,
        nheads_k, headdim) with it (page_block_size a multiple of 8 up to 256, or of 256).
    k, v : Tensor, shape (batch, seqlen_new, nheads_k, headdim), optional
        New keys and values, written into the caches at ``cache_seqlens`` before attending.
    rotary_cos, rotary_sin, cache_leftpad : None
        Not supported (NotImplementedError): apply rotary embeddings to q and k first.
    cache_seqlens : int or Tensor of int32, shape (batch,), optional
        The keys already in each sequence's cache; None for the whole cache.
    cache_batch_idx : Tensor of int, shape (batch,), optional
        The cache entry of each sequence (dense caches only); None for 0 .. batch - 1.
    block_table : Tensor of int32, shape (batch, max_num_blocks_per_seq), optional
        The pages of each sequence (a paged cache).
    softmax_scale, causal, window_size, softcap, alibi_slopes
        As for :func:`flash_attn_func`, aligned with each sequence's
        ``cache_seqlens + seqlen_new`` keys.
    rotary_interleaved, num_splits
        Accepted; mfa splits the keys of a decoding step itself.
    return_softmax_lse : bool
        Also return softmax_lse, float32 (batch, nheads, seqlen_q).

    Returns
    -------
    out : Tensor, shape (batch, seqlen_q, nheads, headdim)
    softmax_lse : Tensor of float32, shape (batch, nheads, seqlen_q)
        Only with ``return_softmax_lse=True``.
    """
    for name, value in (
        ("rotary_cos", rotary_cos),
        ("rotary_sin", rotary_sin),
        ("cache_leftpad", cache_leftpad),
    ):
        if value is not None:
            raise NotImplementedError(
                f"flash_attn_with_kvcache({name}=...) is not supported by mfa: apply rotary "
                "embeddings to q and k before the call, and give left-padded caches as paged "
                "ones"
            )
    _flag("rotary_interleaved", rotary_interleaved)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool):
        raise TypeError(f"num_splits must be an int, got {type(num_splits).__name__}")
    keywords = _keywords(
        _translate(0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False)
    )
    batch = q.shape[0]
    if block_table is None:
        k_blocks, v_blocks, table = _dense_cache_as_blocks(k_cache, v_cache, batch, cache_batch_idx)
    else:
        if cache_batch_idx is not None:
            raise ValueError(
                "cache_batch_idx is given with block_table: the block table chooses each "
                "sequence's blocks"
            )
        k_blocks, v_blocks, table = _reblocked(k_cache, v_cache, block_table)
    if cache_seqlens is None:
        if k is not None:
            raise ValueError(
                "k and v are given without cache_seqlens: the whole cache is in use, so there "
                "is no room to append to"
            )
        cache_seqlens = table.shape[1] * k_blocks.shape[1]
    if isinstance(cache_seqlens, Tensor):
        lengths = cache_seqlens
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        lengths = torch.full((batch,), cache_seqlens, dtype=torch.int32)
    else:
        raise TypeError(
            "cache_seqlens must be None, an int or an int32 tensor, got "
            f"{type(cache_seqlens).__name__}"
        )
    # flash-attn computes no gradient here; neither does this (the inputs are read as data).
    k_new = None if k is None else k.detach()
    v_new = None if v is None else v.detach()
    out, softmax_lse = _attention.attention_with_kvcache(
        q.detach(), k_blocks, v_blocks, table, lengths, k_new, v_new, **keywords, layout="bshd",
        return_lse=True,
    )  # fmt: skip
    return (out, softmax_lse) if _flag("return_softmax_lse", return_softmax_lse) else out
