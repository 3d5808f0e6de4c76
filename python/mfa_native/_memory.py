"""Arrays in libmfa's page-aligned memory."""

from __future__ import annotations

import numbers
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._context import check, is_storage_dtype
from ._library import ffi, lib

__all__ = ["empty"]


def _is_size(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _shape_tuple(shape: object) -> tuple[int, ...]:
    """The validated shape argument of empty() as a tuple of Python ints."""
    sizes = (shape,) if _is_size(shape) else shape
    if not isinstance(sizes, (tuple, list)) or not all(_is_size(size) for size in sizes):
        raise TypeError(f"shape must be an int or a tuple of ints, got {shape!r}")
    result = tuple(int(size) for size in sizes)
    if any(size < 0 for size in result):
        raise ValueError(f"shape must not have negative sizes, got {result}")
    return result


def empty(shape: int | Sequence[int], dtype: npt.DTypeLike = np.float32) -> npt.NDArray[Any]:
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
    if not is_storage_dtype(dtype):
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
