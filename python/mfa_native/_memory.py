"""Arrays in libmfa's page-aligned memory."""

import numbers
import sys

import numpy as np

from ._context import DTYPES, check
from ._library import ffi, lib

__all__ = ["empty"]


def _shape_tuple(shape):
    if isinstance(shape, numbers.Integral) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(size, numbers.Integral) and not isinstance(size, (bool, np.bool_))
        for size in shape
    ):
        raise TypeError(f"shape must be an int or a tuple of ints, got {shape!r}")
    if any(size < 0 for size in shape):
        raise ValueError(f"shape must not have negative sizes, got {tuple(shape)}")
    return tuple(int(size) for size in shape)


def empty(shape, dtype=np.float32):
    """A new uninitialized C-contiguous array in page-aligned memory from ``mfa_alloc``.

    The Metal backend wraps such memory in a GPU buffer without copying it. The memory is
    returned to libmfa when the array (and every view of it) has been garbage collected.

    Parameters
    ----------
    shape : int or tuple of ints
    dtype : float32, float16 or ml_dtypes.bfloat16

    Returns
    -------
    ndarray, shape ``shape``
    """
    shape = _shape_tuple(shape)
    try:
        dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}") from error
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    nbytes = dtype.itemsize
    for size in shape:
        nbytes *= size
    if nbytes > sys.maxsize:
        raise ValueError(
            f"shape {shape} of {dtype} needs {nbytes} bytes, more than can be addressed"
        )
    # Zero-size arrays still get a real allocation, so every array from empty() is page-aligned.
    pointer = lib.mfa_alloc(max(nbytes, 1))
    if pointer == ffi.NULL:
        check(lib.MFA_ERROR_OUT_OF_MEMORY)
    # The cffi buffer keeps the gc-tracked pointer alive; numpy keeps the buffer as its base.
    memory = ffi.buffer(ffi.gc(pointer, lib.mfa_free), max(nbytes, 1))
    return np.frombuffer(memory, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
