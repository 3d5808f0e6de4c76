"""The attention functions: arrays in (numpy, torch, MLX or any DLPack producer), one
mfa_attention_compute call (or mfa_attention_merge, mfa_mask_summarize), results of the
caller's kind out.

Every function reads and checks its arguments in the same order: the operands (their kinds,
dtypes, ranks and shapes), the options, the score modifiers, the given outputs; then the
context and the one memory kind of the call; then it allocates the missing outputs and calls
the library, which checks what depends on the contents of the arrays (overlaps, the values of
the integer arrays) and the backend's capabilities before it writes anything.
"""

from __future__ import annotations

import math
import numbers
import operator
import struct
from collections.abc import Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Optional,
    Protocol,
    TypedDict,
    TypeVar,
    Union,
    overload,
)

import numpy as np

from ._arrays import (
    BOOL,
    CPU,
    INT32,
    METAL,
    UINT8,
    allocate,
    device_name,
    read_array,
    synchronize,
)
from ._context import ARRAY_DTYPES, Context, available_backends, resolve_context
from ._device import encoding_target
from ._keywords import MFA_NAMES, keyword_hints
from ._library import ffi, lib

# For each layout, the array axis holding (batch, heads, sequence, head dim) of a rank-4 array.
_LAYOUT_AXES = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}
_ALIGNMENTS = {"bottom_right": lib.MFA_ALIGN_BOTTOM_RIGHT, "top_left": lib.MFA_ALIGN_TOP_LEFT}
_BATCH, _HEADS, _SEQ, _DIM = range(4)
_AXIS_NAMES = ("batch", "heads", "sequence length", "head dim")
_F32 = np.dtype(np.float32)
_ARGS = ffi.typeof("mfa_attention_args*")
_ARGS_SIZE = ffi.sizeof("mfa_attention_args")
_ARRAYS = ffi.typeof("mfa_array[]")


def _array_struct():
    """struct.Struct packing one mfa_array from (data, buffer, byte_offset, dtype, *shape,
    *strides), the pointers as integers, at the offsets cffi reads from the header: a call's
    arrays are packed by it in half the time cffi takes to fill the structs from tuples."""
    fields = (("data", "Q"), ("buffer", "Q"), ("byte_offset", "q"), ("dtype", "i"))
    fields += (("shape", "4q"), ("strides", "4q"))
    layout, end = "=", 0
    for name, code in fields:
        offset = ffi.offsetof("mfa_array", name)
        layout += f"{offset - end}x{code}"
        end = offset + struct.calcsize("=" + code)
    packer = struct.Struct(f"{layout}{ffi.sizeof('mfa_array') - end}x")
    if ffi.sizeof("mfa_dtype") != 4 or packer.size != ffi.sizeof("mfa_array"):
        raise ImportError("mfa_array's layout is not the one mfa_native packs: rebuild it")
    return packer


_ARRAY = _array_struct()
_ARRAY_POINTERS = ffi.typeof("mfa_array*[]")
_PARAMS = ffi.typeof("mfa_attention_params*")
_FLOAT32 = struct.Struct("f")
_MASK_BLOCK = lib.MFA_MASK_BLOCK
_INT32_MAX = 2**31 - 1


class SupportsDLPack(Protocol):
    """An array exporting DLPack: numpy arrays, torch tensors, MLX arrays and others."""

    def __dlpack__(self) -> Any: ...

    def __dlpack_device__(self) -> tuple[int, int]: ...


Array = TypeVar("Array", bound=SupportsDLPack)
Window = Optional[tuple[Optional[int], Optional[int]]]
Backend = Union[None, str, Context]
Layout = Literal["bhsd", "bshd"]
Alignment = Literal["bottom_right", "top_left"]

if TYPE_CHECKING:
    # The keyword arguments the typed signatures of the overloaded functions share: each
    # group once, so that mypy checks every keyword of every function (the functions
    # themselves spell theirs out, with their defaults).
    from typing_extensions import Unpack

    Operand = TypeVar("Operand")

    class Scores(TypedDict, Generic[Operand], total=False):
        """The masking, scaling and score modifiers of every attention call, with their
        arrays of type Operand (the adapters' signatures use them too)."""

        causal: bool
        causal_alignment: Alignment
        window: Window
        scale: float | None
        mask: Operand | None
        block_mask: Operand | None
        softcap: float | None
        alibi_slopes: Operand | None
        sinks: Operand | None

    class _Outputs(TypedDict, total=False):
        """Where a forward call or a merge writes, and the backend that computes it."""

        backend: Backend
        out: SupportsDLPack | None
        lse: SupportsDLPack | None

    class _PackedForward(Scores[SupportsDLPack], _Outputs, total=False):
        accumulate: bool

    class _Forward(_PackedForward, total=False):
        layout: Layout

    class _Merge(_Outputs, total=False):
        layout: Layout


class _Layout:
    """Where each logical axis (batch, heads, sequence, head dim) sits in the caller's arrays.

    Its conversions are made once per layout and rank, as gathers of tuple entries: a small
    call converts the shapes and strides of four arrays or more, and rebuilding the tuples
    through loops took some 3 us of a [B, N, H, D] call."""

    def __init__(self, layout, rank):
        self.rank = rank
        axes = _LAYOUT_AXES[layout]
        # Rank 3 means one batch: no batch axis, the others shift down by one.
        self.axes = axes if rank == 4 else (None,) + tuple(axis - 1 for axis in axes[1:])
        # sizes(array): its (batch, heads, seq, dim); view(view): (shape, strides) of the C
        # API's [B, H, N, D] view of it. [B, H, N, D] arrays are that view as they are; rank 3
        # gathers from the tuple with one entry put in front (1 for shapes, 0 for strides),
        # which stands for the missing batch axis.
        if self.axes == (0, 1, 2, 3):
            self.sizes = _shape
            self.view = _shape_and_strides
        elif rank == 4:
            gather = operator.itemgetter(*axes)
            self.sizes = lambda array: gather(array.shape)
            self.view = lambda view: (gather(view.shape), gather(view.strides))
        else:
            padded = operator.itemgetter(*(0 if axis is None else axis + 1 for axis in self.axes))
            self.sizes = lambda array: padded((1, *array.shape))
            self.view = lambda view: (padded((1, *view.shape)), padded((0, *view.strides)))
        place = operator.itemgetter(*(self.axes.index(axis) for axis in range(rank)))
        # The array shape holding the given logical sizes (batch, heads, seq, dim).
        self.shape = lambda batch, heads, seq, dim: place((batch, heads, seq, dim))

    def size(self, array, logical):
        axis = self.axes[logical]
        return 1 if axis is None else array.shape[axis]

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


def _shape(array):
    return array.shape


def _shape_and_strides(view):
    return view.shape, view.strides


_LAYOUTS = {(layout, rank): _Layout(layout, rank) for layout in _LAYOUT_AXES for rank in (3, 4)}
# Packed sequences, [total, H, D]: the layout of one batch of [N, H, D] arrays.
_PACKED = _LAYOUTS["bshd", 3]


def _layout(layout, rank):
    """The _Layout of a layout name for arrays of the given rank (3 or 4)."""
    layout_for_rank = _LAYOUTS.get((layout, rank)) if isinstance(layout, str) else None
    if layout_for_rank is None:
        raise ValueError(f"layout must be one of {sorted(_LAYOUT_AXES)}, got {layout!r}")
    return layout_for_rank


def _check_rank(name, array, rank, like="like q"):
    if array.ndim != rank:
        raise ValueError(f"{name} must have rank {rank} {like}, got shape {array.shape}")


