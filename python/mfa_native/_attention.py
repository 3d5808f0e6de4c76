"""attention() and attention_backward(): numpy arrays in, libmfa calls, numpy arrays out."""

import math
import numbers

import numpy as np

from ._context import DTYPES, resolve_context
from ._library import ffi, lib

__all__ = ["attention", "attention_backward"]

# For each layout, the array axis holding (batch, heads, sequence, head dim) of a rank-4 array.
_LAYOUT_AXES = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}
_ALIGNMENTS = {"bottom_right": lib.MFA_ALIGN_BOTTOM_RIGHT, "top_left": lib.MFA_ALIGN_TOP_LEFT}
_BATCH, _HEADS, _SEQ, _DIM = range(4)
_AXIS_NAMES = ("batch", "heads", "sequence length", "head dim")
_LSE_DTYPE = np.dtype(np.float32)


class _Layout:
    """Where each logical axis (batch, heads, sequence, head dim) sits in the caller's arrays."""

    def __init__(self, layout, rank):
        if not isinstance(layout, str) or layout not in _LAYOUT_AXES:
            raise ValueError(f"layout must be one of {sorted(_LAYOUT_AXES)}, got {layout!r}")
        self.rank = rank
        axes = _LAYOUT_AXES[layout]
        # Rank 3 means one batch: no batch axis, the others shift down by one.
        self.axes = axes if rank == 4 else (None,) + tuple(axis - 1 for axis in axes[1:])

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


def _check_array(name, array, dtype=None):
    """Type, dtype and memory checks shared by every array argument.

    dtype None accepts any of the storage dtypes; otherwise the array must have exactly it.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(array).__name__}")
    if dtype is None:
        if array.dtype not in DTYPES:
            raise TypeError(
                f"{name}.dtype must be float32, float16 or bfloat16 (native byte order), "
                f"got {array.dtype}"
            )
    elif array.dtype != dtype:
        raise TypeError(f"{name}.dtype must be {dtype}, got {array.dtype}")
    if any(stride % array.itemsize for stride in array.strides):
        raise ValueError(
            f"{name}.strides {array.strides} must be multiples of the itemsize {array.itemsize}"
        )
    if not array.flags.aligned:
        raise ValueError(f"{name} must be aligned to its itemsize {array.itemsize}")


def _check_rank(name, array, rank):
    if array.ndim != rank:
        raise ValueError(f"{name} must have rank {rank} like q, got shape {array.shape}")


def _check_output(name, array, shape, dtype):
    _check_array(name, array, dtype)
    if array.shape != shape:
        raise ValueError(f"{name}.shape must be {shape}, got {array.shape}")
    if not array.flags.writeable:
        raise ValueError(f"{name} must be writable")


def _tensor(array, layout):
    """An mfa_tensor viewing array in place: its first element and its strides, never a copy."""
    tensor = ffi.new("mfa_tensor*")
    tensor.data = ffi.cast("void*", array.__array_interface__["data"][0])
    tensor.dtype = DTYPES[array.dtype]
    for logical, axis in enumerate(layout.axes):
        if axis is None:
            tensor.shape[logical] = 1
            tensor.strides[logical] = 0
        else:
            tensor.shape[logical] = array.shape[axis]
            tensor.strides[logical] = array.strides[axis] // array.itemsize
    return tensor


def _lse_tensor(lse):
    """The C API's [B, Hq, Nq, 1] view of a [B, Hq, Nq] (or [Hq, Nq]) float32 array."""
    return _tensor(lse[..., None], _Layout("bhsd", lse.ndim + 1))


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
            scale_value = float(scale)
        except OverflowError:  # an int beyond the float range
            scale_value = math.inf
        with np.errstate(over="ignore"):  # too large for float32 is reported just below
            scale_value = float(np.float32(scale_value))
        if not math.isfinite(scale_value) or scale_value == 0.0:
            raise ValueError(f"scale must be finite and nonzero as a float32, got {scale!r}")
    params = ffi.new("mfa_attention_params*")
    lib.mfa_attention_params_init(params)
    params.scale = scale_value
    params.causal = int(causal)
    params.alignment = _ALIGNMENTS[causal_alignment]
    params.window_left = left
    params.window_right = right
    return params


def _check_inputs(q, k, v, layout):
    """Check q, k and v against each other; return the _Layout describing them."""
    _check_array("q", q)
    if q.ndim not in (3, 4):
        raise ValueError(f"q must have rank 4 (or 3 for a single batch), got shape {q.shape}")
    for name, array in (("k", k), ("v", v)):
        _check_array(name, array, q.dtype)
        _check_rank(name, array, q.ndim)
    arrays = _Layout(layout, q.ndim)
    for name, array in (("q", q), ("k", k), ("v", v)):
        arrays.require_nonempty(name, array)
    arrays.require_same("k", k, "q", q, _BATCH)
    arrays.require_same("v", v, "q", q, _BATCH)
    arrays.require_same("v", v, "k", k, _HEADS)
    arrays.require_same("k", k, "q", q, _DIM)
    arrays.require_same("v", v, "k", k, _SEQ)
    heads_q, heads_kv = arrays.size(q, _HEADS), arrays.size(k, _HEADS)
    if heads_q % heads_kv:
        axis = arrays.axes[_HEADS]
        raise ValueError(
            f"q.shape[{axis}] (query heads) = {heads_q} must be a multiple of "
            f"k.shape[{axis}] (key/value heads) = {heads_kv}"
        )
    return arrays


