"""mfa_native.torch: mfa attention as PyTorch operators, with autograd and torch.compile.

    >>> import torch, mfa_native.torch as mfa_torch
    >>> q = torch.randn(1, 8, 256, 64, requires_grad=True)
    >>> out = mfa_torch.scaled_dot_product_attention(q, q, q, is_causal=True)
    >>> out.sum().backward()  # runs mfa's fused backward

Two operators are registered with ``torch.library`` in the ``mfa_native`` namespace:
``torch.ops.mfa_native.attention_forward`` (returns ``(out, lse)``) and
``torch.ops.mfa_native.attention_backward`` (returns ``(dq, dk, dv)``). The forward has an
autograd formula (``torch.library.register_autograd``) that saves q, k, v, out and lse and calls
the backward operator with the very options the forward ran with, so a backward that does not
match its forward cannot happen here; both have fake (meta) implementations
(``torch.library.register_fake``), so ``torch.compile(fullgraph=True)`` traces models that use
them without graph breaks. lse is not differentiable (marked so): it is returned for callers
that combine partial results, not to be differentiated through.

Functions:

- :func:`attention`: mfa's own interface (``causal``, ``causal_alignment``, ``window``,
  ``scale``, ``layout``), differentiable.
- :func:`scaled_dot_product_attention`: ``torch.nn.functional.scaled_dot_product_attention``'s
  signature and semantics (``[B, H, N, D]``, ``is_causal`` anchored top-left).
- :func:`enable`, :func:`disable` and the context manager :func:`routed`: route
  ``torch.nn.functional.scaled_dot_product_attention`` itself through mfa, and restore it.

Tensors: float32, float16 or bfloat16 in CPU memory, any strides (views are never copied).
What ran where: CPU tensors, forward and backward, eager and compiled, are tested on every CI
run (Linux). MPS tensors are routed to the metal backend's device-buffer path, which libmfa does
not have yet: they raise NotImplementedError, and are never copied to the CPU implicitly.
Importing this module imports torch; ``import mfa_native`` alone never does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Literal, overload

import torch
from torch import Tensor

from . import _attention
from ._keywords import keyword_hints

__all__ = [
    "attention",
    "scaled_dot_product_attention",
    "enable",
    "disable",
    "is_enabled",
    "routed",
]

_OPTIONS_SCHEMA = (
    "bool causal, str causal_alignment, int window_left, int window_right, float? scale, "
    "str layout, str? backend"
)
_library = torch.library.Library("mfa_native", "DEF")
_library.define(
    f"attention_forward(Tensor q, Tensor k, Tensor v, {_OPTIONS_SCHEMA}) -> (Tensor, Tensor)"
)
_library.define(
    "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    f"{_OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)"
)


def _forward_kernel(q, k, v, causal, causal_alignment, left, right, scale, layout, backend):
    return _attention.attention(
        q,
        k,
        v,
        causal=causal,
        causal_alignment=causal_alignment,
        window=(left, right),
        scale=scale,
        layout=layout,
        return_lse=True,
        backend=backend,
    )


def _backward_kernel(
    dout, q, k, v, out, lse, causal, causal_alignment, left, right, scale, layout, backend
):
    return _attention.attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        causal=causal,
        causal_alignment=causal_alignment,
        window=(left, right),
        scale=scale,
        layout=layout,
        backend=backend,
    )


# CPU tensors run here. MPS tensors reach the same kernels, which send Metal memory to the
# metal backend's device-buffer path (today: a NotImplementedError naming it).
for _dispatch_key in ("CPU", "MPS"):
    _library.impl("attention_forward", _forward_kernel, _dispatch_key)
    _library.impl("attention_backward", _backward_kernel, _dispatch_key)


def _lse_shape(q, layout):
    """[B, Hq, Nq] (or [Hq, Nq] for rank 3) from q in the given layout."""
    if layout == "bshd":
        return (*q.shape[:-3], q.shape[-2], q.shape[-3])
    return tuple(q.shape[:-1])


@torch.library.register_fake("mfa_native::attention_forward")
def _forward_fake(q, k, v, causal, causal_alignment, left, right, scale, layout, backend):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(_lse_shape(q, layout), dtype=torch.float32)


@torch.library.register_fake("mfa_native::attention_backward")
def _backward_fake(
    dout, q, k, v, out, lse, causal, causal_alignment, left, right, scale, layout, backend
):
    # Contiguous, as the real kernel allocates them (not empty_like, which keeps a view's
    # strides): compiled graphs rely on the strides the fake kernel reports.
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save(ctx, q, k, v, options, out, lse):
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = options
    ctx.mark_non_differentiable(lse)


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    _save(ctx, q, k, v, tuple(options), *output)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _backward_op(dout, q, k, v, out, lse, *ctx.options)
    return (dq, dk, dv) + (None,) * len(ctx.options)


torch.library.register_autograd(
    "mfa_native::attention_forward", _backward, setup_context=_setup_context
)


def _double_backward(ctx, *gradients):
    raise NotImplementedError(
        "mfa's attention backward is not differentiable: double backward (a gradient of a "
        "gradient, create_graph=True followed by another backward) is not supported"
    )


# First-order gradients may be taken with create_graph=True; differentiating them again is
# refused here rather than left to fail obscurely.
torch.library.register_autograd("mfa_native::attention_backward", _double_backward)

_forward_op = torch.ops.mfa_native.attention_forward.default
_backward_op = torch.ops.mfa_native.attention_backward.default


class _Attention(torch.autograd.Function):
    """The forward operator under the same autograd formula (_save, _backward), for this
    module's functions while they record autograd in eager mode.

    The operator's own registration is what torch.compile traces, and what code calling
    torch.ops.mfa_native directly gets; in eager mode its wrapper costs some 30 us a call more
    than this class (torch.library fills in defaults by rebuilding the schema's argument list
    once per argument), the larger part of a small call's time. Under torch.compile the
    operator is called instead: Dynamo cannot trace an autograd.Function given one tensor
    twice (self-attention's q, k, v), and compiled code pays the wrapper's cost only once."""

    @staticmethod
    def forward(ctx, q, k, v, *options):
        out, lse = _forward_op(q, k, v, *options)
        _save(ctx, q, k, v, options, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


def _attend(q, k, v, *options):
    """(out, lse) from the forward operator, recording autograd when a gradient is wanted."""
    if (
        torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
        and not torch.compiler.is_compiling()
    ):
        return _Attention.apply(q, k, v, *options)
    return _forward_op(q, k, v, *options)


def _window_bounds(window):
    """(left, right) for the operator from None or a pair of ints/None (-1 = unbounded).
    Pure Python, so that torch.compile traces it; the values are checked by the operator."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be None or a pair (left, right), got {window!r}")
    bounds = []
    for side, value in enumerate(window):
        if value is None:
            value = -1
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"window[{side}] must be an int or None, got {type(value).__name__}")
        bounds.append(value)
    return bounds[0], bounds[1]