_DLPACK_READ_ONLY = (
    ": its DLPack export is read-only, or older than DLPack 1.0 and so cannot say it is not"
)
_READ_ONLY_REASONS = {
    "mlx": ": MLX arrays are values, never written in place",
    "dlpack": _DLPACK_READ_ONLY,
}


def _read_output(name, array, shape, dtype, origin=""):
    view = read_array(name, array, dtype)
    if view.shape != shape:
        raise ValueError(f"{name}.shape must be {shape}{origin}, got {view.shape}")
    if not view.writable:
        raise ValueError(f"{name} must be writable{_READ_ONLY_REASONS.get(view.kind.name, '')}")
    return view


def _read_shaped(name, array, shape, dtype, origin):
    """An input array that must have exactly the given shape."""
    view = read_array(name, array, dtype)
    if view.shape != shape:
        raise ValueError(f"{name}.shape must be {shape}{origin}, got {view.shape}")
    return view


def _lse_view(view):
    """The C API's [B, Hq, Nq, 1] view of a [B, Hq, Nq] (or [Hq, Nq]) float32 array."""
    shape, strides = view.shape, view.strides
    if len(shape) == 2:
        shape, strides = (1, *shape), (0, *strides)
    return (*shape, 1), (*strides, 0)


def _head_vector_view(view):
    """The C API's [1, Hq, 1, 1] view of a [Hq] array (sinks, dsinks) and [B or 1, Hq, 1, 1]
    of a [B or 1, Hq] one (ALiBi slopes)."""
    if len(view.shape) == 1:
        return (1, view.shape[0], 1, 1), (0, view.strides[0], 0, 0)
    return (*view.shape, 1, 1), (*view.strides, 0, 0)


def _broadcast_view(view):
    """The C API's rank-4 view of an array of rank <= 4 broadcast numpy's way: missing leading
    axes of size 1 (stride 0)."""
    missing = 4 - len(view.shape)
    return (1,) * missing + tuple(view.shape), (0,) * missing + tuple(view.strides)


def _vector_view(view, axis=3):
    """The C API's view of a rank-1 array along one axis (offsets) and of a rank-2 [B, n] array
    along batch and the last axis (block tables)."""
    if len(view.shape) == 1:
        shape, strides = [1, 1, 1, 1], [0, 0, 0, 0]
        shape[axis], strides[axis] = view.shape[0], view.strides[0]
        return tuple(shape), tuple(strides)
    return (view.shape[0], 1, 1, view.shape[1]), (view.strides[0], 0, 0, view.strides[1])


class _Call:
    """The arrays of one library call: each one's C view (shape and strides in the C API's
    axis order) under its role, and the (name, view) pairs that must share one memory kind."""

    __slots__ = ("roles", "named", "device", "memory")

    def __init__(self):
        self.roles = []
        self.named = []
        self.device = CPU  # of every array, once check_memory has run
        self.memory = None  # the first array's view, whose memory results share

    def add(self, role, name, view, c_view):
        self.roles.append((role, view, c_view))
        self.named.append((name, view))

    def arrays(self):
        """(mfa_array[], {role: pointer into it}) for every array added."""
        arrays = ffi.new(_ARRAYS, len(self.roles))
        memory, pack, size = ffi.buffer(arrays), _ARRAY.pack_into, _ARRAY.size
        for index, (_, view, (shape, strides)) in enumerate(self.roles):
            pack(
                memory, index * size, *_memory_fields(view), ARRAY_DTYPES[view.dtype], *shape,
                *strides,
            )  # fmt: skip
        return arrays, {role: arrays + index for index, (role, _, _) in enumerate(self.roles)}

    def check_memory(self, context):
        """The arrays of a call share one memory kind; Metal memory is for the metal backend
        only (its handles mean nothing to another)."""
        first_name, first = self.named[0]
        for name, view in self.named[1:]:
            if view.device != first.device:
                raise ValueError(
                    f"{name} is in {device_name(view.device)} memory but {first_name} is in "
                    f"{device_name(first.device)} memory: the arrays of a call must share one"
                )
        if first.device == METAL and context.backend != "metal":
            _refuse_metal_memory(first_name, context.backend)
        self.device = first.device
        self.memory = first

    def synchronize(self):
        """Right before the library call, once every result is allocated: in device memory,
        the producers of the arrays finish what they queued on them (torch.mps.synchronize);
        in CPU memory there is nothing to wait for."""
        if self.device != CPU:
            synchronize([view for _, view in self.named])


def _memory_fields(view):
    """(data, buffer, byte_offset) of the mfa_array of a view, the pointers as integers: host
    memory, or a device buffer (a DeviceBuffer's handle, or kDLMetal's id<MTLBuffer>) at its
    byte offset."""
    if view.device == CPU:
        return (view.address, 0, 0)
    return (0, view.address, view.byte_offset)


def _refuse_metal_memory(name, backend):
    """Metal memory (MPS tensors, MLX arrays on a Mac: DLPack kDLMetal) goes to the metal
    backend's device buffers only. Elsewhere it is refused before anything is allocated or
    written, and never copied behind the caller's back."""
    here = available_backends()
    where = (
        "Use backend='metal'"
        if "metal" in here
        else f"This machine has no metal backend (available: {', '.join(here)})"
    )
    raise NotImplementedError(
        f"{name} is in Metal memory (DLPack kDLMetal: MPS tensors, MLX arrays on an Apple "
        f"GPU), which only the metal backend reads, not {backend!r}. {where}; or copy the "
        "arrays to CPU memory explicitly (tensor.cpu(), numpy.array(x))"
    )


# ---- scalar options -------------------------------------------------------------------------


def _is_integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _float32(name, value, what):
    """value as the float32 the C library receives, with a TypeError for anything but a real
    number; what says in words what it must be, for the caller's ValueError."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(float(value)))[0]
    except OverflowError:  # beyond the float or float32 range: not finite as a float32
        return math.inf


def _window_bound(side, value):
    if value is None:
        return -1
    if not _is_integer(value):
        raise TypeError(f"window[{side}] must be an int or None, got {type(value).__name__}")
    if not -1 <= value < 2**63:
        raise ValueError(f"window[{side}] must be >= 0, or -1 / None for unbounded, got {value}")
    return int(value)


# (causal, causal_alignment, window, scale and their types) -> the parameter struct made for
# them, shared by the calls that repeat them (read-only once made, so across threads too).
_params_made: dict[tuple[Any, ...], Any] = {}
_PARAMS_KEPT = 256


def _params(causal, causal_alignment, window, scale):
    """Validate the masking and scaling options and return the C parameter struct."""
    # The types too: 1 == True == 1.0, but only some of them are valid.
    bound_types = tuple(map(type, window)) if type(window) is tuple else type(window)
    key = (causal, causal_alignment, window, scale, type(causal), bound_types, type(scale))
    try:
        return _params_made[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable window: checked (and refused, or made) every time
        return _make_params(causal, causal_alignment, window, scale)
    params = _make_params(causal, causal_alignment, window, scale)
    if len(_params_made) >= _PARAMS_KEPT:
        _params_made.clear()
    _params_made[key] = params
    return params


def _make_params(causal, causal_alignment, window, scale):
    causal = _flag("causal", causal)
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
    scale_value = 0.0  # the C library's "1 / sqrt(D)"
    if scale is not None:
        scale_value = _float32("scale", scale, "None or a real number")
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


def _softcap(softcap):
    """The C library's softcap: 0 for None (none), else the float32 of a finite cap > 0."""
    if softcap is None:
        return 0.0
    value = _float32("softcap", softcap, "None or a real number")
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(
            f"softcap must be None (none) or finite and > 0 as a float32, got {softcap!r}"
        )
    return value


