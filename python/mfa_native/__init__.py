"""mfa_native: exact attention (FlashAttention) for Apple GPUs and CPUs, over numpy arrays and
any DLPack array (torch tensors, MLX arrays), results of the caller's kind.

A thin binding of libmfa's C API (cffi, ABI mode): no Python extension module is compiled, and
the declarations come from the installed ``mfa.h`` at import.

    >>> import numpy as np, mfa_native
    >>> q = np.random.standard_normal((1, 8, 1024, 64)).astype(np.float32)
    >>> out, lse = mfa_native.attention(q, q, q, causal=True, return_lse=True)
    >>> dq, dk, dv = mfa_native.attention_backward(np.ones_like(out), q, q, q, out, lse,
    ...                                            causal=True)

Arrays are float32, float16 or ``ml_dtypes.bfloat16``, laid out ``[B, H, N, D]`` (or
``[B, N, H, D]`` with ``layout="bshd"``), any strides; they are never copied.

Functions: :func:`attention` and :func:`attention_backward` (with masks, softcap, ALiBi and
attention sinks, and an initial state to accumulate into), :func:`attention_varlen` and
:func:`attention_varlen_backward` (packed sequences of different lengths),
:func:`attention_with_kvcache` (paged KV caches), :func:`merge_attention_states` (partial
results over disjoint keys), :func:`mask_summary` (block summaries that let calls skip hidden
tiles), :func:`empty`, :func:`info`, :func:`available_backends`. Classes: :class:`Context`,
:class:`MFAError`; the dictionaries :class:`Info` and :class:`Capabilities` describe what
:func:`info` and :attr:`Context.capabilities` return.
Framework adapters, each imported only when asked for: :mod:`mfa_native.torch` (custom
operators with autograd and torch.compile, PyTorch's SDPA), :mod:`mfa_native.flash_attn`
(flash-attn's functions), :mod:`mfa_native.mlx` (MLX's SDPA with a fused backward).
Command line: ``python -m mfa_native {info,demo,bench}``.

Environment
-----------
MFA_LIBRARY
    Path of a libmfa shared library to load instead of the one bundled in the package, e.g. a
    CMake build directory's ``libmfa.so``, for working on the C library without reinstalling.
    Its declarations are read from ``native/include/mfa.h`` of the source tree this package
    lives in (``PYTHONPATH=python`` from a clone), or from MFA_HEADER.
MFA_HEADER
    Path of the ``mfa.h`` matching MFA_LIBRARY. The library's version must match the header's,
    or import fails.

Threads: cffi releases the GIL during every libmfa call, and contexts may be shared by threads.
"""

from __future__ import annotations

from typing import TypedDict

from ._attention import (
    attention,
    attention_backward,
    attention_varlen,
    attention_varlen_backward,
    attention_with_kvcache,
    mask_summary,
    merge_attention_states,
)
from ._context import Capabilities, Context, MFAError, available_backends
from ._context import resolve_context as _resolve_context
from ._device import CommandBuffer, DeviceArray, DeviceBuffer
from ._library import ffi as _ffi
from ._library import header_path as _header_path
from ._library import lib as _lib
from ._library import library_path as _library_path
from ._memory import empty

__all__ = [
    "attention",
    "attention_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "attention_with_kvcache",
    "mask_summary",
    "merge_attention_states",
    "Capabilities",
    "CommandBuffer",
    "Context",
    "DeviceArray",
    "DeviceBuffer",
    "Info",
    "MFAError",
    "available_backends",
    "empty",
    "info",
]

__version__: str = _ffi.string(_lib.mfa_version_string()).decode()


class Info(TypedDict):
    """The loaded library and the default backend: :func:`info`."""

    version: str
    """libmfa's version, which is the package's."""
    library: str
    """Path of the loaded libmfa."""
    header: str
    """Path of the mfa.h its declarations were read from."""
    backends: list[str]
    """The backends available here, as :func:`available_backends`."""
    default_backend: str
    """What "auto" runs here: "metal" where an Apple GPU is usable, otherwise "cpu"."""
    device: str
    """The default backend's device name."""
    capabilities: Capabilities
    """The default backend's capabilities, as :attr:`Context.capabilities`."""


def info() -> Info:
    """Describe the loaded library and the default backend.

    Returns
    -------
    Info
        ``version`` (str), ``library`` and ``header`` (paths as str), ``backends`` (list of
        available backend names), ``default_backend`` (what "auto" runs here), ``device``
        (its device name) and ``capabilities`` (as :attr:`Context.capabilities`).
    """
    context = _resolve_context(None)
    return {
        "version": __version__,
        "library": str(_library_path),
        "header": str(_header_path),
        "backends": available_backends(),
        "default_backend": context.backend,
        "device": context.device_name,
        "capabilities": context.capabilities,
    }
