"""mfa_native.mlx: mfa attention on MLX arrays, with mfa's fused backward for mx.grad.

    >>> import mlx.core as mx, mfa_native.mlx as mfa_mlx
    >>> q = mx.random.normal((1, 8, 256, 64))
    >>> out = mfa_mlx.scaled_dot_product_attention(q, q, q, scale=64**-0.5, mask="causal")
    >>> grad = mx.grad(lambda q: mfa_mlx.scaled_dot_product_attention(
    ...     q, q, q, scale=0.125, mask="causal").sum())(q)

:func:`scaled_dot_product_attention` takes ``mx.fast.scaled_dot_product_attention``'s arguments
and follows its semantics (``[B, H, N, D]``, grouped-query attention when k and v have fewer
heads, ``mask="causal"`` anchored bottom-right: the last query sees the last key);
:func:`attention` is mfa's own interface (sliding windows, either causal alignment, masks,
softcap, ALiBi, sinks). Both are ``mx.custom_function``s whose VJP is mfa's fused backward,
which MLX's own attention lacks (it differentiates an unfused composition that materialises
the scores); the sinks get their gradient too, masks and ALiBi slopes are constants.

The computation is eager: the inputs are evaluated when the function is called and mfa computes
the result then, so these functions cannot run inside ``mx.compile`` or ``mx.vmap``. The result
holds its values already but reaches the caller through ``mx.custom_function``'s primitives,
which share its buffer when the caller's next ``mx.eval`` evaluates it (no computation, but
evaluating it alone costs a round trip to MLX's stream thread); the log-sum-exp that
:func:`attention` returns on request is the array mfa wrote. Arrays are float32, float16 or
bfloat16, read in place (never copied), with any strides; the dtypes of q, k and v must match
(MLX would promote them). On the CPU the results are copies: MLX makes no array of host memory
in place (``mx.from_dlpack(..., copy=False)`` refuses CPU memory), and an array it allocates
itself (``mx.zeros``) exists only once evaluated, a round trip to its stream thread (and a pass
writing zeros) that costs more than copying a result of the sizes where the copy shows; so the
results are new arrays copied from a never-written host buffer, then written by mfa through
MLX's buffer protocol (writable, as MLX documents for numpy views of its arrays) before
anything else can see them.

What ran where: MLX's CPU device (``pip install "mlx[cpu]"``, Linux), forward and mx.grad, on
every CI run. On an Apple GPU the arrays (MLX's Metal buffers, DLPack kDLMetal: the
``id<MTLBuffer>`` plus a byte offset) go to the metal backend's device-buffer entry points,
results are allocated by MLX and written in place; that path awaits a Mac (its routing runs in
CI through metal-sim's device buffers). Where MLX has Metal, it keeps every array in Metal
buffers, so ``stream=mx.cpu`` there is refused (mfa's cpu backend reads CPU memory) rather than
copied. Without the metal backend a GPU stream raises NotImplementedError, and arrays are never
copied to the CPU implicitly. Importing this module imports MLX; ``import mfa_native`` alone
never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast, overload

import mlx.core as mx
import numpy as np

from . import _attention
from ._arrays import NUMPY
from ._context import available_backends
from ._keywords import keyword_hints

__all__ = ["attention", "scaled_dot_product_attention"]


# The score options of a call, the arguments of mfa_native._attention.attend from causal to
# alibi_slopes (masks and slopes among them: constants of the function), named by _SCORES.
_Scores = tuple[Any, Any, Any, Any, Any, Any, Any, Any]
_SCORES = (
    "causal", "causal_alignment", "window", "scale", "mask", "block_mask", "softcap",
    "alibi_slopes",
)  # fmt: skip


class _Options:
    """A call's options (the scores, the backend, whether the caller gets the lse) and, once
    its forward has run, its log-sum-exp: the residual its VJP reads. It is the custom
    functions' last positional argument, which MLX, as it is not an array, hands on as it is to
    the forward and the VJP (keyword arguments cost more: MLX flattens and rebuilds their dict
    for each call). The lse travels here rather than as a second output: each output of a
    custom function is one more array that MLX wraps and then shares the buffer of (some
    1-2 us a call). An lse that only the VJP reads is a numpy array where the arrays are in
    CPU memory (the cpu backend): MLX makes an array of host memory only as a copy of one
    (some 1-1.5 us for an lse), where numpy allocates it in half that."""

    __slots__ = ("scores", "backend", "return_lse", "lse")
    scores: _Scores
    backend: str
    return_lse: bool
    lse: mx.array | np.ndarray  # set by the forward

    def __init__(self, scores: _Scores, backend: str, return_lse: bool) -> None:
        self.scores = scores
        self.backend = backend
        self.return_lse = return_lse


def _forward(
    q: mx.array, k: mx.array, v: mx.array, sinks: mx.array | None, options: _Options
) -> mx.array:
    backend = options.backend
    lse_kind = NUMPY if backend == "cpu" and not options.return_lse else None
    out, options.lse = _attention.attend(
        q, k, v, *options.scores, sinks, "bhsd", True, False, backend, None, None, lse_kind
    )
    return cast("mx.array", out)


def _backward(
    primals: Any, dout: mx.array, out: mx.array, sinks: mx.array | None, options: _Options
) -> tuple[mx.array, ...]:
    """mfa's backward with the forward's very options and lse; the gradients of q, k, v (and
    the sinks), then None for the options, as MLX wants the primals' structure back."""
    q, k, v = primals[:3]
    gradients = _attention.attention_backward(
        dout, q, k, v, out, options.lse, **dict(zip(_SCORES, options.scores)), sinks=sinks,
        backend=options.backend, return_dsinks=sinks is not None,
    )  # fmt: skip
    return (*gradients, None)


