"""mfa_native.flash_attn: Dao-AILab flash-attn 2.8's functions, computed by mfa on torch tensors.

    >>> import torch
    >>> from mfa_native.flash_attn import flash_attn_func  # instead of: from flash_attn import ...
    >>> q = torch.randn(2, 128, 8, 64)                     # [batch, seqlen, nheads, headdim]
    >>> out = flash_attn_func(q, q, q, causal=True)

:func:`flash_attn_func`, :func:`flash_attn_qkvpacked_func` and :func:`flash_attn_kvpacked_func`
take flash-attn's arguments and follow its semantics: ``[batch, seqlen, nheads, headdim]``
tensors, grouped-query attention when k and v have fewer heads, causal masks and sliding windows
anchored bottom-right (query i sits at key position ``i + seqlen_k - seqlen_q``),
``window_size=(-1, -1)`` for no window, ``softmax_scale`` None for ``1 / sqrt(headdim)``, rows
that see no key giving zeros, and ``return_attn_probs=True`` returning
``(out, softmax_lse, S_dmask)`` with softmax_lse float32 ``[batch, nheads, seqlen_q]``. They are
differentiable through :mod:`mfa_native.torch`'s operators (mfa's fused backward, options
carried from the forward) and trace under ``torch.compile``, so code written for flash-attn on
CUDA runs unchanged on CPU tensors, and on a Mac once the metal backend takes MPS tensors.

Beyond flash-attn: float32 as well as float16 and bfloat16, any head dimension, a value head
dimension different from the query's, and any strides (inputs are never copied or padded).
Not yet supported, and refused with NotImplementedError rather than ignored: ``dropout_p > 0``
(mfa has no dropout), ``softcap > 0`` and ``alibi_slopes`` (they need score modifiers, which
have not landed). ``deterministic`` is accepted either way: mfa's backward is always
deterministic. The varlen and KV-cache functions are not provided yet.

What ran where: CPU tensors, forward and backward, are tested on every CI run (Linux); MPS
tensors raise NotImplementedError until libmfa has its device-buffer path (never a silent copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from torch import Tensor

from ._keywords import keyword_hints
from .torch import _attend

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"]

_FLASH_ATTN_NAMES = {
    "is_causal": "flash-attn's name for it is causal= (anchored bottom-right)",
    "scale": "flash-attn's name for it is softmax_scale=",
    "window": "flash-attn's name for it is window_size= ((-1, -1) for no window)",
    "return_lse": "flash-attn returns softmax_lse with return_attn_probs=True",
    "attn_mask": "flash-attn takes no mask: causal= and window_size= express causal and "
    "sliding-window masks",
}

Result = Union[Tensor, tuple[Tensor, Tensor, Tensor]]


def _window_bounds(window_size):
    """flash-attn's (left, right), -1 meaning unbounded (as does any negative side)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    bounds = []
    for side, value in enumerate(window_size):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"window_size[{side}] must be an int, got {type(value).__name__}")
        bounds.append(max(value, -1))
    return bounds[0], bounds[1]


def _real(name, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _flash_attn(
    q,
    k,
    v,
    dropout_p,
    softmax_scale,
    causal,
    window_size,
    softcap,
    alibi_slopes,
    deterministic,
    return_attn_probs,
):
    """The shared body of the three functions once q, k and v are separate [B, N, H, D]
    tensors (views into a packed tensor for the packed functions)."""
    if _real("dropout_p", dropout_p) != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p} is not supported: mfa has no dropout (pass dropout_p=0.0, "
            "as flash-attn asks for evaluation)"
        )
    if _real("softcap", softcap) > 0.0:
        raise NotImplementedError(
            f"softcap={softcap} is not supported by mfa yet (softcapping needs score "
            "modifiers, which have not landed); softcap=0.0 disables it"
        )
    if alibi_slopes is not None:
        raise NotImplementedError(
            "alibi_slopes is not supported by mfa yet (ALiBi needs score modifiers, which have "
            "not landed)"
        )
    for name, flag in (
        ("causal", causal),
        ("deterministic", deterministic),
        ("return_attn_probs", return_attn_probs),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if softmax_scale is not None:
        softmax_scale = _real("softmax_scale", softmax_scale)
    out, softmax_lse = _attend(
        q,
        k,
        v,
        causal,
        "bottom_right",
        *_window_bounds(window_size),
        softmax_scale,
        "bshd",
        None,
    )
    if not return_attn_probs:
        return out
    # flash-attn computes S_dmask only with dropout (it exists to test the dropout pattern) and
    # otherwise returns an empty tensor in its place; without dropout, so does this.
    return out, softmax_lse, q.new_empty((0,))


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
        Must be 0.0 (or negative, which flash-attn also treats as off) for now.
    alibi_slopes : None
        Must be None for now.
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
        q,
        k,
        v,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )


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
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(
            f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}"
        )
    return _flash_attn(
        qkv[:, :, 0],
        qkv[:, :, 1],
        qkv[:, :, 2],
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )


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
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(
            f"kv must have shape (batch, seqlen_k, 2, nheads_k, headdim), got {tuple(kv.shape)}"
        )
    return _flash_attn(
        q,
        kv[:, :, 0],
        kv[:, :, 1],
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )
