"""Device buffers, arrays in them, and command buffers: mfa.h's mfa_buffer_* and
mfa_command_buffer_*, for the backends that have them (``Context.capabilities``:
"device_buffers", "encode"; metal-sim everywhere, metal on a Mac).

A :class:`DeviceBuffer` is device memory of a context that the CPU can also read and write
(:attr:`DeviceBuffer.contents`); :meth:`DeviceBuffer.array` views part of it as an array at a
byte offset, which the attention functions take wherever they take arrays (all arrays of a call
in device memory, outputs given explicitly: results are never allocated in device memory
behind the caller's back). A :class:`CommandBuffer` collects calls made inside
``with command_buffer.encoding():`` instead of running them (mfa_attention_encode): they run when
the caller commits it, and :meth:`CommandBuffer.wait` reports how the run went. metal-sim runs
the work during :meth:`CommandBuffer.commit`; on Metal, commit only submits it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ._context import Context, resolve_context
from ._library import ffi, lib

__all__ = ["DeviceBuffer", "DeviceArray", "CommandBuffer", "encoding_target"]


class DeviceBuffer:
    """``length`` bytes of device memory of ``backend`` (a Context or a backend name),
    zero-filled on metal-sim. Release it with :meth:`close` once no committed work uses it (or
    let it be collected)."""

    def __init__(self, length: int, *, backend: Context | str | None = None) -> None:
        if not isinstance(length, int) or isinstance(length, bool):
            raise TypeError(f"length must be an int, got {type(length).__name__}")
        if length < 1:
            raise ValueError(f"length must be >= 1 byte, got {length}")
        self.context = resolve_context(backend)
        handle = ffi.new("void**")
        self.context._call(lib.mfa_buffer_create, length, handle)
        self._handle = handle[0]
        self.length = length
        self._closed = False

    @property
    def handle(self) -> int:
        """The buffer as mfa.h's ``void*`` (metal: an ``id<MTLBuffer>``)."""
        self._check_open()
        return int(ffi.cast("uintptr_t", self._handle))

    @property
    def contents(self) -> np.ndarray:
        """The buffer's bytes as a writable numpy uint8 array (shared memory, no copy)."""
        self._check_open()
        with self._context_handle() as ctx:
            address = lib.mfa_buffer_contents(ctx, self._handle)
        if address == ffi.NULL:
            raise ValueError("the buffer's contents are not visible to the CPU")
        return np.frombuffer(ffi.buffer(address, self.length), dtype=np.uint8)

    def array(
        self,
        dtype: Any,
        shape: Sequence[int],
        *,
        byte_offset: int = 0,
        strides: Sequence[int] | None = None,
    ) -> DeviceArray:
        """A view of the buffer as an array of ``dtype`` and ``shape`` whose first element is
        ``byte_offset`` bytes in; ``strides`` in elements (default: C-contiguous). The library
        checks, when the array is used, that every byte it reaches lies inside the buffer."""
        self._check_open()
        return DeviceArray(self, np.dtype(dtype), shape, byte_offset, strides)

    def close(self) -> None:
        """Release the buffer. Closing twice is allowed."""
        if self._closed:
            return
        self._closed = True
        with self._context_handle() as ctx:
            lib.mfa_buffer_destroy(ctx, self._handle)

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False and not self.context.closed:
            self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the DeviceBuffer is closed")

    @contextlib.contextmanager
    def _context_handle(self) -> Iterator[Any]:
        handle = self.context._acquire()
        try:
            yield handle
        finally:
            self.context._release()


class DeviceArray:
    """An array in a :class:`DeviceBuffer`: the buffer, the byte offset of element 0, a dtype,
    a shape and strides in elements. :meth:`numpy` reads it through the buffer's contents."""

    __slots__ = ("buffer", "dtype", "shape", "byte_offset", "strides")

    def __init__(
        self,
        buffer: DeviceBuffer,
        dtype: np.dtype[Any],
        shape: Sequence[int],
        byte_offset: int,
        strides: Sequence[int] | None,
    ) -> None:
        shape = tuple(int(n) for n in shape)
        if strides is None:
            contiguous = [1] * len(shape)
            for axis in range(len(shape) - 1, 0, -1):
                contiguous[axis - 1] = contiguous[axis] * shape[axis]
            strides = contiguous
        strides = tuple(int(s) for s in strides)
        if len(strides) != len(shape):
            raise ValueError(f"strides {strides} do not match shape {shape}")
        if not isinstance(byte_offset, int) or isinstance(byte_offset, bool):
            raise TypeError(f"byte_offset must be an int, got {type(byte_offset).__name__}")
        self.buffer = buffer
        self.dtype = dtype
        self.shape = shape
        self.byte_offset = byte_offset
        self.strides = strides

    def numpy(self) -> np.ndarray:
        """The array as a numpy view of the buffer's contents (no copy); for checking results
        once the work that writes it has completed."""
        item = self.dtype.itemsize
        return np.ndarray(
            shape=self.shape,
            dtype=self.dtype,
            buffer=self.buffer.contents,
            offset=self.byte_offset,
            strides=tuple(s * item for s in self.strides),
        )


class _EncodingTarget(threading.local):
    """The command buffer that calls of this thread encode into (CommandBuffer.encoding), or
    None. The class attribute is every thread's default: read so, the attribute costs a tenth
    of a getattr with a default, which every call makes."""

    command_buffer: CommandBuffer | None = None


_target = _EncodingTarget()


def encoding_target() -> CommandBuffer | None:
    """The CommandBuffer the calling thread encodes into, or None (run synchronously)."""
    return _target.command_buffer


class CommandBuffer:
    """A command buffer of ``backend`` (a Context or a backend name) with
    MFA_FEATURE_ENCODE. Attention calls made in ``with cb.encoding():`` on this thread are
    validated, planned and encoded into it (errors found then are raised then, and nothing is
    encoded); :meth:`commit` submits them once, and :meth:`wait` raises :class:`MFAError` if
    their run failed. Their arrays must stay alive, and their inputs unchanged, until then."""

    def __init__(self, *, backend: Context | str | None = None) -> None:
        self.context = resolve_context(backend)
        handle = ffi.new("void**")
        self.context._call(lib.mfa_command_buffer_create, handle)
        self._handle = handle[0]
        # The arrays of encoded calls, until the command buffer is closed.
        self._keepalive: list[Any] = []
        self._closed = False

    @contextlib.contextmanager
    def encoding(self) -> Iterator[CommandBuffer]:
        """Make the attention calls of this thread inside the block encode into this command
        buffer instead of running."""
        if self._closed:
            raise ValueError("the CommandBuffer is closed")
        previous = encoding_target()
        _target.command_buffer = self
        try:
            yield self
        finally:
            _target.command_buffer = previous

    def encode(self, direction: int, params: Any, args: Any, keepalive: Any) -> None:
        """mfa_attention_encode of one call (the attention functions' path)."""
        if self._closed:
            raise ValueError("the CommandBuffer is closed")
        self.context._call(lib.mfa_attention_encode, self._handle, direction, params, args)
        self._keepalive.append(keepalive)

    def commit(self) -> None:
        self.context._call(lib.mfa_command_buffer_commit, self._handle)

    def wait(self) -> None:
        """Block until the committed work has completed; MFAError if it failed."""
        self.context._call(lib.mfa_command_buffer_wait, self._handle)

    def close(self) -> None:
        """Release the command buffer (waiting for committed work; dropping work never
        committed). Closing twice is allowed."""
        if self._closed:
            return
        self._closed = True
        handle = self.context._acquire()
        try:
            lib.mfa_command_buffer_destroy(handle, self._handle)
        finally:
            self.context._release()
        self._keepalive.clear()

    def __enter__(self) -> CommandBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False and not self.context.closed:
            self.close()
