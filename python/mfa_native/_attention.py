"""attention() and attention_backward(): arrays in (numpy, torch, MLX or any DLPack producer),
libmfa calls, results of the caller's kind out."""

from __future__ import annotations

import math
import numbers
import operator
import struct
from typing import Any, Literal, Optional, Protocol, TypeVar, Union, overload

import numpy as np

from ._arrays import CPU, allocate, device_name, read_array
from ._context import DTYPES, Context, resolve_context
from ._keywords import MFA_NAMES, keyword_hints
from ._library import ffi, lib

__all__ = ["attention", "attention_backward"]

# For each layout, the array axis holding (batch, heads, sequence, head dim) of a rank-4 array.
_LAYOUT_AXES = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}
_ALIGNMENTS = {"bottom_right": lib.MFA_ALIGN_BOTTOM_RIGHT, "top_left": lib.MFA_ALIGN_TOP_LEFT}
_BATCH, _HEADS, _SEQ, _DIM = range(4)
_AXIS_NAMES = ("batch", "heads", "sequence length", "head dim")
_LSE_DTYPE = np.dtype(np.float32)
_TENSOR = ffi.typeof("mfa_tensor*")
_VOID_P = ffi.typeof("void*")
_PARAMS = ffi.typeof("mfa_attention_params*")
_FLOAT32 = struct.Struct("f")


class SupportsDLPack(Protocol):
    """An array exporting DLPack: numpy arrays, torch tensors, MLX arrays and others."""

    def __dlpack__(self) -> Any: ...

    def __dlpack_device__(self) -> tuple[int, int]: ...


Array = TypeVar("Array", bound=SupportsDLPack)
Window = Optional[tuple[Optional[int], Optional[int]]]
Backend = Union[None, str, Context]
Layout = Literal["bhsd", "bshd"]
Alignment = Literal["bottom_right", "top_left"]


class _Layout:
    """Where each logical axis (batch, heads, sequence, head dim) sits in the caller's arrays."""

    def __init__(self, layout, rank):
        self.rank = rank
        axes = _LAYOUT_AXES[layout]
        # Rank 3 means one batch: no batch axis, the others shift down by one.
        self.axes = axes if rank == 4 else (None,) + tuple(axis - 1 for axis in axes[1:])
        # logical(padded) -> (batch, heads, seq, dim) of a shape or strides tuple with one
        # entry put in front (1 for shapes, 0 for strides), which stands for a missing axis.
        self.logical = operator.itemgetter(*(0 if axis is None else axis + 1 for axis in self.axes))

    def size(self, array, logical):
        axis = self.axes[logical]
        return 1 if axis is None else array.shape[axis]

    def shape(self, batch, heads, seq, dim):
        """The array shape holding the given logical sizes in this layout and rank."""
        shape = [0] * self.rank
        for axis, size in zip(self.axes, (batch, heads, seq, dim)):
            if axis is not None:
                shape[axis] = size
        return tuple(shape)

    def require_nonempty(self, name, array):
        for logical, axis in enumerate(self.axes):
            if axis is not None and array.shape[axis] == 0:
                raise ValueError(
                    f"{name}.shape[{axis}] ({_AXIS_NAMES[logical]}) must be at least 1, got 0"
                )

    def require_same(self, name, array, other_name, other, logical):
        axis = self.axes[logical]
        if axis is not None and array.shape[axis] != other.shape[axis]:
            raise ValueError(
                f"{name}.shape[{axis}] ({_AXIS_NAMES[logical]}) must equal "
                f"{other_name}.shape[{axis}] = {other.shape[axis]}, got {array.shape[axis]}"
            )


_LAYOUTS = {(layout, rank): _Layout(layout, rank) for layout in _LAYOUT_AXES for rank in (3, 4)}


def _layout(layout, rank):
    """The _Layout of a layout name for arrays of the given rank (3 or 4)."""
    layout_for_rank = _LAYOUTS.get((layout, rank)) if isinstance(layout, str) else None
    if layout_for_rank is None:
        raise ValueError(f"layout must be one of {sorted(_LAYOUT_AXES)}, got {layout!r}")
    return layout_for_rank


