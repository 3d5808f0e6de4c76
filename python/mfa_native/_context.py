"""Library errors, backends and contexts."""

from __future__ import annotations

import numbers
import os
import threading
import weakref
from typing import Any, Callable, TypedDict, TypeVar

import numpy as np

from ._library import ffi, lib

__all__ = ["MFAError", "Context", "Capabilities", "available_backends", "resolve_context"]

_T = TypeVar("_T")


def _enum_names(c_type: str, prefix: str) -> dict[int, str]:
    """{value: lower-case name without prefix} of a C enum: MFA_GPU_FAMILY_APPLE7 -> 'apple7'."""
    return {
        value: name[len(prefix) :].lower()
        for value, name in ffi.typeof(c_type).elements.items()
        if name.startswith(prefix)
    }


_BACKENDS: dict[str, int] = {
    ffi.string(lib.mfa_backend_name(value)).decode(): value
    for value in sorted(ffi.typeof("mfa_backend").elements)
}
_GPU_FAMILIES = {
    name: value
    for value, name in _enum_names("mfa_gpu_family", "MFA_GPU_FAMILY_").items()
    if value != lib.MFA_GPU_FAMILY_NONE
}
_FEATURE_NAMES = _enum_names("mfa_feature", "MFA_FEATURE_")
_STATUS_NAMES = {
    value: name[len("MFA_ERROR_") :] if name.startswith("MFA_ERROR_") else name[len("MFA_") :]
    for value, name in ffi.typeof("mfa_status").elements.items()
}
# numpy dtype -> mfa_dtype. Non-native byte orders compare unequal and are rejected. bfloat16
# joins on first use (bfloat16()); nothing iterates over these dicts, which may grow meanwhile.
DTYPES: dict[np.dtype[Any], int] = {
    np.dtype(np.float32): lib.MFA_DTYPE_F32,
    np.dtype(np.float16): lib.MFA_DTYPE_F16,
}
# numpy dtype -> mfa_dtype of every array a call may pass: the storage dtypes, boolean masks
# and mask summaries (one byte each), integer arrays. bfloat16 joins it as it joins DTYPES.
ARRAY_DTYPES: dict[np.dtype[Any], int] = {
    **DTYPES,
    np.dtype(np.bool_): lib.MFA_DTYPE_BOOL,
    np.dtype(np.uint8): lib.MFA_DTYPE_BOOL,
    np.dtype(np.int32): lib.MFA_DTYPE_I32,
}
_DTYPE_NAMES = {
    lib.MFA_DTYPE_F32: "float32",
    lib.MFA_DTYPE_F16: "float16",
    lib.MFA_DTYPE_BF16: "bfloat16",
}


def bfloat16() -> np.dtype[Any]:
    """numpy's bfloat16 (ml_dtypes'), from then on one of DTYPES.

    ml_dtypes is imported here, on first use, rather than with mfa_native: its 0.7 release
    takes about a second to import (it registers thousands of numpy ufunc loops), five times
    the rest of ``import mfa_native``. No numpy array is bfloat16 before something imports
    ml_dtypes; a bfloat16 tensor of another library, or a bfloat16 result, calls this first.
    """
    import ml_dtypes

    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    ARRAY_DTYPES.setdefault(dtype, lib.MFA_DTYPE_BF16)
    DTYPES.setdefault(dtype, lib.MFA_DTYPE_BF16)
    return dtype


def is_storage_dtype(dtype: Any) -> bool:
    """Whether dtype is float32, float16 or bfloat16, in native byte order."""
    if dtype in DTYPES:
        return True
    return getattr(dtype, "name", None) == "bfloat16" and dtype == bfloat16()


class MFAError(Exception):
    """An error reported by libmfa.

    Attributes
    ----------
    status : int
        The ``mfa_status`` value, e.g. 1 for an invalid argument.
    status_name : str
        The status without its ``MFA_ERROR_`` prefix, e.g. ``"INVALID_ARGUMENT"``,
        ``"UNSUPPORTED"`` or ``"BACKEND_UNAVAILABLE"``.
    message : str
        The library's explanation (which argument, which dimension, expected vs got).
    """

    def __init__(self, status: int, message: str) -> None:
        self.status = int(status)
        self.status_name = _STATUS_NAMES.get(self.status, f"STATUS_{self.status}")
        self.message = message
        super().__init__(f"{message} [{self.status_name}]")

    def __reduce__(self) -> tuple[type[MFAError], tuple[int, str]]:
        # Rebuilt from status and message, so errors survive pickling (multiprocessing).
        return type(self), (self.status, self.message)


def check(status: int) -> None:
    """Raise MFAError for a failed libmfa call. Must run on the thread that made the call,
    before it calls into libmfa again: the message is per thread."""
    if status != lib.MFA_OK:
        raise MFAError(status, ffi.string(lib.mfa_last_error()).decode("utf-8", "replace"))