def _scale_argument(scale):
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
        raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
    return None if scale is None else float(scale)


def _backend_argument(backend):
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            "backend must be None or a backend name (a Context cannot cross the operator "
            f"boundary), got {type(backend).__name__}"
        )
    return backend


_TORCH_NAMES = {
    "is_causal": "mfa_native.torch.attention's name for it is causal= (PyTorch's is_causal is "
    "causal=True, causal_alignment='top_left'; scaled_dot_product_attention takes is_causal=)",
    "softmax_scale": "mfa_native.torch.attention's name for it is scale=",
    "window_size": "mfa_native.torch.attention's name for it is window=",
    "attn_mask": "masks are not supported yet: causal= and window= express causal and "
    "sliding-window masks",
    "return_attn_probs": "mfa_native.torch.attention's name for it is return_lse=",
    "enable_gqa": "no flag is needed: grouped-query attention applies whenever the query heads "
    "are a multiple of the key/value heads",
}


@overload
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = ...,
    causal_alignment: Literal["bottom_right", "top_left"] = ...,
    window: tuple[int | None, int | None] | None = ...,
    scale: float | None = ...,
    layout: Literal["bhsd", "bshd"] = ...,
    return_lse: Literal[False] = ...,
    backend: str | None = ...,
) -> Tensor: ...


@overload
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = ...,
    causal_alignment: Literal["bottom_right", "top_left"] = ...,
    window: tuple[int | None, int | None] | None = ...,
    scale: float | None = ...,
    layout: Literal["bhsd", "bshd"] = ...,
    return_lse: Literal[True],
    backend: str | None = ...,
) -> tuple[Tensor, Tensor]: ...


@keyword_hints(_TORCH_NAMES)
def attention(
    q,
    k,
    v,
    *,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
    layout="bhsd",
    return_lse=False,
    backend=None,
):
    """:func:`mfa_native.attention` on torch tensors, differentiable.

    The arguments are those of :func:`mfa_native.attention` (``out=`` excepted; ``backend`` a
    name or None); the result is a new tensor (and, with ``return_lse=True``, the float32
    log-sum-exp ``[B, Hq, Nq]``, which carries no gradient). ``loss.backward()`` runs mfa's
    fused backward with the forward's options; with grouped-query attention the gradients of
    k and v are summed over each group of query heads.
    """
    out, lse = _attend(
        q,
        k,
        v,
        causal,
        causal_alignment,
        *_window_bounds(window),
        _scale_argument(scale),
        layout,
        _backend_argument(backend),
    )
    return (out, lse) if return_lse else out


