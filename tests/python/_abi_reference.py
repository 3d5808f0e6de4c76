"""A backend in numpy behind the C ABI, for checking the Python layer before any backend has a
feature: mfa_attention_compute's arguments (mfa_attention_args of mfa_array views, params,
direction) are read back from memory as native/include/mfa.h defines them and computed by the
float64 reference, the results stored in the outputs' dtypes.

The library still validates each call first: the real mfa_attention_compute runs on a cpu
context, and its INVALID_ARGUMENT (which mfa.h orders before any UNSUPPORTED) is returned as is;
whatever it wrote is put back before the reference computes. So a Python entry point checked
through this backend passes the library's validation and hands it arrays that mean, by mfa.h's
rules, what the caller's arrays mean.

    with reference_backend():
        out = mfa_native.attention(q, k, v, mask=mask, sinks=sinks, backend="cpu")
"""

import contextlib
import math

import ml_dtypes
import numpy as np
import reference
from mfa_native import _attention
from mfa_native._library import ffi, lib

# What it computes: every feature of mfa.h's forward and backward (paged caches and initial
# states are forward-only).
_BACKWARD_FEATURES = (
    "causal window gqa value_head_dim strides mask block_mask softcap alibi sinks varlen"
).split()
CAPABILITIES = {
    "features": ["backward", "lse", *_BACKWARD_FEATURES, "paged_kv", "initial_state"],
    "backward_features": _BACKWARD_FEATURES,
}

_DTYPES = {
    lib.MFA_DTYPE_F32: np.dtype(np.float32),
    lib.MFA_DTYPE_F16: np.dtype(np.float16),
    lib.MFA_DTYPE_BF16: np.dtype(ml_dtypes.bfloat16),
    lib.MFA_DTYPE_BOOL: np.dtype(np.uint8),
    lib.MFA_DTYPE_I32: np.dtype(np.int32),
}


def view(array):
    """The numpy view of an mfa_array in host memory (writable), or None for NULL."""
    if array == ffi.NULL:
        return None
    assert array.buffer == ffi.NULL, "the Python layer passes host memory"
    dtype = _DTYPES[array.dtype]
    shape = tuple(array.shape)
    strides = tuple(stride * dtype.itemsize for stride in array.strides)
    if 0 in shape:
        return np.empty(shape, dtype)
    origin = int(ffi.cast("uintptr_t", array.data)) + array.byte_offset
    low = sum(s * (n - 1) for s, n in zip(strides, shape) if s < 0)
    high = sum(s * (n - 1) for s, n in zip(strides, shape) if s > 0) + dtype.itemsize
    memory = ffi.buffer(ffi.cast("char*", origin + low), high - low)
    return np.ndarray(shape, dtype, buffer=memory, offset=-low, strides=strides)


def _options(params, args, head_dim):
    """The reference's options from mfa_attention_params and the modifiers of args."""
    params = params[0] if params != ffi.NULL else None
    scale = 1.0 / math.sqrt(head_dim)
    options = {}
    if params is not None:
        if params.scale != 0:
            scale = float(params.scale)
        options["causal"] = bool(params.causal)
        options["causal_alignment"] = (
            "top_left" if params.alignment == lib.MFA_ALIGN_TOP_LEFT else "bottom_right"
        )
        options["window"] = (int(params.window_left), int(params.window_right))
    options["scale"] = scale
    if args.softcap > 0:
        options["softcap"] = float(args.softcap)
    mask = view(args.mask)
    if mask is not None:
        options["mask"] = mask != 0 if args.mask.dtype == lib.MFA_DTYPE_BOOL else mask
    slopes = view(args.alibi_slopes)
    if slopes is not None:
        options["alibi_slopes"] = slopes[:, :, 0, 0]
    sinks = view(args.sinks)
    if sinks is not None:
        options["sinks"] = sinks[0, :, 0, 0]
    return options


def _check_block_mask(args, seq_q, seq_k):
    """A block mask must be the mask's summary (the library trusts it; this backend checks)."""
    summary = view(args.block_mask)
    if summary is None:
        return
    mask = view(args.mask)
    mask = mask != 0 if args.mask.dtype == lib.MFA_DTYPE_BOOL else mask
    expected = reference.mask_summary(mask, seq_q, seq_k)
    assert np.array_equal(np.broadcast_to(expected, summary.shape), summary), (
        "args.block_mask is not the summary of args.mask"
    )