def available_backends() -> list[str]:
    """Names of the backends a Context can be created for on this machine.

    Returns
    -------
    list of str
        A subset of ``["cpu", "metal", "metal-sim"]``; ``"auto"`` (always usable) is not listed.
    """
    return [
        name
        for name, value in _BACKENDS.items()
        if value != lib.MFA_BACKEND_AUTO and lib.mfa_backend_available(value)
    ]


def _feature_names(bits: int) -> list[str]:
    return [name for bit, name in sorted(_FEATURE_NAMES.items()) if bits & bit]


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


class Capabilities(TypedDict):
    """What a context can run: :attr:`Context.capabilities`."""

    dtypes: list[str]
    """numpy dtype names: "float32", "float16", "bfloat16"."""
    features: list[str]
    """What the forward can do: "backward" (there is a backward pass), "lse", "causal",
    "window", "gqa", "value_head_dim", "strides", and the score modifiers and layouts "mask",
    "block_mask", "softcap", "alibi", "sinks", "varlen", "paged_kv", "initial_state"; and
    "device_buffers", "encode" (device memory and command buffers, for both directions)."""
    backward_features: list[str]
    """What the backward can do, among "causal" to "initial_state" ("sinks" includes the
    sinks' gradient); a backend may have a feature's forward before its backward."""
    max_head_dim: int
    """Largest D and Dv."""
    gpu_family: str | None
    """"apple7", "apple8" or "apple9"; None for cpu."""
    num_threads: int
    """Worker threads (0 for metal)."""