def _check_rank(name, array, rank):
    if array.ndim != rank:
        raise ValueError(f"{name} must have rank {rank} like q, got shape {array.shape}")


_DLPACK_READ_ONLY = (
    ": its DLPack export is read-only, or older than DLPack 1.0 and so cannot say it is not"
)
_READ_ONLY_REASONS = {
    "mlx": ": MLX arrays are values, never written in place",
    "dlpack": _DLPACK_READ_ONLY,
}


def _read_output(name, array, shape, dtype):
    view = read_array(name, array, dtype)
    if view.shape != shape:
        raise ValueError(f"{name}.shape must be {shape}, got {view.shape}")
    if not view.writable:
        raise ValueError(f"{name} must be writable{_READ_ONLY_REASONS.get(view.kind.name, '')}")
    return view


def _tensor(view, layout):
    """An mfa_tensor viewing an array in place: its first element and its strides, never a
    copy."""
    return ffi.new(
        _TENSOR,
        (
            ffi.cast(_VOID_P, view.address),
            DTYPES[view.dtype],
            layout.logical((1, *view.shape)),
            layout.logical((0, *view.strides)),
        ),
    )


def _lse_tensor(view):
    """The C API's [B, Hq, Nq, 1] view of a [B, Hq, Nq] (or [Hq, Nq]) float32 array."""
    shape, strides = view.shape, view.strides
    if len(shape) == 2:
        shape, strides = (1, *shape), (0, *strides)
    return ffi.new(
        _TENSOR,
        (ffi.cast(_VOID_P, view.address), DTYPES[view.dtype], [*shape, 1], [*strides, 0]),
    )


def _device_of(named_views):
    """The one DLPack device type of all the (name, view) pairs of a call."""
    first_name, first = named_views[0]
    for name, view in named_views[1:]:
        if view.device != first.device:
            raise ValueError(
                f"{name} is in {device_name(view.device)} memory but {first_name} is in "
                f"{device_name(first.device)} memory: the arrays of a call must share one"
            )
    return first.device


def _refuse_device_memory(device):
    """Metal memory (MPS tensors, MLX arrays on a Mac: DLPack kDLMetal) is for the metal
    backend's device-buffer entry points, which this libmfa does not have yet. It is refused
    here, before anything is allocated or written, and never copied behind the caller's back."""
    raise NotImplementedError(
        f"the arrays are in {device_name(device)} memory (DLPack kDLMetal: MPS tensors, MLX "
        "arrays on an Apple GPU); they need the metal backend's device-buffer path, which this "
        "libmfa does not have yet. Copy them to CPU memory explicitly (tensor.cpu(), "
        "numpy.array(x)) to run them on the cpu backend"
    )


def _window_bound(side, value):
    if value is None:
        return -1
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"window[{side}] must be an int or None, got {type(value).__name__}")
    if not -1 <= value < 2**63:
        raise ValueError(f"window[{side}] must be >= 0, or -1 / None for unbounded, got {value}")
    return int(value)


