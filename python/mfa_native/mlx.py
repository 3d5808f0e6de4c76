"""mfa_native.mlx: mfa attention on MLX arrays, with mfa's fused backward for mx.grad.

    >>> import mlx.core as mx, mfa_native.mlx as mfa_mlx
    >>> q = mx.random.normal((1, 8, 256, 64))
    >>> out = mfa_mlx.scaled_dot_product_attention(q, q, q, scale=64**-0.5, mask="causal")
    >>> grad = mx.grad(lambda q: mfa_mlx.scaled_dot_product_attention(
    ...     q, q, q, scale=0.125, mask="causal").sum())(q)

:func:`scaled_dot_product_attention` takes ``mx.fast.scaled_dot_product_attention``'s arguments
and follows its semantics (``[B, H, N, D]``, grouped-query attention when k and v have fewer
heads, ``mask="causal"`` anchored bottom-right: the last query sees the last key);
:func:`attention` is mfa's own interface (sliding windows, either causal alignment). Both are
``mx.custom_function``s whose VJP is mfa's fused backward, which MLX's own attention lacks
(it differentiates an unfused composition that materialises the scores).

The computation is eager: the inputs are evaluated when the function is called, and the
result is an evaluated array, so these functions cannot run inside ``mx.compile`` or
``mx.vmap``. Arrays are float32, float16 or bfloat16, read in place (never copied), with any
strides; the dtypes of q, k and v must match (MLX would promote them).

What ran where: MLX's CPU device (``pip install "mlx[cpu]"``, Linux), forward and mx.grad, on
every CI run. Arrays on an Apple GPU (MLX's Metal buffers, DLPack kDLMetal) need the metal
backend's device-buffer path, which libmfa does not have yet: they raise NotImplementedError,
and are never copied to the CPU implicitly. Importing this module imports MLX;
``import mfa_native`` alone never does.
"""

from __future__ import annotations

from typing import Literal, cast, overload

import mlx.core as mx

from . import _attention
from ._keywords import keyword_hints

__all__ = ["attention", "scaled_dot_product_attention"]


@mx.custom_function
def _attention_with_lse(q, k, v, *, causal, causal_alignment, window, scale):
    return _attention.attention(
        q,
        k,
        v,
        causal=causal,
        causal_alignment=causal_alignment,
        window=window,
        scale=scale,
        return_lse=True,
    )


@_attention_with_lse.vjp
def _attention_vjp(primals, cotangents, outputs, *, causal, causal_alignment, window, scale):
    q, k, v = primals
    dout, _ = cotangents  # lse is returned without a gradient (stop_gradient), so its is 0
    out, lse = outputs
    return _attention.attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        causal=causal,
        causal_alignment=causal_alignment,
        window=window,
        scale=scale,
    )


def _require_cpu_stream(stream):
    """The arrays of a call are computed by mfa's cpu backend: an MLX GPU stream or device
    (the default on a Mac) needs the device-buffer path, refused rather than bypassed."""
    device = mx.default_device() if stream is None else getattr(stream, "device", stream)
    if device != mx.cpu:
        raise NotImplementedError(
            f"MLX device {device}: arrays on an Apple GPU need the metal backend's device-"
            "buffer path, which libmfa does not have yet; use the CPU device (stream=mx.cpu, "
            "or mx.set_default_device(mx.cpu))"
        )


_MLX_NAMES = {
    "is_causal": "mfa_native.mlx.attention's name for it is causal= (bottom-right by default, "
    "as MLX's mask='causal')",
    "mask": "mfa_native.mlx.attention's name for mask='causal' is causal=True",
    "softmax_scale": "mfa_native.mlx.attention's name for it is scale=",
    "window_size": "mfa_native.mlx.attention's name for it is window=",
}


@overload
def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    causal: bool = ...,
    causal_alignment: Literal["bottom_right", "top_left"] = ...,
    window: tuple[int | None, int | None] | None = ...,
    scale: float | None = ...,
    return_lse: Literal[False] = ...,
    stream: None | mx.Stream | mx.Device = ...,
) -> mx.array: ...


