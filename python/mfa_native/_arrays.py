"""Array arguments of every kind read as one view, never copied, and results allocated as the
caller's kind.

numpy arrays are read through their attributes, torch tensors through theirs (both without
importing anything: a torch tensor can only exist once its module is loaded), and every other
object through DLPack (``__dlpack_device__`` / ``__dlpack__``), which covers MLX arrays and any
array library that exports it. DLPack capsules are read with cffi in place, not consumed: the
capsule stays alive beside the view for the duration of the call, and its destructor returns
the memory to the producer as the DLPack specification prescribes for unconsumed capsules.

Arrays in the device buffers of :mod:`mfa_native._device` (``DeviceBuffer.array``) are read as
a buffer handle plus a byte offset, as are DLPack arrays in Metal memory (kDLMetal: ``data`` is
the ``id<MTLBuffer>``, ``byte_offset`` the offset into it); results are never allocated for
them.

Results take the kind of the array they are shaped after (numpy in, numpy out; torch in, torch
out; MLX in, MLX out); arrays of any other DLPack producer get numpy results, since this package
cannot allocate in a library it does not know.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
import sys

import cffi
import numpy as np

from ._context import bfloat16, is_storage_dtype
from ._device import DeviceArray

__all__ = [
    "CPU",
    "METAL",
    "DEVICE_BUFFER",
    "BOOL",
    "INT32",
    "UINT8",
    "ArrayView",
    "read_array",
    "allocate",
    "synchronize",
    "device_name",
]

# DLPack device types (dlpack.h, DLDeviceType).
CPU = 1
METAL = 8
DEVICE_BUFFER = -1  # not a DLPack device: an mfa_native.DeviceBuffer of a context
_DEVICE_NAMES = {
    -1: "an mfa device buffer's",
    1: "CPU",
    2: "CUDA",
    3: "CUDA host",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm host",
    12: "ext_dev",
    13: "CUDA managed",
    14: "oneAPI",
    15: "WebGPU",
    16: "Hexagon",
    17: "MAIA",
}

# The DLPack 1.x ABI (dlpack.h): a legacy "dltensor" capsule holds a DLManagedTensor, a
# "dltensor_versioned" capsule a DLManagedTensorVersioned. Only the fields read are relied on.
_dlpack = cffi.FFI()
_dlpack.cdef(
    """
    typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
    typedef struct {
        void* data;
        DLDevice device;
        int32_t ndim;
        DLDataType dtype;
        int64_t* shape;
        int64_t* strides;
        uint64_t byte_offset;
    } DLTensor;
    typedef struct DLManagedTensor {
        DLTensor dl_tensor;
        void* manager_ctx;
        void (*deleter)(struct DLManagedTensor*);
    } DLManagedTensor;
    typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
    typedef struct DLManagedTensorVersioned {
        DLPackVersion version;
        void* manager_ctx;
        void (*deleter)(struct DLManagedTensorVersioned*);
        uint64_t flags;
        DLTensor dl_tensor;
    } DLManagedTensorVersioned;
    """
)
_UINTPTR = _dlpack.typeof("uintptr_t")
# The fields read, each header copied out at once (ctypes.string_at) and unpacked with struct:
# a tenth of the time of reading them one by one through cffi. Layouts checked against the
# declarations above.
_TENSOR_FIELDS = struct.Struct("@PiiiBBHPPQ")  # DLTensor: data, device, ndim, dtype, shape,
# strides, byte_offset
_VERSIONED_FIELDS = struct.Struct("@IIPPQ")  # version, manager_ctx, deleter, flags
_VERSIONED_TENSOR = _dlpack.offsetof("DLManagedTensorVersioned", "dl_tensor")
assert _TENSOR_FIELDS.size == _dlpack.sizeof("DLTensor")
assert _VERSIONED_FIELDS.size == _VERSIONED_TENSOR
assert _dlpack.offsetof("DLManagedTensor", "dl_tensor") == 0
_string_at = ctypes.string_at
_FLAG_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_VERSIONED_NAME = b"dltensor_versioned"
_LEGACY_NAME = b"dltensor"

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = (ctypes.py_object,)

_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
BOOL, INT32, UINT8 = np.dtype(np.bool_), np.dtype(np.int32), np.dtype(np.uint8)
_DLPACK_BFLOAT16 = (4, 16, 1)
# (DLDataTypeCode, bits, lanes) -> numpy dtype: the dtypes libmfa reads (storage dtypes, masks,
# integer arrays, mask summaries; _DLPACK_BFLOAT16 joins when first met, see _numpy_dtype), and
# a few others so that their rejection names them as numpy does.
_DLPACK_DTYPES = {
    (2, 32, 1): _F32,
    (2, 16, 1): _F16,
    (6, 8, 1): BOOL,
    (0, 32, 1): INT32,
    (1, 8, 1): UINT8,
    (2, 64, 1): np.dtype(np.float64),
    (0, 64, 1): np.dtype(np.int64),
}


def device_name(device):
    return _DEVICE_NAMES.get(device, f"DLPack device type {device}")


class ArrayView:
    """One array argument as libmfa sees it.

    ``address`` is the first element's address for CPU memory; for device memory (Metal, a
    DeviceBuffer) it is the buffer handle (metal: the ``id<MTLBuffer>``) and ``byte_offset``
    the offset of the first element in it (0 for CPU memory, where the offset is already
    added). ``strides`` count elements. ``kind`` tells
    what kind of array results shaped after this one are. ``keepalive`` holds whatever keeps
    the memory valid (the DLPack capsule) for as long as the view is used.
    """

    __slots__ = (
        "kind",
        "device",
        "address",
        "byte_offset",
        "dtype",
        "shape",
        "strides",
        "writable",
        "keepalive",
    )

    def __init__(self, kind, device, address, byte_offset, dtype, shape, strides, writable, keep):
        self.kind = kind
        self.device = device
        self.address = address
        self.byte_offset = byte_offset
        self.dtype = dtype
        self.shape = shape
        self.strides = strides
        self.writable = writable
        self.keepalive = keep

    @property
    def ndim(self):
        return len(self.shape)


@functools.lru_cache(maxsize=256)
def _contiguous_strides(shape):
    strides = [1] * len(shape)
    for axis in range(len(shape) - 1, 0, -1):
        strides[axis - 1] = strides[axis] * shape[axis]
    return tuple(strides)


def _numpy_address(array, contiguous):
    """The address of array's first element. A contiguous array is asked through the buffer
    protocol, which costs half of building its __array_interface__."""
    if contiguous:
        return int(_dlpack.cast(_UINTPTR, _dlpack.from_buffer(array)))
    return array.__array_interface__["data"][0]


def _type_error(name, array):
    return TypeError(
        f"{name} must be an array (numpy, torch, MLX or any DLPack producer), "
        f"got {type(array).__name__}"
    )


_STORAGE_NAMES = ("float32", "float16", "bfloat16")


def _check_dtype(name, dtype, required):
    """required None accepts any of the storage dtypes, a tuple any of its dtypes (None among
    them: any storage dtype); otherwise the array must have exactly the dtype given."""
    if required is None:
        if not is_storage_dtype(dtype):
            raise TypeError(
                f"{name}.dtype must be float32, float16 or bfloat16 (native byte order), "
                f"got {dtype}"
            )
    elif isinstance(required, tuple):
        if dtype not in required and not (None in required and is_storage_dtype(dtype)):
            names = [
                named
                for option in required
                for named in (_STORAGE_NAMES if option is None else (str(option),))
            ]
            wanted = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
            raise TypeError(f"{name}.dtype must be {wanted}, got {dtype}")
    elif dtype != required:
        raise TypeError(f"{name}.dtype must be {required}, got {dtype}")


def _check_alignment(name, address, itemsize):
    if address % itemsize:
        raise ValueError(f"{name} must be aligned to its itemsize {itemsize}")


# ---- numpy ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _element_strides(byte_strides, itemsize):
    """Strides in bytes as strides in elements; None where one is not a whole number of them.
    Cached: the arrays of a model repeat a few layouts, and converting them anew took a tenth
    of a small call's Python time."""
    if any(stride % itemsize for stride in byte_strides):
        return None
    return tuple(stride // itemsize for stride in byte_strides)


def _read_numpy(name, array, dtype):
    array_dtype = array.dtype
    _check_dtype(name, array_dtype, dtype)
    itemsize = array_dtype.itemsize
    strides = _element_strides(array.strides, itemsize)
    if strides is None:
        raise ValueError(
            f"{name}.strides {array.strides} must be multiples of the itemsize {itemsize}"
        )
    flags = array.flags  # a new object at each access
    if not flags.aligned:
        raise ValueError(f"{name} must be aligned to its itemsize {itemsize}")
    return ArrayView(
        NUMPY,
        CPU,
        _numpy_address(array, flags.c_contiguous),
        0,
        array_dtype,
        array.shape,
        strides,
        flags.writeable,
        array,
    )


class _NumpyKind:
    name = "numpy"

    @staticmethod
    def empty(specs):
        results = []
        for shape, dtype in specs:
            array = np.empty(shape, dtype)
            view = ArrayView(
                NUMPY,
                CPU,
                _numpy_address(array, True),
                0,
                dtype,
                shape,
                _contiguous_strides(shape),
                True,
                array,
            )
            results.append((array, view))
        return results


NUMPY = _NumpyKind()


# ---- torch ----------------------------------------------------------------------------------


def _numpy_dtype(to_numpy, dtype, library_bfloat16, from_numpy=None):
    """The numpy dtype of a torch, MLX or DLPack dtype by to_numpy (None: one mfa does not
    read); the library's bfloat16 joins to_numpy, and from_numpy if given, when first met
    (bfloat16())."""
    numpy_dtype = to_numpy.get(dtype)
    if numpy_dtype is None and dtype == library_bfloat16:
        numpy_dtype = bfloat16()
        if from_numpy is not None:
            from_numpy[numpy_dtype] = dtype
        to_numpy[dtype] = numpy_dtype
    return numpy_dtype


class _TorchKind:
    """torch tensors, read through their own attributes: three times cheaper than a DLPack
    export, and it sees MPS storage as the Metal buffer plus offset that it is."""

    name = "torch"
    device_results = True

    def __init__(self, torch):
        self.torch = torch
        self.to_numpy = {
            torch.float32: _F32,
            torch.float16: _F16,
            torch.bool: BOOL,
            torch.int32: INT32,
            torch.uint8: UINT8,
        }
        self.from_numpy = {value: key for key, value in self.to_numpy.items()}

    def read(self, name, tensor, dtype):
        if tensor.requires_grad and self.torch.is_grad_enabled():
            raise TypeError(
                f"{name} requires grad, and mfa_native.attention does not record autograd: "
                "use mfa_native.torch.attention (differentiable), or pass tensor.detach()"
            )
        numpy_dtype = _numpy_dtype(
            self.to_numpy, tensor.dtype, self.torch.bfloat16, self.from_numpy
        ) or str(tensor.dtype)
        _check_dtype(name, numpy_dtype, dtype)
        return self._view(name, tensor, numpy_dtype)

    def _view(self, name, tensor, numpy_dtype):
        itemsize = numpy_dtype.itemsize
        if tensor.is_cpu:
            device, address, byte_offset = CPU, tensor.data_ptr(), 0
        elif tensor.is_mps:
            # An MPS tensor's storage pointer is its id<MTLBuffer>; the view starts
            # storage_offset elements into it.
            device = METAL
            address = tensor.untyped_storage().data_ptr()
            byte_offset = tensor.storage_offset() * itemsize
        else:
            raise ValueError(
                f"{name} is on the {tensor.device.type!r} device; mfa reads CPU memory (and, "
                "with the metal backend's device-buffer path, Metal buffers)"
            )
        # Metal: the handle is an object, not memory; the offset into the buffer is aligned.
        _check_alignment(name, address + byte_offset if device == CPU else byte_offset, itemsize)
        return ArrayView(
            self,
            device,
            address,
            byte_offset,
            numpy_dtype,
            tuple(tensor.shape),
            tensor.stride(),
            True,
            tensor,
        )

    def empty(self, specs, like=None):
        """New tensors in CPU memory, or on the device of the tensor that `like` views (MPS:
        Metal buffers of torch's allocator, read as buffer plus offset)."""
        results = []
        if like is None:
            for shape, dtype in specs:
                # The sizes as separate arguments: torch parses them a third faster than a
                # tuple (some 0.5 us of a small call's result); a 0-d shape has none to give.
                sizes = shape or ((),)
                tensor = self.torch.empty(*sizes, dtype=self.from_numpy[dtype])
                address, strides = tensor.data_ptr(), _contiguous_strides(shape)
                view = ArrayView(self, CPU, address, 0, dtype, shape, strides, True, tensor)
                results.append((tensor, view))
            return results
        device = like.keepalive.device
        for shape, dtype in specs:
            tensor = self.torch.empty(shape, dtype=self.from_numpy[dtype], device=device)
            results.append((tensor, self._view("result", tensor, dtype)))
        return results

    def synchronize(self):
        """Before a call in Metal memory: torch's MPS stream has finished the work it queued,
        which may still be writing the inputs (or the memory the results were given). Public
        Python has no handle on the MPS stream's command buffer to encode into (torch's C++
        torch::mps::get_command_buffer() is not reachable without a compiled extension), so
        the call waits for the stream. No synchronisation is needed after: the call returns
        once mfa's own command buffer has completed, and shared memory is coherent at
        command-buffer boundaries."""
        self.torch.mps.synchronize()


# ---- MLX and other DLPack producers ---------------------------------------------------------


class _MlxKind:
    """MLX arrays: read through DLPack where MLX has Metal (kDLMetal: its buffers), through
    the buffer protocol (the same address, strides and offset as its CPU DLPack export, in a
    quarter of the time) where it has not. Either way they are values, never written in place
    (MLX marks its DLPack exports read-only). Results are fresh arrays made from host memory
    (so that their buffer exists), filled in place before anything else can see them."""

    name = "mlx"
    device_results = True

    def __init__(self, mx):
        self.mx = mx
        self.metal = mx.metal.is_available()
        self.to_numpy = {
            mx.float32: _F32,
            mx.float16: _F16,
            mx.bool_: BOOL,
            mx.int32: INT32,
            mx.uint8: UINT8,
            mx.float64: np.dtype(np.float64),
            mx.int64: np.dtype(np.int64),
        }

    def read(self, name, array, dtype):
        if self.metal:
            return _read_dlpack(self, name, array, dtype)
        mlx_dtype = array.dtype
        numpy_dtype = self.to_numpy.get(mlx_dtype) or (
            _numpy_dtype(self.to_numpy, mlx_dtype, self.mx.bfloat16)
            or str(mlx_dtype).rsplit(".", 1)[-1]
        )
        if numpy_dtype is not dtype:  # k and v are read with q's very dtype object
            _check_dtype(name, numpy_dtype, dtype)
        memory = memoryview(array)  # evaluates the array first, as its DLPack export does
        itemsize = numpy_dtype.itemsize
        shape = memory.shape
        if memory.c_contiguous:
            # The view hands on the buffer it holds: no second request to MLX.
            address = int(_dlpack.cast(_UINTPTR, _dlpack.from_buffer(memory)))
            strides = _contiguous_strides(shape)
        else:
            # A strided view gives its buffer only to requests for strides, which from_buffer
            # does not make; MLX hands out its buffer whatever the flags.
            address = int(_dlpack.cast(_UINTPTR, _dlpack.from_buffer(array)))
            strides = tuple(stride // itemsize for stride in memory.strides)
        if address % itemsize:
            _check_alignment(name, address, itemsize)
        return ArrayView(self, CPU, address, 0, numpy_dtype, shape, strides, False, array)

    def empty(self, specs, like=None):
        """New arrays in the memory MLX keeps every array in: CPU memory, or (where Metal is
        available) Metal buffers, exported as kDLMetal like the inputs (like: the call's
        first input, whose memory the results must share)."""
        # An array made from host memory exists at once, where one MLX allocates (mx.zeros,
        # mx.empty) would need an evaluation: a round trip to MLX's stream thread that costs
        # more than the copy of a small result, and a pass over memory as long as the copy's
        # for a large one. (MLX makes no array of host memory in place: mx.from_dlpack(...,
        # copy=False) refuses CPU memory.)
        results = []
        for shape, dtype in specs:
            array = self.mx.array(_uninitialized(shape, dtype))
            if like is None:
                # In CPU memory: the buffer protocol gives the address, in a tenth of the
                # time of a DLPack export (a fresh array is C-contiguous).
                address = int(_dlpack.cast(_UINTPTR, _dlpack.from_buffer(array)))
                strides = _contiguous_strides(shape)
                view = ArrayView(self, CPU, address, 0, dtype, shape, strides, True, array)
            else:
                view = _read_dlpack(self, "result", array, dtype)
                if view.device != like.device:
                    raise ValueError(
                        f"MLX made a result in {device_name(view.device)} memory for arrays "
                        f"in {device_name(like.device)} memory: pass out= (and lse=) explicitly"
                    )
                view.writable = True
            results.append((array, view))
        return results


# (shape, dtype) -> the source MLX results of that shape are copied from (_uninitialized): never
# written (its contents are garbage that the call overwrites), so shared by every thread; kept
# for results up to _KEPT_BYTES, where allocating and faulting in a fresh source each call
# would cost as much as the copy itself.
_sources: dict[tuple[tuple[int, ...], np.dtype], np.ndarray | memoryview] = {}
_SOURCES_KEPT = 64
_KEPT_BYTES = 2**20


# Where in a page the sources start. The C library places a large block 16 bytes past a page
# boundary, and MLX's CPU allocator puts an array's data 8 bytes into its block (after a size
# header): a source allocated the same way lies 8 bytes from its copy modulo the page size,
# which makes the copy some ten times slower (4K aliasing: every load looks as if it depended on
# a store just made; 85 against 8 us for 256 KiB on this project's AMD EPYC). Half a page away,
# the copy runs at memcpy speed.
_PAGE = 4096
_SOURCE_PAGE_OFFSET = _PAGE // 2


def _uninitialized(shape, dtype):
    """The source of MLX results of this shape and dtype: a numpy array, handed out as a
    memoryview of it where the buffer protocol has a format for the dtype (all but bfloat16):
    MLX imports the memoryview faster than the array (by up to some 1 us a result)."""
    source = _sources.get((shape, dtype))
    if source is None:
        nbytes = math.prod(shape) * dtype.itemsize
        block = np.empty(nbytes + _PAGE, np.uint8)
        start = (_SOURCE_PAGE_OFFSET - block.ctypes.data) % _PAGE
        source = block[start : start + nbytes].view(dtype).reshape(shape)
        try:
            source = memoryview(source)
        except ValueError:  # ml_dtypes' bfloat16 has no buffer format: MLX takes the array
            pass
        if source.nbytes <= _KEPT_BYTES:
            if len(_sources) >= _SOURCES_KEPT:
                _sources.clear()
            _sources[shape, dtype] = source
    return source


class _OtherKind:
    """Any other DLPack producer: read through DLPack, results as numpy arrays."""

    name = "dlpack"

    def read(self, name, array, dtype):
        return _read_dlpack(self, name, array, dtype)

    empty = staticmethod(_NumpyKind.empty)


OTHER = _OtherKind()

# Producers whose __dlpack__ takes no max_version (DLPack < 1.0): asked for a legacy capsule.
_legacy_exporters: set[type] = set()


def _export(array):
    """The DLPack capsule of array: versioned where the producer supports it."""
    kind = type(array)
    if kind not in _legacy_exporters:
        try:
            return array.__dlpack__(max_version=(1, 0))
        except TypeError:
            _legacy_exporters.add(kind)
    return array.__dlpack__()


@functools.lru_cache(maxsize=16)
def _int64s(count):
    return struct.Struct(f"@{count}q")


def _read_dlpack(kind, name, array, dtype):
    try:
        device, _ = array.__dlpack_device__()
    except AttributeError:
        raise _type_error(name, array) from None
    if device not in (CPU, METAL):
        raise ValueError(
            f"{name} is in {device_name(device)} memory; mfa reads CPU memory (and, with the "
            "metal backend's device-buffer path, Metal buffers)"
        )
    capsule = _export(array)
    capsule_name = _capsule_name(capsule)
    if capsule_name == _VERSIONED_NAME:
        managed = _capsule_pointer(capsule, capsule_name)
        major, minor, _, _, flags = _VERSIONED_FIELDS.unpack(
            _string_at(managed, _VERSIONED_FIELDS.size)
        )
        if major != 1:
            raise ValueError(f"{name} was exported as DLPack {major}.{minor}; mfa reads DLPack 1.x")
        writable = not flags & _FLAG_READ_ONLY
        tensor = managed + _VERSIONED_TENSOR
    elif capsule_name == _LEGACY_NAME:
        tensor = _capsule_pointer(capsule, capsule_name)
        # A pre-1.0 export cannot say whether the memory may be written (MLX's, whose arrays
        # are values, may not): taken as read-only, as numpy's from_dlpack takes it.
        writable = False
    else:
        raise ValueError(f"{name}.__dlpack__() returned a capsule named {capsule_name!r}")
    fields = _TENSOR_FIELDS.unpack(_string_at(tensor, _TENSOR_FIELDS.size))
    address, _, _, ndim, code, bits, lanes, shape_at, strides_at, byte_offset = fields
    numpy_dtype = (
        _numpy_dtype(_DLPACK_DTYPES, (code, bits, lanes), _DLPACK_BFLOAT16)
        or f"DLPack dtype (code {code}, {bits} bits, {lanes} lanes)"
    )
    _check_dtype(name, numpy_dtype, dtype)
    shape = _int64s(ndim).unpack(_string_at(shape_at, 8 * ndim)) if ndim else ()
    # A NULL strides pointer means compact row-major.
    strides = (
        _int64s(ndim).unpack(_string_at(strides_at, 8 * ndim))
        if strides_at and ndim
        else _contiguous_strides(shape)
    )
    itemsize = numpy_dtype.itemsize
    # Metal: the handle is an object, not memory; the offset into the buffer is aligned.
    _check_alignment(name, address + byte_offset if device == CPU else byte_offset, itemsize)
    if device == CPU:
        address, byte_offset = address + byte_offset, 0
    return ArrayView(
        kind, device, address, byte_offset, numpy_dtype, shape, strides, writable, capsule
    )


# ---- dispatch on the argument's type --------------------------------------------------------

# type -> its kind (with a read method), filled on first sight of each type.
_KINDS: dict[type, object] = {}


def _kind_of(array_type):
    kind = _KINDS.get(array_type)
    if kind is None:
        kind = OTHER
        if issubclass(array_type, np.ndarray):
            kind = NUMPY
        elif issubclass(array_type, DeviceArray):
            kind = DEVICE
        else:
            # A tensor of these libraries can only exist once they are imported.
            torch = sys.modules.get("torch")
            mx = sys.modules.get("mlx.core")
            if torch is not None and issubclass(array_type, torch.Tensor):
                kind = _torch_kind(torch)
            elif mx is not None and issubclass(array_type, mx.array):
                kind = _mlx_kind(mx)
        _KINDS[array_type] = kind
    return kind


@functools.cache
def _torch_kind(torch):
    return _TorchKind(torch)


@functools.cache
def _mlx_kind(mx):
    return _MlxKind(mx)


class _DeviceKind:
    """Arrays in a DeviceBuffer: read as the buffer plus a byte offset. Results are never
    allocated for them (allocate)."""

    name = "device"

    def read(self, name, array, dtype):
        _check_dtype(name, array.dtype, dtype)
        return ArrayView(
            self,
            DEVICE_BUFFER,
            array.buffer.handle,
            array.byte_offset,
            array.dtype,
            array.shape,
            array.strides,
            True,
            array,
        )


DEVICE = _DeviceKind()


def read_array(name, array, dtype=None):
    """Check one array argument and view it in place.

    Raises TypeError for something that is not an array, or of the wrong dtype (dtype None
    accepts any storage dtype, a tuple any of its dtypes, otherwise exactly the one given), and
    ValueError for strides
    that are not whole elements, misaligned data, or memory libmfa cannot reach.
    """
    kind = _KINDS.get(type(array)) or _kind_of(type(array))
    if kind is NUMPY:
        return _read_numpy(name, array, dtype)
    return kind.read(name, array, dtype)


def allocate(kind, specs, like):
    """[(result, view)] of new C-contiguous arrays of the given kind, one for each (shape,
    numpy dtype) in specs, in the memory of the view `like` (the call's first array). Results
    are allocated in CPU memory, and in device memory by the kinds that know how (torch on
    MPS, MLX in Metal buffers: device_results, empty(specs, like)); a call in other device memory (a
    DeviceBuffer, another kDLMetal producer) takes every output explicitly, and a ValueError
    says so before anything is written."""
    if not specs:
        return []
    if like.device == CPU:
        return kind.empty(specs)
    if not getattr(kind, "device_results", False):
        raise ValueError(
            f"the arrays are in {device_name(like.device)} memory: pass every output (out=, "
            "lse=, dq=, ...) as an array in the same memory; mfa_native allocates results in "
            "device memory only for torch tensors and MLX arrays"
        )
    return kind.empty(specs, like)


def synchronize(views):
    """Before a call in device memory: let each producer of the call's arrays finish the work
    it queued on them (torch's MPS stream); MLX arrays were evaluated by their DLPack export,
    DeviceBuffers are the caller's to order."""
    for kind in {view.kind for view in views}:
        wait = getattr(kind, "synchronize", None)
        if wait is not None:
            wait()