class Context:
    """A libmfa backend with its device, caches and worker threads.

    Parameters
    ----------
    backend : {"auto", "cpu", "metal", "metal-sim"}
        ``"auto"`` picks metal where an Apple GPU is usable, otherwise cpu. A backend that is
        not available here raises MFAError (status ``BACKEND_UNAVAILABLE``); there is no
        fallback.
    num_threads : int, optional
        Worker threads of the cpu and metal-sim backends; 0 (the default) uses one per core.
    gpu_family : {None, "apple7", "apple8", "apple9"}, optional
        metal-sim only: the GPU family whose block sizes are simulated (None means apple9).
    sim_seed : int, optional
        metal-sim only: 0 runs simulated GPU threads in a fixed order; any other value
        shuffles the order in which they run between barriers.

    Notes
    -----
    A context may be shared by many threads. ``close()`` (or leaving a ``with`` block) waits for
    calls in progress on it to finish, then releases it; using it afterwards raises ValueError.
    """

    def __init__(
        self,
        backend: str = "auto",
        *,
        num_threads: int = 0,
        gpu_family: str | None = None,
        sim_seed: int = 0,
    ) -> None:
        if not isinstance(backend, str) or backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
        if not _is_integer(num_threads):
            raise TypeError(f"num_threads must be an int, got {type(num_threads).__name__}")
        if num_threads < 0:
            raise ValueError(f"num_threads must be >= 0 (0 = one per core), got {num_threads}")
        if num_threads > 2**31 - 1:
            # The library states its own, lower limit for what fits the C option.
            raise ValueError(
                f"num_threads must fit the C option's int32 (at most 2**31 - 1), got {num_threads}"
            )
        if gpu_family is not None:
            if gpu_family not in _GPU_FAMILIES:
                raise ValueError(
                    f"gpu_family must be None or one of {sorted(_GPU_FAMILIES)}, got {gpu_family!r}"
                )
            if backend != "metal-sim":
                raise ValueError(f"gpu_family applies to backend 'metal-sim' only, not {backend!r}")
        if not _is_integer(sim_seed):
            raise TypeError(f"sim_seed must be an int, got {type(sim_seed).__name__}")
        if not 0 <= sim_seed < 2**64:
            raise ValueError(f"sim_seed must be in [0, 2**64), got {sim_seed}")
        if sim_seed != 0 and backend != "metal-sim":
            raise ValueError(f"sim_seed applies to backend 'metal-sim' only, not {backend!r}")

        options = ffi.new("mfa_context_options*")
        lib.mfa_context_options_init(options)
        options.num_threads = num_threads
        options.gpu_family = _GPU_FAMILIES[gpu_family] if gpu_family else lib.MFA_GPU_FAMILY_NONE
        options.sim_schedule_seed = sim_seed
        handle = ffi.new("mfa_context**")
        check(lib.mfa_context_create(_BACKENDS[backend], options, handle))
        self._handle = ffi.gc(handle[0], lib.mfa_context_destroy)
        self._requested = backend
        # Calls in flight; close() waits for them so the handle is never destroyed under a call.
        self._users = 0
        self._closed = False
        self._state = threading.Condition()
        _live_contexts.add(self)

    def _acquire(self) -> Any:
        with self._state:
            if self._closed:
                raise ValueError("the Context is closed")
            self._users += 1
        return self._handle

    def _release(self) -> None:
        with self._state:
            self._users -= 1
            if self._users == 0:
                self._state.notify_all()

    def _call(self, function: Callable[..., int], *args: Any) -> None:
        """Call ``function(handle, *args)`` with this context's handle, then check its status."""
        handle = self._acquire()
        try:
            check(function(handle, *args))
        finally:
            self._release()

    def close(self) -> None:
        """Release the context after calls in progress on it finish. Closing twice is allowed."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.wait_for(lambda: self._users == 0)
        ffi.release(self._handle)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _query(self, function: Callable[[Any], _T]) -> _T:
        handle = self._acquire()
        try:
            return function(handle)
        finally:
            self._release()

    @property
    def backend(self) -> str:
        """The backend this context runs: "cpu", "metal" or "metal-sim" (never "auto")."""
        value = self._query(lib.mfa_context_backend)
        return str(ffi.string(lib.mfa_backend_name(value)).decode())

    @property
    def device_name(self) -> str:
        """The device, e.g. "Apple M3 Max", or the CPU model and its SIMD level."""
        return self._query(
            lambda handle: str(ffi.string(lib.mfa_context_device_name(handle)).decode())
        )

    @property
    def capabilities(self) -> Capabilities:
        """What this context can run.

        Returns
        -------
        Capabilities
            ``dtypes``: list of numpy dtype names; ``features``: list of feature names of
            the forward ("backward", "lse", "causal", "window", "gqa", "value_head_dim",
            "strides", "mask", "block_mask", "softcap", "alibi", "sinks", "varlen",
            "paged_kv", "initial_state", "device_buffers", "encode"); ``backward_features``:
            those the backward supports; ``max_head_dim``: largest D and Dv; ``gpu_family``:
            "apple7".."apple9" or None; ``num_threads``: worker threads (0 for metal). A call
            using a feature its direction lacks raises MFAError ``UNSUPPORTED``, naming it.
        """
        caps = ffi.new("mfa_capabilities*")
        caps.struct_size = ffi.sizeof("mfa_capabilities")
        self._call(lib.mfa_context_capabilities, caps)
        families = {value: name for name, value in _GPU_FAMILIES.items()}
        return {
            "dtypes": [
                name for value, name in sorted(_DTYPE_NAMES.items()) if caps.dtypes >> value & 1
            ],
            "features": _feature_names(caps.features),
            "backward_features": _feature_names(caps.backward_features),
            "max_head_dim": int(caps.max_head_dim),
            "gpu_family": families.get(int(caps.gpu_family)),
            "num_threads": int(caps.num_threads),
        }

    def last_gpu_time(self) -> float:
        """Seconds the GPU spent on this context's most recently completed attention call.

        For benchmarks: the command buffer's GPU end time minus its start time, so planning,
        pipeline compilation, staging copies and the wait are left out; a backward call counts
        all its passes. Under concurrent use of the context, whichever call finished last.

        Returns
        -------
        float

        Raises
        ------
        MFAError
            ``UNSUPPORTED`` on backends that do not record GPU time (cpu, metal-sim);
            ``INVALID_ARGUMENT`` when no attention call has completed on the context yet.
        """
        seconds = ffi.new("double*")
        self._call(lib.mfa_context_last_gpu_time, seconds)
        return float(seconds[0])

    def __repr__(self) -> str:
        if self._closed:
            return f"<mfa_native.Context {self._requested!r} (closed)>"
        return f"<mfa_native.Context {self.backend!r} on {self.device_name!r}>"


_shared_contexts: dict[str, Context] = {}
_shared_contexts_lock = threading.Lock()
_live_contexts: weakref.WeakSet[Context] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A lock another thread held when this process forked stays held in the child, and the
    calls other threads had in flight never end there: give every Context fresh locks and no
    calls in flight, so that the child can use and close the contexts it inherited. (libmfa
    makes its own state safe across fork() the same way.)"""
    global _shared_contexts_lock
    _shared_contexts_lock = threading.Lock()
    for context in list(_live_contexts):
        context._state = threading.Condition()
        context._users = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def resolve_context(backend: Context | str | None) -> Context:
    """The Context for an API call's ``backend`` argument: a Context as is; None or a backend
    name through one lazily created, process-wide context per name."""
    if isinstance(backend, Context):
        return backend
    name = "auto" if backend is None else backend
    if not isinstance(name, str) or name not in _BACKENDS:
        raise ValueError(
            f"backend must be None, a Context or one of {sorted(_BACKENDS)}, got {backend!r}"
        )
    context = _shared_contexts.get(name)
    if context is None:
        with _shared_contexts_lock:
            context = _shared_contexts.get(name)
            if context is None:
                context = _shared_contexts[name] = Context(name)
    return context