def _params(causal, causal_alignment, window, scale):
    """Validate the masking and scaling options and return the C parameter struct."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(causal_alignment, str) or causal_alignment not in _ALIGNMENTS:
        raise ValueError(
            f"causal_alignment must be one of {sorted(_ALIGNMENTS)}, got {causal_alignment!r}"
        )
    if window is None:
        left = right = -1
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"window must be None or a pair (left, right), got {window!r}")
        left, right = _window_bound(0, window[0]), _window_bound(1, window[1])
    if scale is None:
        scale_value = 0.0  # the C library's "1 / sqrt(D)"
    else:
        if not isinstance(scale, numbers.Real) or isinstance(scale, (bool, np.bool_)):
            raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
        try:
            # Rounded to the nearest float32, as the C library receives it.
            scale_value = _FLOAT32.unpack(_FLOAT32.pack(float(scale)))[0]
        except OverflowError:  # beyond the float or float32 range: reported just below
            scale_value = math.inf
        if not math.isfinite(scale_value) or scale_value == 0.0:
            raise ValueError(f"scale must be finite and nonzero as a float32, got {scale!r}")
    params = ffi.new(_PARAMS)
    lib.mfa_attention_params_init(params)
    params.scale = scale_value
    params.causal = int(causal)
    params.alignment = _ALIGNMENTS[causal_alignment]
    params.window_left = left
    params.window_right = right
    return params


def _read_inputs(q, k, v, layout):
    """Read and check q, k and v against each other; return their views and the _Layout
    describing them."""
    q = read_array("q", q)
    if q.ndim not in (3, 4):
        raise ValueError(f"q must have rank 4 (or 3 for a single batch), got shape {q.shape}")
    k = read_array("k", k, q.dtype)
    _check_rank("k", k, q.ndim)
    v = read_array("v", v, q.dtype)
    _check_rank("v", v, q.ndim)
    arrays = _layout(layout, q.ndim)
    q_batch, heads_q, _, dim = q_sizes = arrays.logical((1, *q.shape))
    k_batch, heads_kv, seq_k, k_dim = k_sizes = arrays.logical((1, *k.shape))
    v_batch, v_heads, v_seq, _ = v_sizes = arrays.logical((1, *v.shape))
    consistent = (
        0 not in q_sizes
        and 0 not in k_sizes
        and 0 not in v_sizes
        and q_batch == k_batch == v_batch
        and heads_kv == v_heads
        and dim == k_dim
        and seq_k == v_seq
    )
    if not consistent:  # say which axis, in this order
        for name, array in (("q", q), ("k", k), ("v", v)):
            arrays.require_nonempty(name, array)
        arrays.require_same("k", k, "q", q, _BATCH)
        arrays.require_same("v", v, "q", q, _BATCH)
        arrays.require_same("v", v, "k", k, _HEADS)
        arrays.require_same("k", k, "q", q, _DIM)
        arrays.require_same("v", v, "k", k, _SEQ)
    if heads_q % heads_kv:
        axis = arrays.axes[_HEADS]
        raise ValueError(
            f"q.shape[{axis}] (query heads) = {heads_q} must be a multiple of "
            f"k.shape[{axis}] (key/value heads) = {heads_kv}"
        )
    return q, k, v, arrays


def _lse_shape(arrays, batch, heads_q, seq_q):
    """lse's shape: [B, Hq, Nq], or [Hq, Nq] for rank-3 arrays, whatever the layout."""
    return (batch, heads_q, seq_q) if arrays.rank == 4 else (heads_q, seq_q)


def _read_lse_flag(return_lse):
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    return bool(return_lse)


@overload
def attention(
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    *,
    causal: bool = ...,
    causal_alignment: Alignment = ...,
    window: Window = ...,
    scale: float | None = ...,
    layout: Layout = ...,
    return_lse: Literal[False] = ...,
    backend: Backend = ...,
    out: SupportsDLPack | None = ...,
) -> Array: ...


@overload
def attention(
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    *,
    causal: bool = ...,
    causal_alignment: Alignment = ...,
    window: Window = ...,
    scale: float | None = ...,
    layout: Layout = ...,
    return_lse: Literal[True],
    backend: Backend = ...,
    out: SupportsDLPack | None = ...,
) -> tuple[Array, Array]: ...