def _lse_shape(arrays, batch, heads_q, seq_q):
    """lse's shape: [B, Hq, Nq], or [Hq, Nq] for rank-3 arrays, whatever the layout."""
    return (batch, heads_q, seq_q) if arrays.rank == 4 else (heads_q, seq_q)


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
    q : ndarray, shape (B, Hq, Nq, D)
        Queries: float32, float16 or ml_dtypes.bfloat16. Rank 3 ``(Hq, Nq, D)`` means B = 1.
        With ``layout="bshd"`` the axes are ``(B, Nq, Hq, D)`` (rank 3: ``(Nq, Hq, D)``).
    k : ndarray, shape (B, Hkv, Nk, D)
        Keys, q's dtype and rank. Hq must be a multiple of Hkv (grouped-query attention):
        query head h reads key/value head ``h // (Hq // Hkv)``.
    v : ndarray, shape (B, Hkv, Nk, Dv)
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
        Also return the natural-log log-sum-exp of each row's scaled, masked scores.
    backend : None, str or Context
        None uses a shared "auto" context; a name ("auto", "cpu", "metal", "metal-sim") uses a
        shared context for that backend.
    out : ndarray, optional
        Where to write the result: shape (B, Hq, Nq, Dv) in the layout, q's dtype, writable,
        not overlapping any input. May be a strided view.

    Returns
    -------
    out : ndarray, shape (B, Hq, Nq, Dv)
        In the layout of the inputs; ``out`` itself when given.
    lse : ndarray of float32, shape (B, Hq, Nq)
        Only with ``return_lse=True``; ``(Hq, Nq)`` for rank-3 inputs, whatever the layout.

    Raises
    ------
    TypeError, ValueError
        For arguments of the wrong type, dtype, rank, shape or value, before anything is
        written.
    MFAError
        For what the library rejects (also before anything is written) or fails to run.
    """
    arrays = _check_inputs(q, k, v, layout)
    params = _params(causal, causal_alignment, window, scale)
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    batch, heads_q, seq_q = (arrays.size(q, axis) for axis in (_BATCH, _HEADS, _SEQ))
    out_shape = arrays.shape(batch, heads_q, seq_q, arrays.size(v, _DIM))
    if out is not None:
        _check_output("out", out, out_shape, q.dtype)
    context = resolve_context(backend)

    if out is None:
        out = np.empty(out_shape, q.dtype)
    lse = np.empty(_lse_shape(arrays, batch, heads_q, seq_q), _LSE_DTYPE) if return_lse else None
    context._call(
        lib.mfa_attention_forward,
        params,
        _tensor(q, arrays),
        _tensor(k, arrays),
        _tensor(v, arrays),
        _tensor(out, arrays),
        _lse_tensor(lse) if return_lse else ffi.NULL,
    )
    return (out, lse) if return_lse else out


def attention_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    *,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
    layout="bhsd",
    backend=None,
    dq=None,
    dk=None,
    dv=None,
):
    """Gradients of :func:`attention` with respect to q, k and v.

    Parameters
    ----------
    dout : ndarray, shape (B, Hq, Nq, Dv)
        Gradient of the loss with respect to ``out``; q's dtype, the layout of the inputs.
    q, k, v : ndarray
        The forward inputs, shaped as for :func:`attention`.
    out : ndarray, shape (B, Hq, Nq, Dv)
        The forward result.
    lse : ndarray of float32, shape (B, Hq, Nq)
        The forward log-sum-exp (``return_lse=True``); ``(Hq, Nq)`` for rank-3 inputs.
    causal, causal_alignment, window, scale, layout, backend
        As given to :func:`attention`; they must match the forward call.
    dq, dk, dv : ndarray, optional
        Where to write the gradients: shaped like q, k and v, q's dtype, writable, not
        overlapping each other or any input. May be strided views.

    Returns
    -------
    dq : ndarray, shape (B, Hq, Nq, D)
    dk : ndarray, shape (B, Hkv, Nk, D)
        With grouped-query attention, summed over the query heads sharing each key head.
    dv : ndarray, shape (B, Hkv, Nk, Dv)

    Raises
    ------
    TypeError, ValueError, MFAError
        As for :func:`attention`; nothing is written when one is raised.
    """
    arrays = _check_inputs(q, k, v, layout)
    batch, heads_q, seq_q = (arrays.size(q, axis) for axis in (_BATCH, _HEADS, _SEQ))
    out_shape = arrays.shape(batch, heads_q, seq_q, arrays.size(v, _DIM))
    for name, array in (("out", out), ("dout", dout)):
        _check_array(name, array, q.dtype)
        if array.shape != out_shape:
            raise ValueError(f"{name}.shape must be {out_shape} (from q and v), got {array.shape}")
    lse_shape = _lse_shape(arrays, batch, heads_q, seq_q)
    _check_array("lse", lse, _LSE_DTYPE)
    if lse.shape != lse_shape:
        raise ValueError(f"lse.shape must be {lse_shape} (from q), got {lse.shape}")
    params = _params(causal, causal_alignment, window, scale)
    for name, given, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if given is not None:
            _check_output(name, given, like.shape, q.dtype)
    context = resolve_context(backend)

    dq, dk, dv = (
        np.empty(like.shape, q.dtype) if given is None else given
        for given, like in ((dq, q), (dk, k), (dv, v))
    )
    context._call(
        lib.mfa_attention_backward,
        params,
        _tensor(q, arrays),
        _tensor(k, arrays),
        _tensor(v, arrays),
        _tensor(out, arrays),
        _tensor(dout, arrays),
        _lse_tensor(lse),
        _tensor(dq, arrays),
        _tensor(dk, arrays),
        _tensor(dv, arrays),
    )
    return dq, dk, dv