def _sequence_length(name, value):
    if not _is_integer(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= _INT32_MAX:
        raise ValueError(f"{name} must be in [1, 2**31 - 1], got {value}")
    return int(value)


# ---- operands -------------------------------------------------------------------------------


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
    q_batch, heads_q, _, dim = q_sizes = arrays.sizes(q)
    k_batch, heads_kv, seq_k, k_dim = k_sizes = arrays.sizes(k)
    v_batch, v_heads, v_seq, _ = v_sizes = arrays.sizes(v)
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
    _check_groups(arrays, heads_q, heads_kv)
    return q, k, v, arrays


def _check_groups(arrays, heads_q, heads_kv):
    if heads_q % heads_kv:
        axis = arrays.axes[_HEADS]
        raise ValueError(
            f"q.shape[{axis}] (query heads) = {heads_q} must be a multiple of "
            f"k.shape[{axis}] (key/value heads) = {heads_kv}"
        )


def _read_packed_inputs(q, k, v):
    """q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]: packed sequences, which
    may be empty (total 0) where every sequence is."""
    q = read_array("q", q)
    _check_rank("q", q, 3, "(total_q, heads, head dim) for packed sequences")
    k = read_array("k", k, q.dtype)
    _check_rank("k", k, 3, "(total_k, heads, head dim) for packed sequences")
    v = read_array("v", v, q.dtype)
    _check_rank("v", v, 3, "(total_k, heads, head dim) for packed sequences")
    for name, array in (("q", q), ("k", k), ("v", v)):
        for axis in (1, 2):
            if array.shape[axis] == 0:
                raise ValueError(
                    f"{name}.shape[{axis}] ({_AXIS_NAMES[axis + 1]}) must be at least 1, got 0"
                )
    _PACKED.require_same("v", v, "k", k, _HEADS)
    _PACKED.require_same("k", k, "q", q, _DIM)
    _PACKED.require_same("v", v, "k", k, _SEQ)
    _check_groups(_PACKED, q.shape[1], k.shape[1])
    return q, k, v


def _read_offsets(call, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The packed sequences' offsets (int32 [B + 1] each) and maximum lengths; returns B."""
    for role, name, array in (
        ("cu_seqlens_q", "cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", "cu_seqlens_k", cu_seqlens_k),
    ):
        view = read_array(name, array, INT32)
        if view.ndim != 1 or view.shape[0] < 2:
            raise ValueError(
                f"{name} must have shape (B + 1,) for B >= 1 sequences, got {view.shape}"
            )
        if role == "cu_seqlens_k" and view.shape != call.roles[-1][1].shape:
            raise ValueError(
                f"cu_seqlens_k.shape must equal cu_seqlens_q.shape = "
                f"{call.roles[-1][1].shape}, got {view.shape}"
            )
        call.add(role, name, view, _vector_view(view))
    return (
        view.shape[0] - 1,
        _sequence_length("max_seqlen_q", max_seqlen_q),
        _sequence_length("max_seqlen_k", max_seqlen_k),
    )


# ---- score modifiers ------------------------------------------------------------------------


def _read_modifiers(call, dtype, sizes, mask, block_mask, softcap, alibi_slopes, sinks):
    """The score modifiers of a call whose masks cover sizes = (B, Hq, Nq, Nk); returns the
    softcap for the C library (0 for none)."""
    batch, heads_q, seq_q, seq_k = sizes
    cap = _softcap(softcap)
    if mask is not None:
        allowed = (BOOL, _F32) if dtype == _F32 else (BOOL, _F32, dtype)
        mask_view = read_array("mask", mask, allowed)
        if mask_view.ndim > 4:
            raise ValueError(
                "mask must have rank at most 4 (batch, heads, queries, keys), got shape "
                f"{mask_view.shape}"
            )
        mask_shape, mask_strides = _broadcast_view(mask_view)
        if any(size not in (1, wanted) for size, wanted in zip(mask_shape, sizes)):
            raise ValueError(
                f"mask.shape {mask_view.shape} must broadcast to (batch, heads, queries, keys) "
                f"= {sizes}: each axis that size or 1"
            )
        call.add("mask", "mask", mask_view, (mask_shape, mask_strides))
    if block_mask is not None:
        if mask is None:
            raise ValueError("block_mask is given without mask: it is mask_summary(mask, ...)")
        view = read_array("block_mask", block_mask, UINT8)
        expected = _summary_shape(mask_shape, mask_strides, seq_q, seq_k)
        # Where the mask is the same for every batch (or head), the library also takes a
        # summary repeating it over them.
        if view.shape not in (expected, (*mask_shape[:2], *expected[2:])):
            raise ValueError(
                f"block_mask.shape must be {expected} (mask_summary(mask, {seq_q}, {seq_k})), "
                f"got {view.shape}"
            )
        call.add("block_mask", "block_mask", view, (view.shape, view.strides))
    if alibi_slopes is not None:
        view = read_array("alibi_slopes", alibi_slopes, _F32)
        if not (
            (view.ndim == 1 and view.shape[0] == heads_q)
            or (view.ndim == 2 and view.shape[0] in (1, batch) and view.shape[1] == heads_q)
        ):
            raise ValueError(
                f"alibi_slopes.shape must be ({heads_q},) or ({batch}, {heads_q}) (query heads, "
                f"or batch and query heads), got {view.shape}"
            )
        call.add("alibi_slopes", "alibi_slopes", view, _head_vector_view(view))
    if sinks is not None:
        view = _read_shaped("sinks", sinks, (heads_q,), _F32, " (query heads)")
        call.add("sinks", "sinks", view, _head_vector_view(view))
    return cap


def _summary_shape(mask_shape, mask_strides, seq_q, seq_k):
    """mfa_mask_summarize's summary shape for a mask's rank-4 C view: its batch and head sizes,
    1 where it broadcasts (size 1 or stride 0), and one block per MFA_MASK_BLOCK queries and
    keys."""
    folded = tuple(1 if mask_strides[axis] == 0 else mask_shape[axis] for axis in (0, 1))
    return (*folded, -(-seq_q // _MASK_BLOCK), -(-seq_k // _MASK_BLOCK))


# ---- running a call -------------------------------------------------------------------------


def _compute(context, direction, params, call, softcap, extra=()):
    """One mfa_attention_compute call over the arrays of call; extra: (field, value) pairs of
    the scalar members of mfa_attention_args."""
    arrays, fields = call.arrays()
    # mfa_attention_args_init's defaults are all bytes zero, as ffi.new leaves them.
    fields.update(extra, struct_size=_ARGS_SIZE, softcap=softcap)
    args = ffi.new(_ARGS, fields)
    call.synchronize()
    target = encoding_target()
    if target is None:
        context._call(lib.mfa_attention_compute, direction, params, args)
        return
    if target.context is not context:
        raise ValueError(
            "the call is encoding into a CommandBuffer of another context: give the "
            "command buffer's context as backend="
        )
    # The arrays stay referenced by the command buffer until it is closed.
    target.encode(direction, params, args, (arrays, call))


def _lse_shape(arrays, sizes):
    """lse's shape for out of logical sizes (B, Hq, Nq, .): [B, Hq, Nq], or [Hq, Nq] for
    rank-3 arrays, whatever the layout."""
    return sizes[:3] if arrays.rank == 4 else sizes[1:3]


def _forward(q, call, arrays, sizes, options, extra=(), lse_kind=None):
    """The outputs of a forward call whose inputs are read into call: out (shaped by arrays, of
    logical sizes (B, Hq, Nq, Dv)) and lse, given or allocated (lse as lse_kind, None: q's
    kind), then the call. options: the entry point's params, softcap, return_lse,
    accumulate, backend, out and lse."""
    params, softcap, return_lse, accumulate, backend, out, lse = options
    return_lse = _flag("return_lse", return_lse)
    accumulate = _flag("accumulate", accumulate)
    out_shape, lse_shape = arrays.shape(*sizes), _lse_shape(arrays, sizes)
    if accumulate and (out is None or lse is None):
        raise ValueError(
            "accumulate=True needs out= and lse=, the state of earlier calls that this call "
            f"folds its keys into; {'out' if out is None else 'lse'} is missing"
        )
    if out is not None:
        out_view = _read_output("out", out, out_shape, q.dtype)
        call.named.append(("out", out_view))
    if lse is not None:
        lse_view = _read_output("lse", lse, lse_shape, _F32, " (batch, heads, queries)")
        call.named.append(("lse", lse_view))
    context = resolve_context(backend)
    call.check_memory(context)

    out_specs = [(out_shape, q.dtype)] if out is None else []
    lse_specs = [(lse_shape, _F32)] if lse is None and return_lse else []
    if lse_kind is None or not lse_specs:
        results = iter(allocate(q.kind, out_specs + lse_specs, call.memory))
    else:
        results = iter(
            allocate(q.kind, out_specs, call.memory) + allocate(lse_kind, lse_specs, call.memory)
        )
    if out is None:
        out, out_view = next(results)
    if lse is None and return_lse:
        lse, lse_view = next(results)
    call.add("out", "out", out_view, arrays.view(out_view))
    if lse is not None:
        call.add("lse", "lse", lse_view, _lse_view(lse_view))
    extra = (*extra, ("initial_state", int(accumulate)))
    _compute(context, lib.MFA_FORWARD, params, call, softcap, extra)
    return (out, lse) if return_lse else out


def _backward(arrays, sizes, call, operands, options, extra=()):
    """The rest of a backward call whose inputs q, k, v and modifiers are read into call: out,
    dout, lse, the gradients given or allocated, then the call. sizes: (B, Hq, Nq, Dv) of out.
    operands: (dout, out, lse, q, k, v) (q, k and v as views); options: the entry point's
    params, softcap, sinks, backend, dq, dk, dv, dsinks, return_dsinks."""
    dout, out, lse, q, k, v = operands
    params, softcap, sinks, backend, dq, dk, dv, dsinks, return_dsinks = options
    dtype = q.dtype
    out_shape = arrays.shape(*sizes)
    out_view = _read_shaped("out", out, out_shape, dtype, " (from q and v)")
    dout_view = _read_shaped("dout", dout, out_shape, dtype, " (from q and v)")
    lse_view = _read_shaped("lse", lse, _lse_shape(arrays, sizes), _F32, " (from q)")
    call.add("out", "out", out_view, arrays.view(out_view))
    call.add("dout", "dout", dout_view, arrays.view(dout_view))
    call.add("lse", "lse", lse_view, _lse_view(lse_view))
    return_dsinks = _flag("return_dsinks", return_dsinks)
    if (return_dsinks or dsinks is not None) and sinks is None:
        name = "return_dsinks=True" if dsinks is None else "dsinks"
        raise ValueError(f"{name} is given without sinks: dsinks is their gradient")
    # name -> (shape, dtype, what the shape is made of) of each output.
    specs = {
        "dq": (q.shape, dtype, ""),
        "dk": (k.shape, dtype, ""),
        "dv": (v.shape, dtype, ""),
        "dsinks": ((sizes[1],), _F32, " (query heads)"),
    }
    results = {"dq": dq, "dk": dk, "dv": dv, "dsinks": dsinks}
    views = {}
    for name, array in results.items():
        if array is not None:
            views[name] = _read_output(name, array, *specs[name])
            call.named.append((name, views[name]))
    context = resolve_context(backend)
    call.check_memory(context)

    wanted = ("dq", "dk", "dv", "dsinks") if return_dsinks else ("dq", "dk", "dv")
    missing = [name for name in wanted if results[name] is None]
    allocated = allocate(q.kind, [specs[n][:2] for n in missing], call.memory)
    for name, (array, view) in zip(missing, allocated):
        results[name], views[name] = array, view
    for name in ("dq", "dk", "dv"):
        call.add(name, name, views[name], arrays.view(views[name]))
    if "dsinks" in views:
        call.add("dsinks", "dsinks", views["dsinks"], _head_vector_view(views["dsinks"]))
    _compute(context, lib.MFA_BACKWARD, params, call, softcap, extra)
    return tuple(results[name] for name in wanted)


# ---- the public functions -------------------------------------------------------------------


@overload
def attention(
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    *,
    return_lse: Literal[False] = ...,
    **options: Unpack[_Forward],
) -> Array: ...


@overload
def attention(
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    *,
    return_lse: Literal[True],
    **options: Unpack[_Forward],
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
    mask=None,
    block_mask=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    layout="bhsd",
    return_lse=False,
    accumulate=False,
    backend=None,
    out=None,
    lse=None,
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
        Where the causal diagonal, the window and ALiBi are anchored when Nq != Nk: query i
        has the aligned position ``p(i) = i + Nk - Nq`` ("bottom_right": FlashAttention >= 2.1,
        MLX; the last query sees the last key) or ``p(i) = i`` ("top_left": PyTorch's
        ``is_causal``).
    window : None or (left, right)
        Sliding window: query at aligned position p sees keys ``p - left .. p + right``;
        -1 or None leaves a side unbounded. A query that sees no key gets zeros (lse -inf).
    scale : float, optional
        Multiplies ``q @ k^T``; None means ``1 / sqrt(D)``. Must be finite and nonzero.
    mask : array, optional
        Broadcast (numpy's rules: missing leading axes, size 1, or stride 0) to
        ``(B, Hq, Nq, Nk)`` whatever the layout. Boolean: key j is visible from query i only
        where ``mask[b, h, i, j]`` is true (PyTorch's and MLX's convention). float32 or q's
        dtype: added to the scores (``-inf`` hides a pair). Intersected with ``causal`` and
        ``window``; read tile by tile, never copied.
    block_mask : uint8 array, optional
        ``mask_summary(mask, Nq, Nk)`` for this very mask, so that its fully hidden tiles are
        skipped without reading them; trusted to match the mask.
    softcap : float, optional
        ``softcap * tanh(s / softcap)`` of each scaled score s, before ALiBi and the mask
        (flash-attn's and Gemma's order); finite and > 0, None for none.
    alibi_slopes : float32 array, shape (Hq,) or (B, Hq), optional
        Adds ``-slope * |p(i) - j|`` to the score of query i and key j, p(i) the aligned
        position (flash-attn's ALiBi, in the call's alignment).
    sinks : float32 array, shape (Hq,), optional
        One logit ``t_h`` per query head (not multiplied by scale) that joins the softmax's
        denominator: ``p_ij = exp(s_ij) / (exp(t_h) + sum_j exp(s_ij))``. lse includes it; a
        row that sees no key gets out 0 and lse ``t_h``.
    layout : {"bhsd", "bshd"}
        Axis order of q, k, v, out and the gradients (lse, masks and the head vectors keep
        theirs). Any strides work, including slices, transposes and negative strides: arrays
        are never copied.
    return_lse : bool
        Also return the natural-log log-sum-exp of each row of the scaled, modified scores.
    accumulate : bool
        Fold this call's keys into the state that ``out`` and ``lse`` (both required) hold
        from earlier calls for the same queries over other keys, as
        :func:`merge_attention_states` would: a row whose lse is -inf starts empty. Give
        sinks to one of the calls only.
    backend : None, str or Context
        None uses a shared "auto" context; a name ("auto", "cpu", "metal", "metal-sim") uses a
        shared context for that backend.
    out : array, optional
        Where to write the result: shape (B, Hq, Nq, Dv) in the layout, q's dtype, writable,
        not overlapping any input. May be a strided view, of any kind.
    lse : float32 array, shape (B, Hq, Nq), optional
        Where to write the log-sum-exp (``(Hq, Nq)`` for rank-3 inputs), written whether or
        not ``return_lse`` asks for it to be returned.

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
        For arrays in Metal memory (MPS tensors, MLX arrays on an Apple GPU) on a backend
        other than metal; they are never copied to the CPU implicitly.
    MFAError
        For what the library rejects (also before anything is written): ``INVALID_ARGUMENT``
        for outputs overlapping each other or an input; ``UNSUPPORTED`` for a feature (a
        mask, softcap, ALiBi, sinks, an initial state...) that the backend lacks, named (see
        :attr:`Context.capabilities`); or what it fails to run.
    """
    return attend(
        q, k, v, causal, causal_alignment, window, scale, mask, block_mask, softcap,
        alibi_slopes, sinks, layout, return_lse, accumulate, backend, out, lse,
    )  # fmt: skip


def attend(
    q, k, v, causal, causal_alignment, window, scale, mask, block_mask, softcap, alibi_slopes,
    sinks, layout, return_lse, accumulate, backend, out, lse, lse_kind=None,
):  # fmt: skip
    """:func:`attention` with every argument given in its order: the adapters call it so,
    without a keyword interface to bind (the same checks, in the same order). lse_kind: the
    kind of array an lse that is not given is allocated as (None: q's), for an adapter that
    keeps the lse to itself."""
    q, k, v, arrays = _read_inputs(q, k, v, layout)
    params = _params(causal, causal_alignment, window, scale)
    batch, heads_q, seq_q, _ = arrays.sizes(q)
    call = _Call()
    for name, view in (("q", q), ("k", k), ("v", v)):
        call.add(name, name, view, arrays.view(view))
    masked = (batch, heads_q, seq_q, arrays.size(k, _SEQ))
    cap = _read_modifiers(call, q.dtype, masked, mask, block_mask, softcap, alibi_slopes, sinks)
    sizes = (batch, heads_q, seq_q, arrays.size(v, _DIM))
    options = (params, cap, return_lse, accumulate, backend, out, lse)
    return _forward(q, call, arrays, sizes, options, lse_kind=lse_kind)


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
    mask: SupportsDLPack | None = None,
    block_mask: SupportsDLPack | None = None,
    softcap: float | None = None,
    alibi_slopes: SupportsDLPack | None = None,
    sinks: SupportsDLPack | None = None,
    layout: Layout = "bhsd",
    return_dsinks: bool = False,
    backend: Backend = None,
    dq: SupportsDLPack | None = None,
    dk: SupportsDLPack | None = None,
    dv: SupportsDLPack | None = None,
    dsinks: SupportsDLPack | None = None,
) -> tuple[Array, ...]:
    """Gradients of :func:`attention` with respect to q, k and v (and the sinks).

    Parameters
    ----------
    dout : array, shape (B, Hq, Nq, Dv)
        Gradient of the loss with respect to ``out``; q's dtype, the layout of the inputs.
    q, k, v : array
        The forward inputs, shaped as for :func:`attention`.
    out : array, shape (B, Hq, Nq, Dv)
        The forward result.
    lse : array of float32, shape (B, Hq, Nq)
        The forward log-sum-exp (``return_lse=True``); ``(Hq, Nq)`` for rank-3 inputs. A row
        whose lse is -inf is a row that saw no key: its gradients are 0.
    causal, causal_alignment, window, scale, mask, block_mask, softcap, alibi_slopes, sinks, \
layout, backend
        As given to :func:`attention`. They must match the forward call: nothing here can
        tell, and other options give wrong gradients. The framework adapters
        (:mod:`mfa_native.torch`, :mod:`mfa_native.flash_attn`, :mod:`mfa_native.mlx`) carry
        the forward's options to the backward themselves, so there they cannot differ. Masks
        and ALiBi slopes are constants: they get no gradient.
    return_dsinks : bool
        Also return ``dsinks``, the gradient of the sinks (which must be given):
        ``dsinks[h] = -sum over b and i of exp(t_h - lse[b, h, i]) * delta[b, h, i]`` with
        ``delta = rowsum(dout * out)``.
    dq, dk, dv : array, optional
        Where to write the gradients: shaped like q, k and v, q's dtype, writable, not
        overlapping each other or any input. May be strided views.
    dsinks : float32 array, shape (Hq,), optional
        Where to write the sinks' gradient (written, not accumulated), whether or not
        ``return_dsinks`` asks for it to be returned.

    Every array is any kind that :func:`attention` takes, in CPU memory.

    Returns
    -------
    dq : array of q's kind, shape (B, Hq, Nq, D)
    dk : array of q's kind, shape (B, Hkv, Nk, D)
        With grouped-query attention, summed over the query heads sharing each key head.
    dv : array of q's kind, shape (B, Hkv, Nk, Dv)
    dsinks : array of q's kind, float32, shape (Hq,)
        Only with ``return_dsinks=True``: summed over the batch and the rows. Given arrays
        are returned as themselves.

    Raises
    ------
    TypeError, ValueError, NotImplementedError, MFAError
        As for :func:`attention` (the backend's ``backward_features`` decide what is
        UNSUPPORTED here); nothing is written when one is raised.
    """
    q_view, k_view, v_view, arrays = _read_inputs(q, k, v, layout)
    batch, heads_q, seq_q, _ = arrays.sizes(q_view)
    call = _Call()
    for name, view in (("q", q_view), ("k", k_view), ("v", v_view)):
        call.add(name, name, view, arrays.view(view))
    sizes = (batch, heads_q, seq_q, arrays.size(v_view, _DIM))
    # The forward's order: operands, options, then modifiers (here after out, dout and lse).
    operands = (dout, out, lse, q_view, k_view, v_view)
    params = _params(causal, causal_alignment, window, scale)
    masked = (batch, heads_q, seq_q, arrays.size(k_view, _SEQ))
    cap = _read_modifiers(
        call, q_view.dtype, masked, mask, block_mask, softcap, alibi_slopes, sinks
    )
    options = (params, cap, sinks, backend, dq, dk, dv, dsinks, return_dsinks)
    return _backward(arrays, sizes, call, operands, options)


@overload
def attention_varlen(
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    cu_seqlens_q: SupportsDLPack,
    cu_seqlens_k: SupportsDLPack,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    return_lse: Literal[False] = ...,
    **options: Unpack[_PackedForward],
) -> Array: ...


@overload
def attention_varlen(
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    cu_seqlens_q: SupportsDLPack,
    cu_seqlens_k: SupportsDLPack,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    return_lse: Literal[True],
    **options: Unpack[_PackedForward],
) -> tuple[Array, Array]: ...


@keyword_hints(MFA_NAMES)
def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
    mask=None,
    block_mask=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    return_lse=False,
    accumulate=False,
    backend=None,
    out=None,
    lse=None,
):
    """Attention over a batch of packed sequences of different lengths: each
    sequence attends to its own keys, and no padding exists or is computed.

    Parameters
    ----------
    q : array, shape (total_q, Hq, D)
        The queries of every sequence, one after the other (flash-attn's varlen layout):
        sequence b has rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1``.
    k : array, shape (total_k, Hkv, D)
        The keys likewise, by ``cu_seqlens_k``; q's dtype. Hq must be a multiple of Hkv.
    v : array, shape (total_k, Hkv, Dv)
    cu_seqlens_q, cu_seqlens_k : int32 array, shape (B + 1,)
        Offsets: 0, then never decreasing, ending at total_q (total_k). Sequences may be
        empty: a sequence without keys gets out 0 and lse -inf.
    max_seqlen_q, max_seqlen_k : int
        Bounds (>= 1) on every sequence's number of queries (keys): the sizes that a mask
        covers.
    causal, causal_alignment, window, scale
        As for :func:`attention`, applied within each sequence: query i and key j are that
        sequence's own, and p(i) is aligned with its own lengths.
    mask : array, optional
        Broadcast (numpy's rules: missing leading axes, size 1, or stride 0) to
        ``(B, Hq, max_seqlen_q, max_seqlen_k)`` and indexed with each sequence's b and its own
        i and j. Boolean: key j is visible from query i only where ``mask[b, h, i, j]`` is
        true (PyTorch's and MLX's convention). float32 or q's dtype: added to the scores
        (``-inf`` hides a pair). Intersected with ``causal`` and ``window``; read tile by
        tile, never copied.
    block_mask : uint8 array, optional
        ``mask_summary(mask, max_seqlen_q, max_seqlen_k)`` for this very mask, so that its
        fully hidden tiles are skipped without reading them; trusted to match the mask.
    softcap : float, optional
        ``softcap * tanh(s / softcap)`` of each scaled score s, before ALiBi and the mask
        (flash-attn's and Gemma's order); finite and > 0, None for none.
    alibi_slopes : float32 array, shape (Hq,) or (B, Hq), optional
        Adds ``-slope * |p(i) - j|`` to the score of query i and key j, p(i) the aligned
        position (flash-attn's ALiBi, in the call's alignment).
    sinks : float32 array, shape (Hq,), optional
        One logit ``t_h`` per query head (not multiplied by scale) that joins the softmax's
        denominator: ``p_ij = exp(s_ij) / (exp(t_h) + sum_j exp(s_ij))``. lse includes it; a
        row that sees no key gets out 0 and lse ``t_h``. Slopes of shape (B, Hq) are read
        by sequence.
    return_lse, accumulate, backend
        As for :func:`attention`.
    out : array, shape (total_q, Hq, Dv), optional
    lse : float32 array, shape (Hq, total_q), optional
        As for :func:`attention`.

    Returns
    -------
    out : array of q's kind, shape (total_q, Hq, Dv)
    lse : array of q's kind, float32, shape (Hq, total_q)
        Only with ``return_lse=True``.

    Raises
    ------
    TypeError, ValueError, NotImplementedError, MFAError
        As for :func:`attention`; MFAError ``INVALID_ARGUMENT`` also for offsets that do not
        start at 0, decrease, do not end at the packed length or give a sequence longer than
        its bound (the library reads them before anything is written).
    """
    q, k, v = _read_packed_inputs(q, k, v)
    call = _Call()
    for name, view in (("q", q), ("k", k), ("v", v)):
        call.add(name, name, view, _PACKED.view(view))
    batch, max_q, max_k = _read_offsets(
        call, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    params = _params(causal, causal_alignment, window, scale)
    heads_q = q.shape[1]
    masked = (batch, heads_q, max_q, max_k)
    cap = _read_modifiers(call, q.dtype, masked, mask, block_mask, softcap, alibi_slopes, sinks)
    sizes = (1, heads_q, q.shape[0], v.shape[2])
    options = (params, cap, return_lse, accumulate, backend, out, lse)
    extra = (("max_seqlen_q", max_q), ("max_seqlen_k", max_k))
    return _forward(q, call, _PACKED, sizes, options, extra)


@keyword_hints(MFA_NAMES)
def attention_varlen_backward(
    dout: SupportsDLPack,
    q: Array,
    k: SupportsDLPack,
    v: SupportsDLPack,
    out: SupportsDLPack,
    lse: SupportsDLPack,
    cu_seqlens_q: SupportsDLPack,
    cu_seqlens_k: SupportsDLPack,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    causal_alignment: Alignment = "bottom_right",
    window: Window = None,
    scale: float | None = None,
    mask: SupportsDLPack | None = None,
    block_mask: SupportsDLPack | None = None,
    softcap: float | None = None,
    alibi_slopes: SupportsDLPack | None = None,
    sinks: SupportsDLPack | None = None,
    return_dsinks: bool = False,
    backend: Backend = None,
    dq: SupportsDLPack | None = None,
    dk: SupportsDLPack | None = None,
    dv: SupportsDLPack | None = None,
    dsinks: SupportsDLPack | None = None,
) -> tuple[Array, ...]:
    """Gradients of :func:`attention_varlen`, packed like q, k and v.

    The arguments are those of :func:`attention_varlen` with dout, out and lse as in
    :func:`attention_backward` (out and dout ``(total_q, Hq, Dv)``, lse ``(Hq, total_q)``),
    and the same options, which must be the forward's. Returns ``(dq, dk, dv)`` shaped like q,
    k and v, and dsinks (float32 ``(Hq,)``, summed over every sequence) with
    ``return_dsinks=True``. Raises as :func:`attention_varlen` does.
    """
    q_view, k_view, v_view = _read_packed_inputs(q, k, v)
    call = _Call()
    for name, view in (("q", q_view), ("k", k_view), ("v", v_view)):
        call.add(name, name, view, _PACKED.view(view))
    batch, max_q, max_k = _read_offsets(
        call, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    heads_q = q_view.shape[1]
    sizes = (1, heads_q, q_view.shape[0], v_view.shape[2])
    operands = (dout, out, lse, q_view, k_view, v_view)
    params = _params(causal, causal_alignment, window, scale)
    masked = (batch, heads_q, max_q, max_k)
    cap = _read_modifiers(
        call, q_view.dtype, masked, mask, block_mask, softcap, alibi_slopes, sinks
    )
    options = (params, cap, sinks, backend, dq, dk, dv, dsinks, return_dsinks)
    extra = (("max_seqlen_q", max_q), ("max_seqlen_k", max_k))
    return _backward(_PACKED, sizes, call, operands, options, extra)


# A paged cache's blocks: multiples of 8 rows, at most this many.
_MAX_BLOCK_SIZE = 256


@overload
def attention_with_kvcache(
    q: Array,
    k_cache: SupportsDLPack,
    v_cache: SupportsDLPack,
    block_table: SupportsDLPack,
    cache_seqlens: SupportsDLPack,
    k: SupportsDLPack | None = ...,
    v: SupportsDLPack | None = ...,
    *,
    return_lse: Literal[False] = ...,
    **options: Unpack[_Forward],
) -> Array: ...


@overload
def attention_with_kvcache(
    q: Array,
    k_cache: SupportsDLPack,
    v_cache: SupportsDLPack,
    block_table: SupportsDLPack,
    cache_seqlens: SupportsDLPack,
    k: SupportsDLPack | None = ...,
    v: SupportsDLPack | None = ...,
    *,
    return_lse: Literal[True],
    **options: Unpack[_Forward],
) -> tuple[Array, Array]: ...


@keyword_hints(MFA_NAMES)
def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    block_table,
    cache_seqlens,
    k=None,
    v=None,
    *,
    causal=False,
    causal_alignment="bottom_right",
    window=None,
    scale=None,
    mask=None,
    block_mask=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    layout="bhsd",
    return_lse=False,
    accumulate=False,
    backend=None,
    out=None,
    lse=None,
):
    """Attention of dense queries over a paged KV cache (flash-attn's
    ``flash_attn_with_kvcache`` with a ``block_table``), after appending new keys and values
    to it. Forward only.

    Parameters
    ----------
    q : array, shape (B, Hq, Nq, D)
        ``(B, Nq, Hq, D)`` with ``layout="bshd"``. Decoding (Nq = 1) or chunked prefill.
    k_cache : array, shape (num_blocks, Hkv, block_size, D)
        ``(num_blocks, block_size, Hkv, D)`` with ``layout="bshd"`` (flash-attn's). q's
        dtype; block_size a multiple of 8 from 8 to 256.
    v_cache : array, shape (num_blocks, Hkv, block_size, Dv)
    block_table : int32 array, shape (B, max_blocks)
        The blocks of each sequence: key j of sequence b is row ``j % block_size`` of block
        ``block_table[b, j // block_size]``. Entries past a sequence's last block are not read.
    cache_seqlens : int32 array, shape (B,)
        The keys already in each sequence's cache.
    k, v : array, shape (B, Hkv, N_new, D) and (B, Hkv, N_new, Dv), optional
        New keys and values (both or neither; the layout's axis order), first written into
        the caches as keys ``cache_seqlens[b] .. cache_seqlens[b] + N_new - 1``: the caches
        are then outputs, written in place. Sequence b attends over
        ``cache_seqlens[b] + N_new`` keys, aligned against its Nq queries.
    causal, causal_alignment, window, scale
        As for :func:`attention`, per sequence.
    mask : array, optional
        Broadcast (numpy's rules: missing leading axes, size 1, or stride 0) to
        ``(B, Hq, Nq, max_blocks * block_size)`` whatever the layout and indexed with each
        sequence's own key j. Boolean: key j is visible from query i only where
        ``mask[b, h, i, j]`` is true (PyTorch's and MLX's convention). float32 or q's dtype:
        added to the scores (``-inf`` hides a pair). Intersected with ``causal`` and
        ``window``; read tile by tile, never copied.
    block_mask : uint8 array, optional
        ``mask_summary(mask, Nq, max_blocks * block_size)`` for this very mask, so that its
        fully hidden tiles are skipped without reading them; trusted to match the mask.
    softcap : float, optional
        ``softcap * tanh(s / softcap)`` of each scaled score s, before ALiBi and the mask
        (flash-attn's and Gemma's order); finite and > 0, None for none.
    alibi_slopes : float32 array, shape (Hq,) or (B, Hq), optional
        Adds ``-slope * |p(i) - j|`` to the score of query i and key j, p(i) the aligned
        position (flash-attn's ALiBi, in the call's alignment).
    sinks : float32 array, shape (Hq,), optional
        One logit ``t_h`` per query head (not multiplied by scale) that joins the softmax's
        denominator: ``p_ij = exp(s_ij) / (exp(t_h) + sum_j exp(s_ij))``. lse includes it; a
        row that sees no key gets out 0 and lse ``t_h``.
    layout, return_lse, accumulate, backend, out, lse
        As for :func:`attention` (rank 4 only).

    Returns
    -------
    out : array of q's kind, shape (B, Hq, Nq, Dv)
    lse : array of q's kind, float32, shape (B, Hq, Nq)
        Only with ``return_lse=True``.

    Raises
    ------
    TypeError, ValueError, NotImplementedError, MFAError
        As for :func:`attention`; MFAError ``INVALID_ARGUMENT`` also, before anything is
        written, for block ids outside the cache, lengths beyond a sequence's capacity
        (``max_blocks * block_size``), and appends that would write a cache row twice or
        into a block another sequence reads (the library reads the integer arrays). Its
        messages call the caches k and v, and the new rows args.k_new and args.v_new.
    """
    q, k_cache, v_cache, arrays = _read_cache_inputs(q, k_cache, v_cache, layout)
    batch, heads_q, seq_q, _ = arrays.sizes(q)
    num_blocks, heads_kv, block_size, dim = arrays.sizes(k_cache)
    call = _Call()
    for role, name, view in (("q", "q", q), ("k", "k_cache", k_cache), ("v", "v_cache", v_cache)):
        call.add(role, name, view, arrays.view(view))
    table = read_array("block_table", block_table, INT32)
    if table.ndim != 2 or table.shape[0] != batch or table.shape[1] == 0:
        raise ValueError(
            f"block_table.shape must be ({batch}, max_blocks) (batch from q, max_blocks >= 1), "
            f"got {table.shape}"
        )
    call.add("block_table", "block_table", table, _vector_view(table))
    lengths = _read_shaped("cache_seqlens", cache_seqlens, (batch,), INT32, " (batch from q)")
    call.add("cache_seqlens", "cache_seqlens", lengths, _vector_view(lengths, axis=0))
    if (k is None) != (v is None):
        raise ValueError(
            f"{'v' if k is not None else 'k'} is None while the other is given: "
            "new keys and values come together"
        )
    if k is not None:
        k_new = read_array("k", k, q.dtype)
        _check_rank("k", k_new, 4, "like q")
        new_len = arrays.size(k_new, _SEQ)
        expected = arrays.shape(batch, heads_kv, new_len, dim)
        if k_new.shape != expected:
            raise ValueError(
                f"k.shape must be {expected} (batch from q, heads and head dim "
                f"from k_cache), got {k_new.shape}"
            )
        expected = arrays.shape(batch, heads_kv, new_len, arrays.size(v_cache, _DIM))
        v_new = _read_shaped("v", v, expected, q.dtype, " (from k and v_cache)")
        call.add("k_new", "k", k_new, arrays.view(k_new))
        call.add("v_new", "v", v_new, arrays.view(v_new))
    params = _params(causal, causal_alignment, window, scale)
    masked = (batch, heads_q, seq_q, table.shape[1] * block_size)
    cap = _read_modifiers(call, q.dtype, masked, mask, block_mask, softcap, alibi_slopes, sinks)
    sizes = (batch, heads_q, seq_q, arrays.size(v_cache, _DIM))
    return _forward(
        q, call, arrays, sizes, (params, cap, return_lse, accumulate, backend, out, lse)
    )


def _read_cache_inputs(q, k_cache, v_cache, layout):
    """q [B, Hq, Nq, D] and caches [num_blocks, Hkv, block_size, D] / [..., Dv] in the layout
    (bshd: [B, Nq, Hq, D], [num_blocks, block_size, Hkv, D])."""
    q = read_array("q", q)
    _check_rank("q", q, 4, "with a paged KV cache")
    arrays = _layout(layout, 4)
    k_cache = read_array("k_cache", k_cache, q.dtype)
    _check_rank("k_cache", k_cache, 4)
    v_cache = read_array("v_cache", v_cache, q.dtype)
    _check_rank("v_cache", v_cache, 4)
    for name, array in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        arrays.require_nonempty(name, array)
    arrays.require_same("k_cache", k_cache, "q", q, _DIM)
    for logical in (_BATCH, _HEADS, _SEQ):
        arrays.require_same("v_cache", v_cache, "k_cache", k_cache, logical)
    _check_groups(arrays, arrays.size(q, _HEADS), arrays.size(k_cache, _HEADS))
    block_size = arrays.size(k_cache, _SEQ)
    if block_size % 8 or block_size > _MAX_BLOCK_SIZE:
        axis = arrays.axes[_SEQ]
        raise ValueError(
            f"k_cache.shape[{axis}] (block size) must be a multiple of 8 from 8 to "
            f"{_MAX_BLOCK_SIZE}, got {block_size}"
        )
    return q, k_cache, v_cache, arrays


@keyword_hints(MFA_NAMES)
def mask_summary(mask: Array, seq_q: int, seq_k: int, *, backend: Backend = None) -> Array:
    """The block summary of a mask, for the ``block_mask`` argument of calls that reuse the
    mask: they skip its fully hidden tiles without reading them (FlexAttention's BlockMask).

    Parameters
    ----------
    mask : array
        As for :func:`attention`'s ``mask`` (boolean, or additive in float32, float16 or
        bfloat16), of rank <= 4, broadcastable to ``(M0, M1, seq_q, seq_k)``.
    seq_q, seq_k : int
        The queries and keys of the calls (>= 1): Nq and Nk, ``max_seqlen_q`` and
        ``max_seqlen_k`` for packed sequences, ``max_blocks * block_size`` keys for a paged
        cache.
    backend : None, str or Context

    Returns
    -------
    uint8 array of mask's kind, shape (S0, S1, ceil(seq_q / 64), ceil(seq_k / 64))
        S0 = M0, or 1 where the mask is the same for every batch (size 1 or stride 0); S1
        likewise for the heads. Entry ``[b, h, r, c]`` covers queries ``64 r .. 64 r + 63``
        and keys ``64 c .. 64 c + 63``: 0 every pair hidden (false, or -inf), 2 every pair
        visible with nothing added (true, or 0), 1 anything else.
    """
    view = read_array("mask", mask, (BOOL, None))
    seq_q = _positive("seq_q", seq_q)
    seq_k = _positive("seq_k", seq_k)
    if view.ndim > 4:
        raise ValueError(f"mask must have rank at most 4, got shape {view.shape}")
    shape, strides = _broadcast_view(view)
    if shape[2] not in (1, seq_q) or shape[3] not in (1, seq_k):
        raise ValueError(
            f"mask.shape {view.shape} must broadcast to (M0, M1, seq_q, seq_k) = "
            f"(., ., {seq_q}, {seq_k})"
        )
    call = _Call()
    call.add("mask", "mask", view, (shape, strides))
    summary_shape = _summary_shape(shape, strides, seq_q, seq_k)
    context = resolve_context(backend)
    call.check_memory(context)
    ((summary, summary_view),) = allocate(view.kind, [(summary_shape, UINT8)], call.memory)
    call.add("summary", "summary", summary_view, (summary_shape, summary_view.strides))
    arrays, pointers = call.arrays()
    call.synchronize()
    context._call(lib.mfa_mask_summarize, pointers["mask"], seq_q, seq_k, pointers["summary"])
    return summary


def _positive(name, value):
    if not _is_integer(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value < 2**63:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


@overload
def merge_attention_states(
    outs: Sequence[Array],
    lses: Sequence[SupportsDLPack],
    *,
    return_lse: Literal[False] = ...,
    **options: Unpack[_Merge],
) -> Array: ...


@overload
def merge_attention_states(
    outs: Sequence[Array],
    lses: Sequence[SupportsDLPack],
    *,
    return_lse: Literal[True],
    **options: Unpack[_Merge],
) -> tuple[Array, Array]: ...


@keyword_hints(MFA_NAMES)
def merge_attention_states(
    outs, lses, *, layout="bhsd", return_lse=False, backend=None, out=None, lse=None
):
    """Combine partial attention results of the same queries over disjoint sets of keys.

    Per row, with ``m = max_i lses[i]``: ``w_i = exp(lses[i] - m)``,
    ``out = sum_i w_i outs[i] / sum_i w_i`` and ``lse = m + log(sum_i w_i)``, the lses being
    natural-log log-sum-exps with the scale included, as every function here returns them. A
    part whose lse is -inf saw no key: it contributes nothing and its out is not read; a row
    that no part saw gets out 0 and lse -inf; a NaN or +inf lse makes the row NaN.

    Parameters
    ----------
    outs : list or tuple of arrays, shape (B, H, N, Dv)
        One or more partial outputs, each float32, float16 or bfloat16 (they may differ), in
        the layout; rank 3 for one batch (``layout="bshd"`` and rank 3 for packed sequences'
        ``(total, H, Dv)``).
    lses : list or tuple of float32 arrays, shape (B, H, N)
        Their log-sum-exps (``(H, N)`` for rank 3).
    layout : {"bhsd", "bshd"}
    return_lse : bool
        Also return the merged lse.
    backend : None, str or Context
    out : array, optional
        Where to write the merged output: the parts' shape, any of the three dtypes. It may be
        exactly one part's array (the same view) to merge in place, and otherwise must not
        overlap any part.
    lse : float32 array, optional
        Where to write the merged lse, likewise (it may be exactly one part's lse).

    Returns
    -------
    out : array of outs[0]'s kind and dtype
    lse : float32 array of its kind
        Only with ``return_lse=True``.
    """
    for name, parts in (("outs", outs), ("lses", lses)):
        if not isinstance(parts, (list, tuple)) or not parts:
            raise TypeError(
                f"{name} must be a non-empty list or tuple of arrays, got {parts!r}"[:200]
            )
    if len(lses) != len(outs):
        raise ValueError(f"lses must have one array per part: {len(outs)} outs, {len(lses)} lses")
    return_lse = _flag("return_lse", return_lse)
    first = read_array("outs[0]", outs[0])
    if first.ndim not in (3, 4):
        raise ValueError(
            f"outs[0] must have rank 4 (or 3 for a single batch), got shape {first.shape}"
        )
    arrays = _layout(layout, first.ndim)
    batch, heads, seq, _ = arrays.sizes(first)
    lse_shape = _lse_shape(arrays, (batch, heads, seq))
    call = _Call()
    parts = []
    for index, (part_out, part_lse) in enumerate(zip(outs, lses)):
        view = first if index == 0 else read_array(f"outs[{index}]", part_out)
        if view.shape != first.shape:
            raise ValueError(
                f"outs[{index}].shape must equal outs[0].shape = {first.shape}, got {view.shape}"
            )
        lse_view = _read_shaped(f"lses[{index}]", part_lse, lse_shape, _F32, " (from outs[0])")
        call.add(f"out{index}", f"outs[{index}]", view, arrays.view(view))
        call.add(f"lse{index}", f"lses[{index}]", lse_view, _lse_view(lse_view))
        parts.append(index)
    if out is not None:
        out_view = read_array("out", out)
        if out_view.shape != first.shape:
            raise ValueError(
                f"out.shape must be {first.shape} (from outs[0]), got {out_view.shape}"
            )
        if not out_view.writable:
            raise ValueError(
                f"out must be writable{_READ_ONLY_REASONS.get(out_view.kind.name, '')}"
            )
        call.named.append(("out", out_view))
    if lse is not None:
        lse_view = _read_output("lse", lse, lse_shape, _F32, " (from outs[0])")
        call.named.append(("lse", lse_view))
    context = resolve_context(backend)
    call.check_memory(context)
    results = iter(
        allocate(
            first.kind,
            ([(first.shape, first.dtype)] if out is None else [])
            + ([(lse_shape, _F32)] if lse is None and return_lse else []),
            call.memory,
        )
    )
    if out is None:
        out, out_view = next(results)
    if lse is None and return_lse:
        lse, lse_view = next(results)
    call.add("out", "out", out_view, arrays.view(out_view))
    if lse is not None:
        call.add("lse", "lse", lse_view, _lse_view(lse_view))
    arrays_memory, pointers = call.arrays()
    part_outs = ffi.new(_ARRAY_POINTERS, [pointers[f"out{i}"] for i in parts])
    part_lses = ffi.new(_ARRAY_POINTERS, [pointers[f"lse{i}"] for i in parts])
    call.synchronize()
    context._call(
        lib.mfa_attention_merge,
        len(parts),
        part_outs,
        part_lses,
        pointers["out"],
        pointers["lse"] if lse is not None else ffi.NULL,
    )
    return (out, lse) if return_lse else out