@keyword_hints(MFA_NAMES)
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
    out=None,
):
    """Exact attention ``softmax(scale * q @ k^T + mask) @ v`` without an N x N buffer.

    Parameters
    ----------
    q : array, shape (B, Hq, Nq, D)
        Queries: float32, float16 or bfloat16. Rank 3 ``(Hq, Nq, D)`` means B = 1.
        With ``layout="bshd"`` the axes are ``(B, Nq, Hq, D)`` (rank 3: ``(Nq, Hq, D)``).
        Any array in CPU memory: a numpy array (bfloat16 as ``ml_dtypes.bfloat16``), a torch
        tensor, an MLX array, or any other object implementing DLPack. It is read in place,
        never copied.
    k : array, shape (B, Hkv, Nk, D)
        Keys, q's dtype and rank. Hq must be a multiple of Hkv (grouped-query attention):
        query head h reads key/value head ``h // (Hq // Hkv)``.
    v : array, shape (B, Hkv, Nk, Dv)
        Values, q's dtype and rank. Dv may differ from D.
    causal : bool
        Mask keys after the aligned query position.
    causal_alignment : {"bottom_right", "top_left"}
        Where the causal diagonal and the window are anchored when Nq != Nk. "bottom_right"
        (FlashAttention >= 2.1, MLX) lets the last query see the last key; "top_left"
        (PyTorch ``is_causal``) lets query i see key i.
    window : None or (left, right)
        Sliding window: query at aligned position p sees keys ``p - left .. p + right``;
        -1 or None leaves a side unbounded. A query that sees no key gets zeros (lse -inf).
    scale : float, optional
        Multiplies ``q @ k^T``; None means ``1 / sqrt(D)``. Must be finite and nonzero.
    layout : {"bhsd", "bshd"}
        Axis order of every array argument and result (lse excepted). Any strides work,
        including slices, transposes and negative strides: arrays are never copied.
    return_lse : bool
        Also return the natural-log log-sum-exp of each row of the scaled, masked scores.
    backend : None, str or Context
        None uses a shared "auto" context; a name ("auto", "cpu", "metal", "metal-sim") uses a
        shared context for that backend.
    out : array, optional
        Where to write the result: shape (B, Hq, Nq, Dv) in the layout, q's dtype, writable,
        not overlapping any input. May be a strided view, of any kind.

    Returns
    -------
    out : array of q's kind, shape (B, Hq, Nq, Dv)
        In the layout of the inputs; ``out`` itself when given. q's kind: a numpy array for
        numpy q, a torch tensor for a torch q, an MLX array for an MLX q (numpy for other
        DLPack producers), written in place.
    lse : array of q's kind, float32, shape (B, Hq, Nq)
        Only with ``return_lse=True``; ``(Hq, Nq)`` for rank-3 inputs, whatever the layout.

    Raises
    ------
    TypeError, ValueError
        For arguments of the wrong type, dtype, rank, shape or value, before anything is
        written; TypeError for a torch tensor that requires grad while grad mode is on (this
        function does not record autograd: use :func:`mfa_native.torch.attention`) and for a
        keyword of another library (``is_causal=``, ``softmax_scale=``...), naming mfa's.
    NotImplementedError
        For arrays in Metal memory (MPS tensors, MLX arrays on an Apple GPU), which need the
        metal backend's device-buffer path; they are never copied to the CPU implicitly.
    MFAError
        For what the library rejects (also before anything is written) or fails to run.
    """
    q, k, v, arrays = _read_inputs(q, k, v, layout)
    params = _params(causal, causal_alignment, window, scale)
    return_lse = _read_lse_flag(return_lse)
    batch, heads_q, seq_q = arrays.size(q, _BATCH), arrays.size(q, _HEADS), arrays.size(q, _SEQ)
    out_shape = arrays.shape(batch, heads_q, seq_q, arrays.size(v, _DIM))
    named = [("q", q), ("k", k), ("v", v)]
    if out is not None:
        out_view = _read_output("out", out, out_shape, q.dtype)
        named.append(("out", out_view))
    context = resolve_context(backend)
    device = _device_of(named)
    if device != CPU:
        _refuse_device_memory(device)

    results = iter(
        allocate(
            q.kind,
            ([(out_shape, q.dtype)] if out is None else [])
            + ([(_lse_shape(arrays, batch, heads_q, seq_q), _LSE_DTYPE)] if return_lse else []),
        )
    )
    if out is None:
        out, out_view = next(results)
    if return_lse:
        lse, lse_view = next(results)
    context._call(
        lib.mfa_attention_forward,
        params,
        _tensor(q, arrays),
        _tensor(k, arrays),
        _tensor(v, arrays),
        _tensor(out_view, arrays),
        _lse_tensor(lse_view) if return_lse else ffi.NULL,
    )
    return (out, lse) if return_lse else out