_SDPA_NAMES = {
    "causal": "PyTorch's name for it is is_causal= (anchored top-left)",
    "q": "PyTorch's name for it is query (positional)",
    "k": "PyTorch's name for it is key (positional)",
    "v": "PyTorch's name for it is value (positional)",
    "softmax_scale": "PyTorch's name for it is scale=",
    "window": "scaled_dot_product_attention has no window: use mfa_native.torch.attention("
    "window=...)",
    "window_size": "scaled_dot_product_attention has no window: use "
    "mfa_native.torch.attention(window=...)",
}


@keyword_hints(_SDPA_NAMES)
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` computed by mfa, differentiable.

    The same signature and semantics: query ``[B, Hq, L, E]``, key ``[B, Hkv, S, E]``, value
    ``[B, Hkv, S, Ev]`` (or without the batch axis), result ``[B, Hq, L, Ev]``; ``is_causal``
    lets query i see keys 0..i (anchored top-left); ``scale`` None means ``1 / sqrt(E)``;
    ``enable_gqa=True`` lets Hq be a multiple of Hkv.

    Raises
    ------
    NotImplementedError
        For ``attn_mask`` (masks are not supported yet) and ``dropout_p > 0`` (mfa has no
        dropout), rather than ignoring them.
    ValueError
        For different head counts without ``enable_gqa=True``, as PyTorch refuses them; and
        for everything :func:`mfa_native.attention` rejects (other ranks than 3 and 4,
        float64...), where the arguments are named q, k and v.
    """
    if attn_mask is not None:
        raise NotImplementedError(
            "scaled_dot_product_attention(attn_mask=...) is not supported by mfa yet: masks "
            "other than causal (is_causal=True) need score modifiers, which have not landed"
        )
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"scaled_dot_product_attention(dropout_p={dropout_p}) is not supported: mfa has "
            "no dropout (pass dropout_p=0.0, as in evaluation)"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if not enable_gqa and query.dim() >= 3 and key.dim() >= 3 and query.shape[-3] != key.shape[-3]:
        raise ValueError(
            f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass "
            "enable_gqa=True for grouped-query attention"
        )
    out, _ = _attend(
        query,
        key,
        value,
        is_causal,
        "top_left",
        -1,
        -1,
        _scale_argument(scale),
        "bhsd",
        None,
    )
    return out


# ---- routing torch.nn.functional.scaled_dot_product_attention -------------------------------

_routing_lock = threading.Lock()
_original_sdpa = torch.nn.functional.scaled_dot_product_attention


def _install(function: Callable[..., Tensor]) -> None:
    """Put function in torch.nn.functional.scaled_dot_product_attention's place."""
    functional = torch.nn.functional
    # torch's stubs type the attribute with positional scale and enable_gqa, which PyTorch
    # takes by keyword only, as this module's function does.
    functional.scaled_dot_product_attention = function  # type: ignore[assignment]


def enable() -> None:
    """Make ``torch.nn.functional.scaled_dot_product_attention`` call
    :func:`scaled_dot_product_attention` (process-wide, every thread) until :func:`disable`.

    Code that looks the function up at call time (``F.scaled_dot_product_attention(...)``,
    ``torch.nn.MultiheadAttention``, most model code) is routed; a reference taken before,
    such as ``from torch.nn.functional import scaled_dot_product_attention`` at import, is not.
    Calls that mfa cannot serve (``attn_mask``, dropout, CUDA tensors) raise rather than fall
    back silently: :func:`disable` restores PyTorch's function for them. Enabling twice is
    allowed.
    """
    with _routing_lock:
        _install(scaled_dot_product_attention)


def disable() -> None:
    """Restore PyTorch's own ``torch.nn.functional.scaled_dot_product_attention``."""
    with _routing_lock:
        _install(_original_sdpa)


def is_enabled() -> bool:
    """Whether ``torch.nn.functional.scaled_dot_product_attention`` is routed through mfa."""
    return torch.nn.functional.scaled_dot_product_attention is scaled_dot_product_attention


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` through mfa inside a
    ``with`` block, then restore what was there before (so blocks nest)::

        with mfa_native.torch.routed():
            loss = model(x).sum()
            loss.backward()
    """
    with _routing_lock:
        previous = torch.nn.functional.scaled_dot_product_attention
        _install(scaled_dot_product_attention)
    try:
        yield
    finally:
        with _routing_lock:
            _install(previous)


def __getattr__(name: str):
    # ring_attention and the zig-zag helpers (mfa_native.ring) import torch.distributed: they
    # are loaded on first use.
    if name in ("ring_attention", "zigzag_indices", "zigzag_shard", "zigzag_unshard"):
        from . import ring

        return getattr(ring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