def _forward(params, args):
    q, k, v = view(args.q), view(args.k), view(args.v)
    out, lse = view(args.out), view(args.lse)
    options = _options(params, args, q.shape[3])
    if args.cu_seqlens_q != ffi.NULL:
        cu_q, cu_k = view(args.cu_seqlens_q).reshape(-1), view(args.cu_seqlens_k).reshape(-1)
        _check_block_mask(args, args.max_seqlen_q, args.max_seqlen_k)
        result, result_lse = reference.varlen_attention_forward(q, k, v, cu_q, cu_k, **options)
    elif args.block_table != ffi.NULL:
        table = view(args.block_table)
        table = table.reshape(table.shape[0], table.shape[3])
        lengths = view(args.cache_seqlens).reshape(-1)
        _check_block_mask(args, q.shape[2], table.shape[1] * k.shape[2])
        k_new, v_new = view(args.k_new), view(args.v_new)
        result, result_lse, k_after, v_after = reference.paged_attention_forward(
            q, k, v, table, lengths, k_new=k_new, v_new=v_new, **options
        )
        if k_new is not None:
            k[...] = k_after.astype(k.dtype)
            v[...] = v_after.astype(v.dtype)
    else:
        _check_block_mask(args, q.shape[2], k.shape[2])
        result, result_lse = reference.attention_forward(q, k, v, **options)
    if args.initial_state:
        result, result_lse = reference.merge_states([out, result], [lse[..., 0], result_lse])
    out[...] = result.astype(out.dtype)
    if lse is not None:
        lse[..., 0] = result_lse.astype(np.float32)


def _backward(params, args):
    q, k, v = view(args.q), view(args.k), view(args.v)
    out, dout = view(args.out), view(args.dout)
    options = _options(params, args, q.shape[3])
    want_dsinks = args.dsinks != ffi.NULL
    if args.cu_seqlens_q != ffi.NULL:
        cu_q, cu_k = view(args.cu_seqlens_q).reshape(-1), view(args.cu_seqlens_k).reshape(-1)
        _check_block_mask(args, args.max_seqlen_q, args.max_seqlen_k)
        gradients = reference.varlen_attention_backward(
            dout, q, k, v, cu_q, cu_k, out=out, return_dsinks=want_dsinks, **options
        )
    else:
        _check_block_mask(args, q.shape[2], k.shape[2])
        gradients = reference.attention_backward(
            dout, q, k, v, out=out, return_dsinks=want_dsinks, **options
        )
    for name, gradient in zip(("dq", "dk", "dv"), gradients):
        target = view(getattr(args, name))
        target[...] = gradient.astype(target.dtype)
    if want_dsinks:
        view(args.dsinks)[0, :, 0, 0] = gradients[3].astype(np.float32)


# The outputs of each direction, which the library's own run may have written.
_WRITTEN = {
    lib.MFA_FORWARD: ("out", "lse", "k", "v"),
    lib.MFA_BACKWARD: ("dq", "dk", "dv", "dsinks"),
}


class _Library:
    """libmfa with mfa_attention_compute answered by the reference after the library's own
    validation."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def mfa_attention_compute(self, ctx, direction, params, args):
        saved = {}
        for name in _WRITTEN[direction]:
            array = view(getattr(args, name))
            if array is not None:
                saved[name] = array.copy()
        status = self._real.mfa_attention_compute(ctx, direction, params, args)
        if status not in (lib.MFA_OK, lib.MFA_ERROR_UNSUPPORTED):
            return status
        for name, before in saved.items():
            view(getattr(args, name))[...] = before
        (_forward if direction == lib.MFA_FORWARD else _backward)(params, args)
        return lib.MFA_OK


@contextlib.contextmanager
def reference_backend():
    """Route mfa_native's compute calls through the reference while the block runs."""
    real = _attention.lib
    _attention.lib = _Library(real)
    try:
        yield
    finally:
        _attention.lib = real