# Two custom functions, as MLX differentiates positional arguments only and takes no None
# among them: without sinks (three primals) and with them (four, dsinks the fourth gradient).
# The options are a constant of both.
@mx.custom_function
def _attention_out(q: mx.array, k: mx.array, v: mx.array, options: _Options) -> mx.array:
    return _forward(q, k, v, None, options)


@_attention_out.vjp
def _attention_vjp(primals: Any, dout: mx.array, out: mx.array) -> Any:
    return _backward(primals, dout, out, None, primals[3])


@mx.custom_function
def _attention_with_sinks(
    q: mx.array, k: mx.array, v: mx.array, sinks: mx.array, options: _Options
) -> mx.array:
    return _forward(q, k, v, sinks, options)


@_attention_with_sinks.vjp
def _attention_with_sinks_vjp(primals: Any, dout: mx.array, out: mx.array) -> Any:
    return _backward(primals, dout, out, primals[3], primals[4])


def _backend_of(stream: Any) -> str:
    """The mfa backend for an MLX stream or device (None: MLX's default device). MLX's CPU
    device runs on mfa's cpu backend; its GPU on the metal backend, which reads the arrays'
    Metal buffers in place (DLPack kDLMetal: the id<MTLBuffer> and a byte offset). MLX's
    DLPack export evaluates an array first (and waits for it), so the inputs are complete when
    mfa reads them, and the call returns once mfa's command buffer has completed: no other
    synchronisation is needed. Without the metal backend a GPU stream is refused, never run
    on the CPU behind the caller's back."""
    device = mx.default_device() if stream is None else getattr(stream, "device", stream)
    if device == mx.cpu:
        return "cpu"
    if "metal" not in available_backends():
        raise NotImplementedError(
            f"stream: MLX device {device}: arrays on an Apple GPU need the metal backend's "
            "device-buffer path, and this machine has no metal backend (available: "
            f"{', '.join(available_backends())}); use the CPU device (stream=mx.cpu, or "
            "mx.set_default_device(mx.cpu))"
        )
    return "metal"


if TYPE_CHECKING:
    from typing_extensions import Unpack

    class _AttentionOptions(_attention.Scores[mx.array], total=False):
        """attention's keyword arguments but return_lse, for its typed signatures."""

        stream: None | mx.Stream | mx.Device


_MLX_NAMES = {
    "is_causal": "mfa_native.mlx.attention's name for it is causal= (bottom-right by default, "
    "as MLX's mask='causal')",
    "softmax_scale": "mfa_native.mlx.attention's name for it is scale=",
    "window_size": "mfa_native.mlx.attention's name for it is window=",
}


@overload
def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    return_lse: Literal[False] = ...,
    **options: Unpack[_AttentionOptions],
) -> mx.array: ...


@overload
def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    return_lse: Literal[True],
    **options: Unpack[_AttentionOptions],
) -> tuple[mx.array, mx.array]: ...