@keyword_hints(MFA_NAMES)
def attention_backward(
    dout: SupportsDLPack,
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    out: SupportsDLPack,
    lse: SupportsDLPack,
    *,
    causal: bool = False,
    causal_alignment: Alignment = "bottom_right",
    window: Window = None,
    scale: float | None = None,
    layout: Layout = "bhsd",
    backend: Backend = None,
    dq: SupportsDLPack | None = None,
    dk: SupportsDLPack | None = None,
    dv: SupportsDLPack | None = None,
) -> tuple[Array, Array, Array]:
    """Gradients of :func:`attention` with respect to q, k and v.

    Parameters
    ----------
    dout : array, shape (B, Hq, Nq, Dv)
        Gradient of the loss with respect to ``out``; q's dtype, the layout of the inputs.
    q, k, v : array
        The forward inputs, shaped as for :func:`attention`.
    out : array, shape (B, Hq, Nq, Dv)
        The forward result.
    lse : array of float32, shape (B, Hq, Nq)
        The forward log-sum-exp (``return_lse=True``); ``(Hq, Nq)`` for rank-3 inputs.
    causal, causal_alignment, window, scale, layout, backend
        As given to :func:`attention`. They must match the forward call: nothing here can
        tell, and other options give wrong gradients. The framework adapters
        (:mod:`mfa_native.torch`, :mod:`mfa_native.flash_attn`, :mod:`mfa_native.mlx`) carry
        the forward's options to the backward themselves, so there they cannot differ.
    dq, dk, dv : array, optional
        Where to write the gradients: shaped like q, k and v, q's dtype, writable, not
        overlapping each other or any input. May be strided views.

    Every array is any kind that :func:`attention` takes, in CPU memory.

    Returns
    -------
    dq : array of q's kind, shape (B, Hq, Nq, D)
    dk : array of q's kind, shape (B, Hkv, Nk, D)
        With grouped-query attention, summed over the query heads sharing each key head.
    dv : array of q's kind, shape (B, Hkv, Nk, Dv)
        Given arrays are returned as themselves.

    Raises
    ------
    TypeError, ValueError, NotImplementedError, MFAError
        As for :func:`attention`; nothing is written when one is raised.
    """
    q_view, k_view, v_view, arrays = _read_inputs(q, k, v, layout)
    batch = arrays.size(q_view, _BATCH)
    heads_q, seq_q = arrays.size(q_view, _HEADS), arrays.size(q_view, _SEQ)
    dtype = q_view.dtype
    out_shape = arrays.shape(batch, heads_q, seq_q, arrays.size(v_view, _DIM))
    out_view = read_array("out", out, dtype)
    if out_view.shape != out_shape:
        raise ValueError(f"out.shape must be {out_shape} (from q and v), got {out_view.shape}")
    dout_view = read_array("dout", dout, dtype)
    if dout_view.shape != out_shape:
        raise ValueError(f"dout.shape must be {out_shape} (from q and v), got {dout_view.shape}")
    lse_shape = _lse_shape(arrays, batch, heads_q, seq_q)
    lse_view = read_array("lse", lse, _LSE_DTYPE)
    if lse_view.shape != lse_shape:
        raise ValueError(f"lse.shape must be {lse_shape} (from q), got {lse_view.shape}")
    params = _params(causal, causal_alignment, window, scale)
    inputs = [q_view, k_view, v_view, out_view, dout_view, lse_view]
    named = list(zip(("q", "k", "v", "out", "dout", "lse"), inputs))
    given: dict[str, Any] = {}
    for name, array, like in (("dq", dq, q_view), ("dk", dk, k_view), ("dv", dv, v_view)):
        if array is not None:
            given[name] = (array, _read_output(name, array, like.shape, dtype))
            named.append((name, given[name][1]))
    context = resolve_context(backend)
    device = _device_of(named)
    if device != CPU:
        _refuse_device_memory(device)

    missing = [
        (name, like)
        for name, like in (("dq", q_view), ("dk", k_view), ("dv", v_view))
        if name not in given
    ]
    given.update(
        zip(
            (name for name, _ in missing),
            allocate(q_view.kind, [(like.shape, dtype) for _, like in missing]),
        )
    )
    gradients = [given["dq"], given["dk"], given["dv"]]
    context._call(
        lib.mfa_attention_backward,
        params,
        *(_tensor(view, arrays) for view in inputs[:5]),
        _lse_tensor(lse_view),
        *(_tensor(view, arrays) for _, view in gradients),
    )
    dq_result, dk_result, dv_result = (array for array, _ in gradients)
    return dq_result, dk_result, dv_result