@overload
def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    causal: bool = ...,
    causal_alignment: Literal["bottom_right", "top_left"] = ...,
    window: tuple[int | None, int | None] | None = ...,
    scale: float | None = ...,
    return_lse: Literal[True],
    stream: None | mx.Stream | mx.Device = ...,
) -> tuple[mx.array, mx.array]: ...


@keyword_hints(_MLX_NAMES)
def attention(
    q,
    k,
    v,
    *,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
    return_lse=False,
    stream=None,
):
    """:func:`mfa_native.attention` on MLX arrays (layout ``[B, H, N, D]``), differentiable
    with ``mx.grad`` / ``mx.vjp`` through mfa's fused backward.

    The options are those of :func:`mfa_native.attention`; ``stream`` must be None or MLX's
    CPU device or stream. With ``return_lse=True`` the float32 log-sum-exp ``[B, Hq, Nq]`` is
    returned too, through ``mx.stop_gradient``: it carries no gradient.
    """
    _require_cpu_stream(stream)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    out, lse = cast(
        "tuple[mx.array, mx.array]",
        _attention_with_lse(
            q,
            k,
            v,
            causal=causal,
            causal_alignment=causal_alignment,
            window=window,
            scale=scale,
        ),
    )
    return (out, mx.stop_gradient(lse)) if return_lse else out


_SDPA_NAMES = {
    "is_causal": "MLX's name for it is mask='causal' (anchored bottom-right)",
    "causal": "MLX's name for it is mask='causal' (anchored bottom-right)",
    "attn_mask": "MLX's name for it is mask=",
    "softmax_scale": "MLX's name for it is scale=",
    "window": "MLX has no sliding window: use mfa_native.mlx.attention(window=...)",
    "window_size": "MLX has no sliding window: use mfa_native.mlx.attention(window=...)",
}


@keyword_hints(_SDPA_NAMES)
def scaled_dot_product_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    scale: float,
    mask: None | str | mx.array = None,
    sinks: mx.array | None = None,
    force_fused: bool = False,
    stream: None | mx.Stream | mx.Device = None,
) -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` computed by mfa, with a fused backward.

    Parameters
    ----------
    q : mx.array, shape (B, Hq, Nq, D)
    k : mx.array, shape (B, Hkv, Nk, D)
        Hq must be a multiple of Hkv; k and v are not to be tiled to Hq heads.
    v : mx.array, shape (B, Hkv, Nk, Dv)
    scale : float
        Multiplies ``q @ k^T`` (required, as in MLX).
    mask : None or "causal"
        "causal" lets query i see keys up to ``i + Nk - Nq`` (the last query sees the last
        key). Array masks are not supported yet (NotImplementedError).
    sinks : None
        Attention sinks are not supported yet (NotImplementedError).
    force_fused : bool
        Accepted: mfa always runs fused kernels, for every head dimension.
    stream : None, or MLX's CPU device or stream

    Returns
    -------
    mx.array, shape (B, Hq, Nq, Dv), q's dtype
    """
    if sinks is not None:
        raise NotImplementedError(
            "scaled_dot_product_attention(sinks=...) is not supported by mfa yet (attention "
            "sinks need score modifiers, which have not landed)"
        )
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or an array, got {mask!r}")
        causal = True
    elif mask is None:
        causal = False
    else:
        raise NotImplementedError(
            "scaled_dot_product_attention(mask=<array>) is not supported by mfa yet: masks "
            "other than mask='causal' need score modifiers, which have not landed"
        )
    if not isinstance(force_fused, bool):
        raise TypeError(f"force_fused must be a bool, got {type(force_fused).__name__}")
    if q.ndim != 4:
        raise ValueError(f"q must have rank 4 (B, H, N, D), as in MLX, got shape {q.shape}")
    return attention(q, k, v, causal=causal, scale=scale, stream=stream)