@keyword_hints(_MLX_NAMES)
def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    causal: bool = False,
    causal_alignment: Literal["bottom_right", "top_left"] = "bottom_right",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    mask: mx.array | None = None,
    block_mask: mx.array | None = None,
    softcap: float | None = None,
    alibi_slopes: mx.array | None = None,
    sinks: mx.array | None = None,
    return_lse: bool = False,
    stream: None | mx.Stream | mx.Device = None,
) -> mx.array | tuple[mx.array, mx.array]:
    """:func:`mfa_native.attention` on MLX arrays (layout ``[B, H, N, D]``), differentiable
    with ``mx.grad`` / ``mx.vjp`` through mfa's fused backward.

    The options are those of :func:`mfa_native.attention` (``mask``, ``block_mask``,
    ``softcap``, ``alibi_slopes`` and ``sinks`` included); ``stream`` (None: MLX's default
    device) picks mfa's backend: cpu for MLX's CPU device or stream, metal for its GPU.
    ``sinks`` (``[Hq]``, float32 or cast to it) get their gradient; masks and slopes are
    constants (their gradient is zero). With ``return_lse=True`` the float32 log-sum-exp
    ``[B, Hq, Nq]`` is returned too, the array mfa wrote: a constant, outside the graph of
    the custom function, so it carries no gradient.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    scores = (causal, causal_alignment, window, scale, mask, block_mask, softcap, alibi_slopes)
    out, lse = _attend(q, k, v, scores, sinks, stream, return_lse)
    return (out, lse) if return_lse else out


def _attend(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scores: _Scores,
    sinks: mx.array | None,
    stream: None | mx.Stream | mx.Device,
    return_lse: bool,
) -> tuple[mx.array, Any]:
    """(out, lse) through the custom function that fits: with sinks or without. lse is the
    array mfa wrote, outside the custom function's graph: a constant, with no gradient; an
    mx.array where return_lse asks for it to be returned."""
    options = _Options(scores, _backend_of(stream), return_lse)
    if sinks is None:
        out = _attention_out(q, k, v, options)
    else:
        if isinstance(sinks, mx.array) and sinks.dtype != mx.float32:
            # mfa's sinks are float32; the cast is differentiated by MLX (dsinks cast back).
            sinks = sinks.astype(mx.float32)
        out = _attention_with_sinks(q, k, v, sinks, options)
    return cast("mx.array", out), options.lse


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
    mask : None, "causal" or mx.array
        "causal" lets query i see keys up to ``i + Nk - Nq`` (the last query sees the last
        key). An array broadcastable to ``(B, Hq, Nq, Nk)``: boolean (True: the pair takes
        part) or additive (float32 or q's dtype, added to the scaled scores).
    sinks : mx.array, shape (Hq,), optional
        One logit per query head that joins the softmax's denominator (not scaled), as in
        MLX; differentiable.
    force_fused : bool
        Accepted: mfa always runs fused kernels, for every head dimension.
    stream : None, or an MLX device or stream
        MLX's CPU runs on mfa's cpu backend, its GPU on the metal backend (None: MLX's
        default device).

    Returns
    -------
    mx.array, shape (B, Hq, Nq, Dv), q's dtype
        A row that sees no key (and has no sink) gets zeros, where MLX's result is not
        defined by its docs (its CPU device gives NaN or a uniform average).
    """
    array_mask = None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or an array, got {mask!r}")
        causal = True
    elif mask is None or isinstance(mask, mx.array):
        causal, array_mask = False, mask
    else:
        raise TypeError(f"mask must be None, 'causal' or an mx.array, got {type(mask).__name__}")
    if not isinstance(force_fused, bool):
        raise TypeError(f"force_fused must be a bool, got {type(force_fused).__name__}")
    if q.ndim != 4:
        raise ValueError(f"q must have rank 4 (B, H, N, D), as in MLX, got shape {q.shape}")
    scores = (causal, "bottom_right", None, scale, array_mask, None, None, None)
    return _attend(q, k, v, scores, sinks, stream, False)[0]


# Ring attention over mx.distributed, defined in mfa_native.mlx_ring and reached from here too.
from .mlx_ring import ring_attention, zigzag_indices, zigzag_shard, zigzag_unshard  # noqa: E402

__all__ += ["ring_attention", "zigzag_indices", "zigzag_shard", "zigzag_unshard"]
