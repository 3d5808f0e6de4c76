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
  ``scale``, ``mask``, ``block_mask``, ``softcap``, ``alibi_slopes``, ``sinks``, ``layout``),
  differentiable, the sinks included.
- :func:`attention_varlen`: the same over packed sequences (flash-attn's ``[total, H, D]``).
- :func:`scaled_dot_product_attention`: ``torch.nn.functional.scaled_dot_product_attention``'s
  signature and semantics (``[B, H, N, D]``, ``is_causal`` anchored top-left, ``attn_mask``
  boolean or additive, ``enable_gqa``, ``scale``).
- :func:`enable`, :func:`disable` and the context manager :func:`routed`: route
  ``torch.nn.functional.scaled_dot_product_attention`` itself through mfa, and restore it.

Tensors: float32, float16 or bfloat16, any strides (views are never copied), in CPU memory or
on MPS. An MPS tensor goes to the metal backend's device-buffer entry points: its storage
pointer is its ``id<MTLBuffer>``, bound at a byte offset of ``storage_offset() *
element_size()``; results are allocated on the same device by torch. Synchronisation: before
each call ``torch.mps.synchronize()`` waits for the work torch queued (public Python exposes no
handle on the MPS stream's command buffer to encode into), and the call returns once mfa's own
command buffer has completed, so nothing more is needed after it. Without the metal backend an
MPS tensor raises NotImplementedError naming the argument; it is never copied to the CPU
implicitly.
What ran where: CPU tensors, forward and backward, eager and compiled, are tested on every CI
run (Linux); the device-memory routing runs there through metal-sim's device buffers. MPS
tensors themselves await a Mac. Importing this module imports torch; ``import mfa_native``
alone never does.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast, overload

import torch
from torch import Tensor

from . import _attention
from ._keywords import keyword_hints

__all__ = [
    "attention",
    "attention_varlen",
    "scaled_dot_product_attention",
    "enable",
    "disable",
    "is_enabled",
    "routed",
]

# The options both operators take after their tensors, in this order (_Options): the score
# modifiers, packed sequences (cu_seqlens_q None for dense arrays), then the scalar options.
_OPTIONS_SCHEMA = (
    "Tensor? mask, Tensor? block_mask, Tensor? alibi_slopes, Tensor? sinks, "
    "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
    "bool causal, str causal_alignment, int window_left, int window_right, float? scale, "
    "float? softcap, str layout, str? backend"
)
_library = torch.library.Library("mfa_native", "DEF")
_library.define(
    f"attention_forward(Tensor q, Tensor k, Tensor v, {_OPTIONS_SCHEMA}) -> (Tensor, Tensor)"
)
_library.define(
    "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    f"{_OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)"
)


class _Options(NamedTuple):
    """The operators' options, as _OPTIONS_SCHEMA orders them."""

    mask: Tensor | None
    block_mask: Tensor | None
    alibi_slopes: Tensor | None
    sinks: Tensor | None
    cu_seqlens_q: Tensor | None
    cu_seqlens_k: Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool
    causal_alignment: str
    window_left: int
    window_right: int
    scale: float | None
    softcap: float | None
    layout: Literal["bhsd", "bshd"]
    backend: str | None

    def keywords(self) -> dict[str, Any]:
        """The keyword arguments of mfa_native's functions that these options stand for."""
        return {
            "causal": self.causal,
            "causal_alignment": self.causal_alignment,
            "window": (self.window_left, self.window_right),
            "scale": self.scale,
            "mask": self.mask,
            "block_mask": self.block_mask,
            "softcap": self.softcap,
            "alibi_slopes": self.alibi_slopes,
            "sinks": self.sinks,
            "backend": self.backend,
        }

    def packed(self) -> tuple[Any, ...]:
        return (self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k)


# The options' tensors come first: autograd saves them beside the operands.
_TENSOR_OPTIONS = 6
_SINKS = _Options._fields.index("sinks")


def _forward_kernel(q: Tensor, k: Tensor, v: Tensor, *options: Any) -> tuple[Tensor, Tensor]:
    return cast("tuple[Tensor, Tensor]", _forward(q, k, v, _Options(*options)))


def _forward(
    q: Tensor, k: Tensor, v: Tensor, given: _Options, return_lse: bool = True
) -> tuple[Tensor, Tensor | None]:
    """(out, lse) by mfa_native's functions; lse None where it is not asked for."""
    if given.cu_seqlens_q is not None:
        return _attention.attention_varlen(
            q, k, v, *given.packed(), **given.keywords(), return_lse=True
        )
    result = _attention.attend(
        q, k, v, given.causal, given.causal_alignment, (given.window_left, given.window_right),
        given.scale, given.mask, given.block_mask, given.softcap, given.alibi_slopes,
        given.sinks, given.layout, return_lse, False, given.backend, None, None,
    )  # fmt: skip
    return result if return_lse else (result, None)


def _backward_kernel(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *options: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    given = _Options(*options)
    with_sinks = given.sinks is not None
    if given.cu_seqlens_q is not None:
        gradients = _attention.attention_varlen_backward(
            dout, q, k, v, out, lse, *given.packed(), **given.keywords(), return_dsinks=with_sinks
        )
    else:
        gradients = _attention.attention_backward(
            dout, q, k, v, out, lse, **given.keywords(), layout=given.layout,
            return_dsinks=with_sinks,
        )  # fmt: skip
    # An operator returns tensors only: without sinks, an empty dsinks.
    dsinks = gradients[3] if with_sinks else q.new_empty((0,), dtype=torch.float32)
    return gradients[0], gradients[1], gradients[2], dsinks


# CPU tensors run here. MPS tensors reach the same kernels, which send Metal memory to the
# metal backend's device-buffer path (elsewhere: a NotImplementedError naming the argument).
for _dispatch_key in ("CPU", "MPS"):
    _library.impl("attention_forward", _forward_kernel, _dispatch_key)
    _library.impl("attention_backward", _backward_kernel, _dispatch_key)


def _lse_shape(q: Tensor, layout: str) -> tuple[int, ...]:
    """[B, Hq, Nq] (or [Hq, Nq] for rank 3, packed sequences' [Hq, total_q] among them) from q
    in the given layout."""
    if layout == "bshd":
        return (*q.shape[:-3], q.shape[-2], q.shape[-3])
    return tuple(q.shape[:-1])


@torch.library.register_fake("mfa_native::attention_forward")  # type: ignore[untyped-decorator]
def _forward_fake(q: Tensor, k: Tensor, v: Tensor, *options: Any) -> tuple[Tensor, Tensor]:
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(_lse_shape(q, _Options(*options).layout), dtype=torch.float32)


@torch.library.register_fake("mfa_native::attention_backward")  # type: ignore[untyped-decorator]
def _backward_fake(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *options: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # Contiguous, as the real kernel allocates them (not empty_like, which keeps a view's
    # strides): compiled graphs rely on the strides the fake kernel reports.
    sinks = _Options(*options).sinks
    dsinks = q.new_empty((0,) if sinks is None else (sinks.shape[0],), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _save(
    ctx: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    options: Sequence[Any],
    out: Tensor,
    lse: Tensor,
    lse_returned: bool = True,
) -> None:
    # The options as one attribute (each costs some 0.4 us a call); the tensors among them are
    # saved too, so that autograd checks that they did not change before the backward: those
    # given only, as each saved entry, None included, costs as much. An lse the caller holds
    # is saved likewise; one that only the backward ever sees cannot change, and is kept as it
    # is (ctx.lse), without a saved entry or an output of its own.
    ctx.options = options
    given = [tensor for tensor in options[:_TENSOR_OPTIONS] if tensor is not None]
    if lse_returned:
        ctx.lse = None
        ctx.save_for_backward(q, k, v, out, lse, *given)
        ctx.mark_non_differentiable(lse)
    else:
        ctx.lse = lse
        ctx.save_for_backward(q, k, v, out, *given)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, *options = inputs
    _save(ctx, q, k, v, options, *output)


def _backward(ctx: Any, dout: Tensor, *_dlse: Tensor | None) -> tuple[Tensor | None, ...]:
    """Gradients of q, k, v and the sinks; the masks, slopes and offsets are constants. _dlse:
    lse's gradient, where lse is an output (it is not differentiable)."""
    q, k, v, out, *saved = ctx.saved_tensors
    lse = ctx.lse
    if lse is None:
        lse = saved.pop(0)
    given = iter(saved)
    tensors = [None if tensor is None else next(given) for tensor in ctx.options[:_TENSOR_OPTIONS]]
    options = (*tensors, *ctx.options[_TENSOR_OPTIONS:])
    arguments = (dout, q, k, v, out, lse)
    if (
        torch.compiler.is_compiling()
        or torch.is_grad_enabled()
        or not _reaches_kernel_unchanged(arguments, options)
    ):
        # Through the dispatcher: traced, faked, or with create_graph=True, where the
        # operator's own autograd formula must refuse a second differentiation.
        dq, dk, dv, dsinks = _backward_op(*arguments, *options)
    else:
        # The usual backward (grad mode off, plain tensors): the kernel the dispatcher would
        # call, without its conversion of the arguments (some 25 us a call).
        dq, dk, dv, dsinks = _backward_kernel(*arguments, *options)
    sinks_gradient = dsinks if _Options(*options).sinks is not None else None
    return (dq, dk, dv, None, None, None, sinks_gradient) + (None,) * (len(options) - 4)


torch.library.register_autograd(
    "mfa_native::attention_forward", _backward, setup_context=_setup_context
)


def _double_backward(ctx: Any, *gradients: Any) -> Any:
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
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        sinks: Tensor | None,
        options: _Options,
        direct: bool,
        return_lse: bool,
    ) -> Any:
        # The options travel as one object (an argument of apply() costs about 0.25 us); the
        # sinks, which options holds too, are an input of their own for autograd to see.
        # direct: _reaches_kernel_unchanged((q, k, v), options), as the caller found. lse is an
        # output only where the caller asks for it: each output costs autograd some 1 us.
        if direct:
            out, lse = _forward(q, k, v, options)
        else:
            with torch._C._AutoDispatchBelowAutograd():
                out, lse = _forward_op(q, k, v, *options)
        assert lse is not None  # _forward's, asked for
        _save(ctx, q, k, v, options, out, lse, return_lse)
        return (out, lse) if return_lse else out

    @staticmethod
    def backward(ctx: Any, *gradients: Any) -> Any:
        dq, dk, dv, *option_gradients = _backward(ctx, *gradients)
        return dq, dk, dv, option_gradients[_SINKS], None, None, None


# torch.autograd.Function.apply without its Python layer, which binds default arguments for
# setup_context-style functions (_Attention has none), hands calls under functorch transforms
# to functorch, and unwraps functorch's dead wrappers (tensors whose dispatch keys are not
# plain): some 3 us a call. _attend calls it where none of these can apply.
_apply_attention = super(torch.autograd.Function, _Attention).apply
_functorch_active = torch._C._are_functorch_transforms_active


def _plain_keys() -> frozenset[int]:
    """The dispatch key sets of plain dense tensors on the devices mfa's kernels read: a
    tensor with any other key (a functorch wrapper, a negative or conjugate view, a subclass's
    Python key, inference mode's) is left to the dispatcher."""
    tensors = [torch.empty(0)]
    if torch.backends.mps.is_available():
        tensors.append(torch.empty(0, device="mps"))
    return frozenset(torch._C._dispatch_keys(tensor).raw_repr() for tensor in tensors)


_PLAIN_KEYS = _plain_keys()
_dispatch_keys = torch._C._dispatch_keys
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled


def _reaches_kernel_unchanged(tensors: Sequence[Tensor], options: Sequence[Any]) -> bool:
    """Whether the dispatcher would hand these operands and options to an operator's kernel
    (_forward_kernel, _backward_kernel) as they are: no dispatch or function mode is active and
    every tensor is a plain CPU or MPS tensor. Such calls go to the kernel directly, as the
    dispatcher would send them, without its conversion of the arguments (some 10 us a call)."""
    if _dispatch_modes() or _function_modes():
        return False
    for tensor in (*tensors, *options[:_TENSOR_OPTIONS]):
        if tensor is not None and (
            type(tensor) is not Tensor or _dispatch_keys(tensor).raw_repr() not in _PLAIN_KEYS
        ):
            return False
    return True


def _attend(
    q: Tensor, k: Tensor, v: Tensor, options: _Options, return_lse: bool = True
) -> tuple[Tensor, Tensor | None]:
    """(out, lse) from the forward operator, recording autograd when a gradient is wanted; lse
    is None where return_lse is False and nothing needs it."""
    if torch.compiler.is_compiling():
        # Dynamo traces the operator, autograd formula included.
        return cast("tuple[Tensor, Tensor]", _forward_op(q, k, v, *options))
    direct = _reaches_kernel_unchanged((q, k, v), options)
    sinks = options.sinks
    if torch.is_grad_enabled() and (
        q.requires_grad
        or k.requires_grad
        or v.requires_grad
        or (sinks is not None and sinks.requires_grad)
    ):
        # Function.apply is unannotated in torch (it forwards to forward()'s signature).
        if direct and not _functorch_active():
            result = _apply_attention(q, k, v, sinks, options, True, return_lse)  # type: ignore[no-untyped-call]
        else:
            result = _Attention.apply(q, k, v, sinks, options, direct, return_lse)  # type: ignore[no-untyped-call]
        return result if return_lse else (result, None)
    if direct:
        return _forward(q, k, v, options, return_lse)
    # Below autograd, where nothing is to be recorded (as the operator's autograd wrapper
    # itself redispatches then, but some 8 us a call sooner): every other dispatch key (CPU,
    # MPS, Meta, fake tensors, dispatch modes) still applies.
    with torch._C._AutoDispatchBelowAutograd():
        return cast("tuple[Tensor, Tensor]", _forward_op(q, k, v, *options))


def _window_bounds(window: Any) -> tuple[int, int]:
    """(left, right) for the operator from a pair of ints/None (-1 = unbounded). Pure Python,
    so that torch.compile traces it; the values are checked by the operator."""
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


def _real_or_none(name: str, value: Any) -> float | None:
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise TypeError(f"{name} must be None or a real number, got {type(value).__name__}")
    return None if value is None else float(value)


def _backend_argument(backend: Any) -> str | None:
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            "backend must be None or a backend name (a Context cannot cross the operator "
            f"boundary), got {type(backend).__name__}"
        )
    return backend


def _tensor_or_none(name: str, value: Any, differentiable: bool = False) -> Tensor | None:
    """A tensor option. Masks and slopes are constants (mfa computes no gradient for them): one
    that requires grad while grad mode is on is refused, not silently left without one."""
    if value is None:
        return None
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be None or a torch.Tensor, got {type(value).__name__}")
    if not differentiable and value.requires_grad and torch.is_grad_enabled():
        raise TypeError(
            f"{name} requires grad, but mfa does not differentiate masks and ALiBi slopes "
            f"(they are constants of the score): pass {name}.detach()"
        )
    return value


_DENSE = (None, None, 0, 0)
# _Options from the tuple of its fields, without NamedTuple's keyword-binding __new__.
_make_options = functools.partial(tuple.__new__, _Options)


def _options(
    causal: Any = False,
    causal_alignment: Any = "bottom_right",
    window: Any = None,
    scale: Any = None,
    mask: Any = None,
    block_mask: Any = None,
    softcap: Any = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    layout: Any = "bhsd",
    backend: Any = None,
    packed: tuple[Any, Any, Any, Any] = _DENSE,
) -> _Options:
    """The operators' options from this module's keyword arguments, checked where the
    operator's schema would refuse them obscurely (the rest is checked by mfa_native's
    functions). The options a call leaves at None (most of them, in most calls) are passed
    over without a check of their own, and this module's functions pass theirs by position:
    a small call's options cost as much as its kernel otherwise."""
    if type(causal) is not bool:
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if mask is not None or block_mask is not None or alibi_slopes is not None:
        mask = _tensor_or_none("mask", mask)
        block_mask = _tensor_or_none("block_mask", block_mask)
        alibi_slopes = _tensor_or_none("alibi_slopes", alibi_slopes)
    if sinks is not None:
        sinks = _tensor_or_none("sinks", sinks, differentiable=True)
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = packed
    if packed is not _DENSE:
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        cu_seqlens_q = _tensor_or_none("cu_seqlens_q", cu_seqlens_q)
        cu_seqlens_k = _tensor_or_none("cu_seqlens_k", cu_seqlens_k)
    left, right = (-1, -1) if window is None else _window_bounds(window)
    if type(scale) is not float and scale is not None:
        scale = _real_or_none("scale", scale)
    if softcap is not None:
        softcap = _real_or_none("softcap", softcap)
    if backend is not None:
        _backend_argument(backend)
    return _make_options(
        (
            mask, block_mask, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, causal, causal_alignment, left, right, scale, softcap, layout, backend,
        )
    )  # fmt: skip


if TYPE_CHECKING:
    from typing_extensions import Unpack

    class _Kwargs(_attention.Scores[Tensor], total=False):
        """attention's keyword arguments but return_lse, for its typed signatures."""

        layout: Literal["bhsd", "bshd"]
        backend: str | None


_TORCH_NAMES = {
    "is_causal": "mfa_native.torch.attention's name for it is causal= (PyTorch's is_causal is "
    "causal=True, causal_alignment='top_left'; scaled_dot_product_attention takes is_causal=)",
    "softmax_scale": "mfa_native.torch.attention's name for it is scale=",
    "window_size": "mfa_native.torch.attention's name for it is window=",
    "attn_mask": "mfa_native.torch.attention's name for it is mask=",
    "return_attn_probs": "mfa_native.torch.attention's name for it is return_lse=",
    "enable_gqa": "no flag is needed: grouped-query attention applies whenever the query heads "
    "are a multiple of the key/value heads",
}


@overload
def attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_lse: Literal[False] = ..., **options: Unpack[_Kwargs]
) -> Tensor: ...


@overload
def attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_lse: Literal[True], **options: Unpack[_Kwargs]
) -> tuple[Tensor, Tensor]: ...


@keyword_hints(_TORCH_NAMES)
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    causal_alignment: Literal["bottom_right", "top_left"] = "bottom_right",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    mask: Tensor | None = None,
    block_mask: Tensor | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    return_lse: bool = False,
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`mfa_native.attention` on torch tensors, differentiable.

    The arguments are those of :func:`mfa_native.attention` (``out=``, ``lse=`` and
    ``accumulate`` excepted; ``backend`` a name or None); the result is a new tensor (and,
    with ``return_lse=True``, the float32 log-sum-exp ``[B, Hq, Nq]``, which carries no
    gradient). ``loss.backward()`` runs mfa's fused backward with the forward's options; with
    grouped-query attention the gradients of k and v are summed over each group of query
    heads. ``sinks`` (float32 ``[Hq]``) get their gradient too; masks and ALiBi slopes are
    constants, and one that requires grad is refused (TypeError).
    """
    options = _options(
        causal, causal_alignment, window, scale, mask, block_mask, softcap, alibi_slopes, sinks,
        layout, backend,
    )  # fmt: skip
    if type(return_lse) is not bool:
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    out, lse = _attend(q, k, v, options, return_lse)
    return (out, lse) if return_lse else out  # type: ignore[return-value]


@keyword_hints(_TORCH_NAMES)
def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    causal_alignment: Literal["bottom_right", "top_left"] = "bottom_right",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    mask: Tensor | None = None,
    block_mask: Tensor | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    return_lse: bool = False,
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`mfa_native.attention_varlen` on torch tensors, differentiable as
    :func:`attention` is.

    q is ``[total_q, Hq, D]``, k and v ``[total_k, Hkv, D]`` and ``[total_k, Hkv, Dv]``:
    sequence b has the query rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1`` and the key
    rows of ``cu_seqlens_k`` likewise (int32 ``[B + 1]`` tensors), attended on its own with
    causal, the window and ALiBi aligned with its own lengths; ``max_seqlen_q`` and
    ``max_seqlen_k`` bound the lengths. The other options are :func:`attention`'s. The result
    is ``[total_q, Hq, Dv]`` (and, with ``return_lse=True``, the float32 lse
    ``[Hq, total_q]``, without a gradient); ``loss.backward()`` runs
    :func:`mfa_native.attention_varlen_backward` with the forward's options, sinks included.
    """
    options = _options(
        causal=causal, causal_alignment=causal_alignment, window=window, scale=scale,
        mask=mask, block_mask=block_mask, softcap=softcap, alibi_slopes=alibi_slopes,
        sinks=sinks, layout="bshd", backend=backend,
        packed=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
    )  # fmt: skip
    out, lse = _attend(q, k, v, options)
    return (out, cast(Tensor, lse)) if return_lse else out


_SDPA_NAMES = {
    "causal": "PyTorch's name for it is is_causal= (anchored top-left)",
    "mask": "PyTorch's name for it is attn_mask=",
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
    lets query i see keys 0..i (anchored top-left); ``attn_mask`` broadcastable to
    ``[B, Hq, L, S]``, boolean (True: the pair takes part) or float (added to the scores; q's
    dtype or float32); ``scale`` None means ``1 / sqrt(E)``; ``enable_gqa=True`` lets Hq be a
    multiple of Hkv. One difference: a row that its boolean mask hides entirely gets zeros
    here, where PyTorch gives NaN.

    Raises
    ------
    NotImplementedError
        For ``dropout_p > 0`` (mfa has no dropout) and for an ``attn_mask`` that requires grad
        (mfa does not differentiate masks), rather than ignoring them.
    ValueError
        For ``attn_mask`` together with ``is_causal=True`` and for different head counts
        without ``enable_gqa=True``, as PyTorch refuses them; and for everything
        :func:`mfa_native.attention` rejects (other ranks than 3 and 4, float64...), where the
        arguments are named q, k and v.
    MFAError
        ``UNSUPPORTED`` for ``attn_mask`` on a backend without masks (see
        ``Context.capabilities``).
    """
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
    if attn_mask is not None:
        if is_causal:
            raise ValueError(
                "attn_mask and is_causal=True are given together; PyTorch refuses them too "
                "(fold the causal rule into the mask, or drop the mask)"
            )
        if isinstance(attn_mask, Tensor) and attn_mask.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(
                "attn_mask requires grad: mfa does not differentiate masks, where PyTorch "
                "would; pass attn_mask.detach() if its gradient is not needed"
            )
    if not enable_gqa and query.dim() >= 3 and key.dim() >= 3 and query.shape[-3] != key.shape[-3]:
        raise ValueError(
            f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass "
            "enable_gqa=True for grouped-query attention"
        )
    options = _options(causal=is_causal, causal_alignment="top_left", scale=scale, mask=attn_mask)
    out, _ = _attend(query, key, value, options, False)
    return out


# ---- routing torch.nn.functional.scaled_dot_product_attention -------------------------------

_routing_lock = threading.Lock()
_original_sdpa = torch.nn.functional.scaled_dot_product_attention


def _install(function: Callable[..., Tensor]) -> None:
    """Put function in torch.nn.functional.scaled_dot_product_attention's place."""
    functional = torch.nn.functional
    # torch's stubs type the attribute with positional scale and enable_gqa, which PyTorch
    # takes by keyword only, as this module's function does.
    functional.scaled_dot_product_attention = function


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


def __getattr__(name: str) -> Any:
    # ring_attention and the zig-zag helpers (mfa_native.ring) import torch.distributed: they
    # are loaded on first use.
    if name in ("ring_attention", "zigzag_indices", "zigzag_shard", "zigzag_unshard"):
        from . import ring

        return getattr(ring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
