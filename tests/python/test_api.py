"""The Python API's contract: argument checking (every argument, the error type and a message
naming it, nothing written on error), library errors, Context, info(), available_backends(),
empty(), and the layout/rank/out= plumbing checked against the float64 reference."""

import doctest
import json
import math
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import mfa_native
import ml_dtypes
import numpy as np
import pytest
import reference
from _errors import raises
from mfa_native import MFAError

# Small shapes with every size distinct, so a message naming the wrong axis cannot pass:
# B=2, Hq=4, Hkv=2, Nq=5, Nk=7, D=8, Dv=6.
B, HQ, HKV, NQ, NK, D, DV = 2, 4, 2, 5, 7, 8, 6
# float32 results against the float64 reference: each output element is a softmax-weighted sum
# of at most 7 terms after dot products of length 8, so the rounding error is a few dozen units
# of 2^-24 times the magnitudes involved (O(1) here); 1e-5 is well above that and far below any
# real mistake (a wrong axis or mask changes results by O(0.1)).
F32_TOLERANCE = 1e-5
SENTINEL = 1234.5


def _arrays(
    rng,
    layout="bhsd",
    dtype=np.float32,
    batch=B,
    heads_q=HQ,
    heads_kv=HKV,
    seq_q=NQ,
    seq_k=NK,
    dim=D,
    dim_v=DV,
):
    """q, k, v in the given layout (rank 4), C-contiguous."""

    def make(heads, seq, width):
        shape = (batch, heads, seq, width) if layout == "bhsd" else (batch, seq, heads, width)
        return rng.standard_normal(shape).astype(dtype)

    return make(heads_q, seq_q, dim), make(heads_kv, seq_k, dim), make(heads_kv, seq_k, dim_v)


def _filled(shape, dtype=np.float32):
    return np.full(shape, SENTINEL, dtype)


# ---- attention(): array arguments -------------------------------------------------------------


@pytest.mark.parametrize("position, name", [(0, "q"), (1, "k"), (2, "v")])
def test_array_arguments_must_be_arrays(rng, position, name):
    arrays = list(_arrays(rng))
    arrays[position] = arrays[position].tolist()
    with raises(
        TypeError, f"{name} must be an array (numpy, torch, MLX or any DLPack producer), got list"
    ):
        mfa_native.attention(*arrays)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.dtype(">f4"), np.complex64])
def test_q_dtype_must_be_a_storage_dtype(rng, dtype):
    q, k, v = _arrays(rng)
    with raises(TypeError, "q.dtype must be float32, float16 or bfloat16"):
        mfa_native.attention(q.astype(dtype), k, v)


@pytest.mark.parametrize("position, name", [(1, "k"), (2, "v")])
def test_k_and_v_dtype_must_equal_q_dtype(rng, position, name):
    arrays = list(_arrays(rng))
    arrays[position] = arrays[position].astype(ml_dtypes.bfloat16)
    with raises(TypeError, f"{name}.dtype must be float32, got bfloat16"):
        mfa_native.attention(*arrays)


def test_q_rank_must_be_3_or_4(rng):
    q, k, v = _arrays(rng)
    with raises(ValueError, "q must have rank 4 (or 3 for a single batch), got shape (5, 8)"):
        mfa_native.attention(q[0, 0], k, v)


@pytest.mark.parametrize("position, name", [(1, "k"), (2, "v")])
def test_k_and_v_rank_must_equal_q_rank(rng, position, name):
    arrays = list(_arrays(rng))
    arrays[position] = arrays[position][0]
    with raises(ValueError, f"{name} must have rank 4 like q"):
        mfa_native.attention(*arrays)


# The axis of the batch, heads, sequence and head dimension in each layout.
_AXES = {"bhsd": dict(b=0, h=1, s=2, d=3), "bshd": dict(b=0, s=1, h=2, d=3)}
# (what is changed: k or v and the dimension, keyword arguments of _arrays for it, the message
# with the layout's axes in braces)
_SHAPE_MISMATCHES = [
    ("k batch", dict(batch=3), "k.shape[{b}] (batch) must equal q.shape[{b}] = 2, got 3"),
    ("v batch", dict(batch=3), "v.shape[{b}] (batch) must equal q.shape[{b}] = 2, got 3"),
    ("v heads", dict(heads_kv=1), "v.shape[{h}] (heads) must equal k.shape[{h}] = 2, got 1"),
    ("k head dim", dict(dim=9), "k.shape[{d}] (head dim) must equal q.shape[{d}] = 8, got 9"),
    (
        "v sequence",
        dict(seq_k=3),
        "v.shape[{s}] (sequence length) must equal k.shape[{s}] = 7, got 3",
    ),
]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("case", _SHAPE_MISMATCHES, ids=[case[0] for case in _SHAPE_MISMATCHES])
def test_shapes_must_agree_naming_the_axis_in_the_layout(rng, layout, case):
    what, changes, message = case
    name = what.split()[0]
    q, k, v = _arrays(rng, layout)
    _, bad_k, bad_v = _arrays(rng, layout, **changes)
    k, v = (bad_k, v) if name == "k" else (k, bad_v)
    with raises(ValueError, message.format(**_AXES[layout])):
        mfa_native.attention(q, k, v, layout=layout)


@pytest.mark.parametrize("layout, axis", [("bhsd", 1), ("bshd", 2)])
def test_query_heads_must_be_a_multiple_of_key_heads(rng, layout, axis):
    q, k, v = _arrays(rng, layout, heads_kv=3)
    with raises(
        ValueError,
        f"q.shape[{axis}] (query heads) = 4 must be a multiple of "
        f"k.shape[{axis}] (key/value heads) = 3",
    ):
        mfa_native.attention(q, k, v, layout=layout)


@pytest.mark.parametrize(
    "layout, axis, name",
    [("bhsd", 2, "sequence length"), ("bshd", 1, "sequence length"), ("bshd", 2, "heads")],
)
def test_empty_axes_are_rejected(rng, layout, axis, name):
    q, k, v = _arrays(rng, layout)
    empty_k = np.take(k, [], axis=axis)
    with raises(ValueError, f"k.shape[{axis}] ({name}) must be at least 1, got 0"):
        mfa_native.attention(q, empty_k, v, layout=layout)


def test_strides_must_be_multiples_of_the_itemsize(rng):
    q, k, v = _arrays(rng)
    # A field of a packed record array: float32 elements 5 bytes apart.
    packed = np.zeros(q.shape, dtype=[("value", "<f4"), ("flag", "u1")])
    packed["value"] = q
    with raises(ValueError, "q.strides (800, 200, 40, 5) must be multiples of the itemsize 4"):
        mfa_native.attention(packed["value"], k, v)


def test_arrays_must_be_aligned(rng):
    q, k, v = _arrays(rng)
    storage = bytearray(k.nbytes + 1)
    misaligned = np.frombuffer(storage, np.float32, count=k.size, offset=1).reshape(k.shape)
    assert not misaligned.flags.aligned
    with raises(ValueError, "k must be aligned to its itemsize 4"):
        mfa_native.attention(q, misaligned, v)


# ---- attention(): options, with out= given to show that nothing is written ----------------------

_BAD_OPTIONS = [
    (dict(causal="yes"), TypeError, "causal must be a bool, got str"),
    (dict(causal=1), TypeError, "causal must be a bool, got int"),
    (dict(causal_alignment="left"), ValueError, "causal_alignment must be one of"),
    (dict(causal_alignment=None), ValueError, "causal_alignment must be one of"),
    (dict(window=4), ValueError, "window must be None or a pair (left, right), got 4"),
    (dict(window=(1, 2, 3)), ValueError, "window must be None or a pair (left, right)"),
    (dict(window="ab"), ValueError, "window must be None or a pair (left, right)"),
    (dict(window=(1.5, 2)), TypeError, "window[0] must be an int or None, got float"),
    (dict(window=(0, True)), TypeError, "window[1] must be an int or None, got bool"),
    (
        dict(window=(0, -2)),
        ValueError,
        "window[1] must be >= 0, or -1 / None for unbounded, got -2",
    ),
    (dict(window=(2**64, 0)), ValueError, "window[0] must be >= 0, or -1 / None for unbounded"),
    (dict(scale="0.5"), TypeError, "scale must be None or a real number, got str"),
    (dict(scale=True), TypeError, "scale must be None or a real number, got bool"),
    (dict(scale=0.0), ValueError, "scale must be finite and nonzero"),
    (dict(scale=math.nan), ValueError, "scale must be finite and nonzero"),
    (dict(scale=-math.inf), ValueError, "scale must be finite and nonzero"),
    (dict(scale=1e-50), ValueError, "scale must be finite and nonzero as a float32"),
    (dict(scale=1e39), ValueError, "scale must be finite and nonzero as a float32"),
    (dict(scale=10**400), ValueError, "scale must be finite and nonzero as a float32"),
    (dict(layout="bsdh"), ValueError, "layout must be one of ['bhsd', 'bshd'], got 'bsdh'"),
    (dict(return_lse=1), TypeError, "return_lse must be a bool, got int"),
    (dict(backend="gpu"), ValueError, "backend must be None, a Context or one of"),
    (dict(backend=3), ValueError, "backend must be None, a Context or one of"),
]


def _option_ids(cases):
    return [
        ", ".join(f"{key}={value!r}"[:32] for key, value in options.items())
        for options, _, _ in cases
    ]


@pytest.mark.parametrize("options, error, message", _BAD_OPTIONS, ids=_option_ids(_BAD_OPTIONS))
def test_bad_options_raise_before_writing(rng, options, error, message):
    q, k, v = _arrays(rng)
    out = _filled((B, HQ, NQ, DV))
    with raises(error, message):
        mfa_native.attention(q, k, v, out=out, **options)
    assert np.all(out == SENTINEL)

    with raises(
        TypeError, "out must be an array (numpy, torch, MLX or any DLPack producer), got list"
    ):
        mfa_native.attention(*_arrays(rng), out=_filled((B, HQ, NQ, DV)).tolist())


def test_out_dtype_must_be_q_dtype(rng):
    with raises(TypeError, "out.dtype must be float32, got float16"):
        mfa_native.attention(*_arrays(rng), out=_filled((B, HQ, NQ, DV), np.float16))


@pytest.mark.parametrize("layout, expected", [("bhsd", (B, HQ, NQ, DV)), ("bshd", (B, NQ, HQ, DV))])
def test_out_shape_must_match_the_layout(rng, layout, expected):
    out = _filled((B, HQ, NQ, D))
    with raises(ValueError, f"out.shape must be {expected}, got {out.shape}"):
        mfa_native.attention(*_arrays(rng, layout), layout=layout, out=out)
    assert np.all(out == SENTINEL)


def test_out_must_be_writable(rng):
    out = _filled((B, HQ, NQ, DV))
    out.flags.writeable = False
    with raises(ValueError, "out must be writable"):
        mfa_native.attention(*_arrays(rng), out=out)


# ---- attention(): errors reported by the library ------------------------------------------------


def test_output_overlapping_an_input_is_a_library_error(rng):
    q, k, v = _arrays(rng, dim_v=D)
    q_before = q.copy()
    with raises(MFAError, "out overlaps q", status="INVALID_ARGUMENT") as caught:
        mfa_native.attention(q, k, v, out=q)
    error = caught.value
    assert error.status == 1
    assert error.message in str(error) and "INVALID_ARGUMENT" in str(error)
    np.testing.assert_array_equal(q, q_before)


def test_output_overlapping_itself_is_a_library_error(rng):
    q, k, v = _arrays(rng)
    storage = _filled(B * HQ * NQ + DV)
    # Consecutive rows one element apart: each row shares elements with the next.
    out = np.lib.stride_tricks.as_strided(storage, (B, HQ, NQ, DV), (HQ * NQ * 4, NQ * 4, 4, 4))
    overlapping = "out: stride 1 of dim 3 (head dim) makes elements overlap"
    with raises(MFAError, overlapping, status="INVALID_ARGUMENT"):
        mfa_native.attention(q, k, v, out=out)
    assert np.all(storage == SENTINEL)


def test_head_dim_beyond_the_backend_limit_is_unsupported(rng):
    context = mfa_native.Context("cpu")
    too_wide = context.capabilities["max_head_dim"] + 1
    q, k, v = _arrays(rng, heads_q=1, heads_kv=1, seq_q=1, seq_k=1, dim=too_wide)
    with raises(MFAError, f"q.shape[3] (head dim) = {too_wide} exceeds", status="UNSUPPORTED"):
        mfa_native.attention(q, k, v, backend=context)
    context.close()


@pytest.mark.parametrize("name", ["metal", "metal-sim"])
def test_unavailable_backend_is_an_error_not_a_fallback(rng, name):
    if name in mfa_native.available_backends():
        pytest.skip(f"{name} is available here")
    with raises(MFAError, f"the {name} backend ", status="BACKEND_UNAVAILABLE"):
        mfa_native.attention(*_arrays(rng), backend=name)


# ---- attention_backward() -----------------------------------------------------------------------


def _backward_arguments(rng, layout="bhsd"):
    q, k, v = _arrays(rng, layout)
    out, lse = mfa_native.attention(q, k, v, layout=layout, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)


@pytest.mark.parametrize("name", ["dout", "q", "k", "v", "out", "lse"])
def test_backward_array_arguments_must_be_arrays(rng, name):
    arguments = _backward_arguments(rng)
    arguments[name] = arguments[name].tolist()
    with raises(
        TypeError, f"{name} must be an array (numpy, torch, MLX or any DLPack producer), got list"
    ):
        mfa_native.attention_backward(**arguments)


@pytest.mark.parametrize("name", ["dout", "out"])
def test_backward_dout_and_out_must_match_q_and_v(rng, name):
    arguments = _backward_arguments(rng)
    correct = arguments[name]
    arguments[name] = correct.astype(np.float16)
    with raises(TypeError, f"{name}.dtype must be float32, got float16"):
        mfa_native.attention_backward(**arguments)
    arguments[name] = correct[:, :, :-1]
    with raises(
        ValueError,
        f"{name}.shape must be {(B, HQ, NQ, DV)} (from q and v), got {(B, HQ, NQ - 1, DV)}",
    ):
        mfa_native.attention_backward(**arguments)


def test_backward_lse_must_be_float32_of_the_query_rows(rng):
    arguments = _backward_arguments(rng)
    lse = arguments["lse"]
    arguments["lse"] = lse.astype(np.float64)
    with raises(TypeError, "lse.dtype must be float32, got float64"):
        mfa_native.attention_backward(**arguments)
    arguments["lse"] = lse[..., None]
    with raises(ValueError, f"lse.shape must be {(B, HQ, NQ)} (from q), got {(B, HQ, NQ, 1)}"):
        mfa_native.attention_backward(**arguments)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_backward_lse_shape_does_not_follow_the_layout(rng, layout):
    arguments = _backward_arguments(rng, layout)
    assert arguments["lse"].shape == (B, HQ, NQ)
    arguments["lse"] = np.ascontiguousarray(np.swapaxes(arguments["lse"], 1, 2))
    with raises(ValueError, "lse.shape must be"):
        mfa_native.attention_backward(**arguments, layout=layout)


@pytest.mark.parametrize("name, like", [("dq", "q"), ("dk", "k"), ("dv", "v")])
def test_backward_gradient_outputs_are_checked(rng, name, like):
    arguments = _backward_arguments(rng)
    shape = arguments[like].shape
    with raises(TypeError, f"{name}.dtype must be float32, got float16"):
        mfa_native.attention_backward(**arguments, **{name: _filled(shape, np.float16)})
    wrong = shape[:-1] + (shape[-1] + 1,)
    with raises(ValueError, f"{name}.shape must be {shape}, got {wrong}"):
        mfa_native.attention_backward(**arguments, **{name: _filled(wrong)})
    read_only = _filled(shape)
    read_only.flags.writeable = False
    with raises(ValueError, f"{name} must be writable"):
        mfa_native.attention_backward(**arguments, **{name: read_only})


_BAD_BACKWARD_OPTIONS = [case for case in _BAD_OPTIONS if "return_lse" not in case[0]]


@pytest.mark.parametrize(
    "options, error, message", _BAD_BACKWARD_OPTIONS, ids=_option_ids(_BAD_BACKWARD_OPTIONS)
)
def test_backward_bad_options_raise_before_writing(rng, options, error, message):
    arguments = _backward_arguments(rng)
    gradients = {
        name: _filled(arguments[like].shape)
        for name, like in (("dq", "q"), ("dk", "k"), ("dv", "v"))
    }
    with raises(error, message):
        mfa_native.attention_backward(**arguments, **gradients, **options)
    assert all(np.all(gradient == SENTINEL) for gradient in gradients.values())


def test_backward_overlapping_gradients_are_a_library_error(rng):
    arguments = _backward_arguments(rng)
    storage = _filled(B * HQ * NQ * D)
    dq = storage.reshape(B, HQ, NQ, D)
    dk = storage[: B * HKV * NK * D].reshape(B, HKV, NK, D)
    with raises(MFAError, "dq overlaps dk", status="INVALID_ARGUMENT"):
        mfa_native.attention_backward(**arguments, dq=dq, dk=dk)
    assert np.all(storage == SENTINEL)


# ---- layouts, ranks, views and out=, against the float64 reference ------------------------------


def _reference_forward(q, k, v, layout="bhsd", **options):
    """The float64 reference in the caller's layout (the reference itself works in bhsd)."""

    def to_bhsd(array):
        return array if layout == "bhsd" else np.swapaxes(array, -3, -2)

    rank3 = q.ndim == 3
    q, k, v = (to_bhsd(array)[None] if rank3 else to_bhsd(array) for array in (q, k, v))
    out, lse = reference.attention_forward(q, k, v, **options)
    out = out if layout == "bhsd" else np.swapaxes(out, -3, -2)
    return (out[0], lse[0]) if rank3 else (out, lse)


def _arrays_of_rank(rng, layout, rank, batch):
    """_arrays in the layout; at rank 3, their batch entry `batch`."""
    q, k, v = _arrays(rng, layout)
    return (q[batch], k[batch], v[batch]) if rank == 3 else (q, k, v)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("rank", [3, 4])
def test_forward_layout_and_rank(rng, layout, rank):
    q, k, v = _arrays_of_rank(rng, layout, rank, batch=1)
    out, lse = mfa_native.attention(q, k, v, layout=layout, causal=True, return_lse=True)
    expected_out, expected_lse = _reference_forward(q, k, v, layout, causal=True)
    assert out.shape == expected_out.shape and out.dtype == np.float32
    assert lse.shape == ((B,) if rank == 4 else ()) + (HQ, NQ) and lse.dtype == np.float32
    np.testing.assert_allclose(out, expected_out, rtol=F32_TOLERANCE, atol=F32_TOLERANCE)
    np.testing.assert_allclose(lse, expected_lse, rtol=F32_TOLERANCE, atol=F32_TOLERANCE)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("rank", [3, 4])
def test_backward_layout_and_rank(rng, layout, rank):
    q, k, v = _arrays_of_rank(rng, layout, rank, batch=0)
    out, lse = mfa_native.attention(q, k, v, layout=layout, window=(2, None), return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    grads = mfa_native.attention_backward(dout, q, k, v, out, lse, layout=layout, window=(2, None))

    def to_bhsd(array):
        array = array if layout == "bhsd" else np.swapaxes(array, -3, -2)
        return array[None] if rank == 3 else array

    expected = reference.attention_backward(
        *map(to_bhsd, (dout, q, k, v)), out=to_bhsd(out), window=(2, -1)
    )
    for got, like, want in zip(grads, (q, k, v), expected):
        assert got.shape == like.shape and got.dtype == np.float32
        want = want if layout == "bhsd" else np.swapaxes(want, -3, -2)
        np.testing.assert_allclose(
            got, want[0] if rank == 3 else want, rtol=F32_TOLERANCE, atol=F32_TOLERANCE
        )


def test_strided_views_are_read_in_place(rng):
    q, k, v = _arrays(rng)
    # Reversed sequence, every other head-dim column of a wider array, and a transposed copy.
    q_view = q[:, :, ::-1]
    wide_k = np.repeat(k, 2, axis=-1)
    wide_k[..., 1::2] = np.nan  # never read if the stride is honoured
    k_view = wide_k[..., ::2]
    v_view = np.ascontiguousarray(np.swapaxes(v, 2, 3)).swapaxes(2, 3)
    out = mfa_native.attention(q_view, k_view, v_view)
    expected, _ = _reference_forward(q_view, k, v)
    np.testing.assert_allclose(out, expected, rtol=F32_TOLERANCE, atol=F32_TOLERANCE)


def test_out_view_is_written_in_place_and_returned(rng):
    q, k, v = _arrays(rng)
    storage = _filled((B, HQ, NQ, 2 * DV))
    out_view = storage[:, :, ::-1, 1::2]
    result = mfa_native.attention(q, k, v, out=out_view)
    assert result is out_view
    expected, _ = _reference_forward(q, k, v)
    np.testing.assert_allclose(
        storage[:, :, ::-1, 1::2], expected, rtol=F32_TOLERANCE, atol=F32_TOLERANCE
    )
    assert np.all(storage[..., 0::2] == SENTINEL)


def test_gradient_outputs_are_written_in_place_and_returned(rng):
    arguments = _backward_arguments(rng)
    dq, dk, dv = (np.empty_like(arguments[name]) for name in "qkv")
    result = mfa_native.attention_backward(**arguments, dq=dq, dk=dk, dv=dv)
    assert result[0] is dq and result[1] is dk and result[2] is dv
    expected = mfa_native.attention_backward(**arguments)
    for got, want in zip(result, expected):
        np.testing.assert_array_equal(got, want)


def test_return_lse_false_returns_only_out(rng):
    out = mfa_native.attention(*_arrays(rng))
    assert isinstance(out, np.ndarray) and out.shape == (B, HQ, NQ, DV)


def test_scale_none_is_one_over_sqrt_head_dim_and_a_given_scale_is_used(rng):
    q, k, v = _arrays(rng)
    default = mfa_native.attention(q, k, v)
    np.testing.assert_array_equal(default, mfa_native.attention(q, k, v, scale=1 / math.sqrt(D)))
    expected, _ = _reference_forward(q, k, v, scale=0.25)
    np.testing.assert_allclose(
        mfa_native.attention(q, k, v, scale=0.25), expected, rtol=F32_TOLERANCE, atol=F32_TOLERANCE
    )


def test_window_none_and_minus_one_both_mean_unbounded(rng):
    q, k, v = _arrays(rng)
    np.testing.assert_array_equal(
        mfa_native.attention(q, k, v, window=(None, 1)),
        mfa_native.attention(q, k, v, window=[-1, 1]),
    )
    np.testing.assert_array_equal(
        mfa_native.attention(q, k, v, window=(None, None)), mfa_native.attention(q, k, v)
    )


def test_top_left_alignment_is_passed_through(rng):
    q, k, v = _arrays(rng)
    out = mfa_native.attention(q, k, v, causal=True, causal_alignment="top_left")
    expected, _ = _reference_forward(q, k, v, causal=True, causal_alignment="top_left")
    np.testing.assert_allclose(out, expected, rtol=F32_TOLERANCE, atol=F32_TOLERANCE)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_outputs_keep_the_input_dtype(rng, dtype):
    arguments = _backward_arguments(rng)
    q, k, v, dout = (arguments[name].astype(dtype) for name in ("q", "k", "v", "dout"))
    out, lse = mfa_native.attention(q, k, v, return_lse=True)
    assert out.dtype == dtype and lse.dtype == np.float32
    grads = mfa_native.attention_backward(dout, q, k, v, out, lse)
    assert all(grad.dtype == dtype for grad in grads)


# ---- backends and Context -----------------------------------------------------------------------


def test_backend_may_be_a_name_a_context_or_none(rng):
    q, k, v = _arrays(rng)
    with mfa_native.Context("cpu") as context:
        by_context = mfa_native.attention(q, k, v, backend=context)
    np.testing.assert_array_equal(mfa_native.attention(q, k, v, backend="cpu"), by_context)
    if mfa_native.info()["default_backend"] == "cpu":
        np.testing.assert_array_equal(mfa_native.attention(q, k, v), by_context)


def test_available_backends():
    names = mfa_native.available_backends()
    assert "cpu" in names and "auto" not in names
    assert names == [name for name in ("cpu", "metal", "metal-sim") if name in names]


def test_context_properties():
    with mfa_native.Context("cpu", num_threads=2) as context:
        assert context.backend == "cpu"
        assert isinstance(context.device_name, str) and context.device_name
        capabilities = context.capabilities
        assert "cpu" in repr(context)
    assert capabilities["dtypes"] == ["float32", "float16", "bfloat16"]
    # What the cpu backend has had since 0.1, and the 0.2 features as they land: every name is
    # one of mfa.h's feature bits.
    base = {"backward", "lse", "causal", "window", "gqa", "value_head_dim", "strides"}
    modifiers = {"mask", "block_mask", "softcap", "alibi", "sinks", "varlen", "paged_kv"}
    every = base | modifiers | {"initial_state", "device_buffers", "encode"}
    assert base <= set(capabilities["features"]) <= every
    assert base - {"backward", "lse"} <= set(capabilities["backward_features"])
    assert set(capabilities["backward_features"]) <= every - {"backward", "lse", "paged_kv"}
    assert capabilities["max_head_dim"] >= 512
    assert capabilities["gpu_family"] is None
    assert capabilities["num_threads"] == 2


def test_auto_context_runs_a_concrete_backend():
    with mfa_native.Context() as context:
        assert context.backend in mfa_native.available_backends()


def test_closed_context_raises_on_use(rng):
    context = mfa_native.Context("cpu")
    context.close()
    context.close()  # closing twice is allowed
    assert context.closed and "closed" in repr(context)
    with raises(ValueError, "the Context is closed"):
        mfa_native.attention(*_arrays(rng), backend=context)
    with raises(ValueError, "the Context is closed"):
        _ = context.capabilities
    with mfa_native.Context("cpu") as scoped:
        pass
    assert scoped.closed


_BAD_CONTEXTS = [
    (("gpu",), {}, ValueError, "backend must be one of"),
    ((None,), {}, ValueError, "backend must be one of"),
    (("cpu",), dict(num_threads=-1), ValueError, "num_threads must be >= 0"),
    (("cpu",), dict(num_threads=2**31), ValueError, "num_threads must fit the C option's int32"),
    (("cpu",), dict(num_threads=2.0), TypeError, "num_threads must be an int, got float"),
    (("cpu",), dict(num_threads=True), TypeError, "num_threads must be an int, got bool"),
    (("metal-sim",), dict(gpu_family="apple6"), ValueError, "gpu_family must be None or one of"),
    (("cpu",), dict(gpu_family="apple9"), ValueError, "gpu_family applies to backend 'metal-sim'"),
    (("metal-sim",), dict(sim_seed=-1), ValueError, "sim_seed must be in [0, 2**64)"),
    (("metal-sim",), dict(sim_seed=2**64), ValueError, "sim_seed must be in [0, 2**64)"),
    (("metal-sim",), dict(sim_seed="1"), TypeError, "sim_seed must be an int, got str"),
    (("cpu",), dict(sim_seed=7), ValueError, "sim_seed applies to backend 'metal-sim'"),
]


@pytest.mark.parametrize("args, kwargs, error, message", _BAD_CONTEXTS)
def test_bad_context_arguments(args, kwargs, error, message):
    with raises(error, message):
        mfa_native.Context(*args, **kwargs)


def test_context_options_are_keyword_only():
    with raises(TypeError):
        mfa_native.Context("cpu", 2)


def test_library_limits_on_context_options_come_back_as_mfa_error():
    with raises(MFAError, "options.num_threads must be in [0, 4096]", status="INVALID_ARGUMENT"):
        mfa_native.Context("cpu", num_threads=10**6)


def test_metal_sim_context_options():
    if "metal-sim" not in mfa_native.available_backends():
        pytest.skip("metal-sim is not built into this library")
    with mfa_native.Context("metal-sim", gpu_family="apple7", sim_seed=5) as context:
        assert context.backend == "metal-sim"
        assert context.capabilities["gpu_family"] == "apple7"


def test_info():
    details = mfa_native.info()
    assert set(details) == {
        "version",
        "library",
        "header",
        "backends",
        "default_backend",
        "device",
        "capabilities",
    }
    assert re.fullmatch(r"\d+\.\d+\.\d+", details["version"])
    assert details["version"] == mfa_native.__version__
    assert details["backends"] == mfa_native.available_backends()
    assert details["default_backend"] in details["backends"]
    assert details["default_backend"] != "metal-sim"  # auto never picks the simulator
    assert isinstance(details["device"], str) and details["device"]
    assert "float32" in details["capabilities"]["dtypes"]


def test_mfa_error_is_an_exception_with_the_library_status():
    error = MFAError(3, "no such device")
    assert isinstance(error, Exception)
    assert (error.status, error.status_name, error.message) == (
        3,
        "BACKEND_UNAVAILABLE",
        "no such device",
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.status, copy.message, str(copy)) == (3, "no such device", str(error))


def test_package_docstring_example_runs():
    results = doctest.testmod(mfa_native)
    assert results.attempted >= 4 and results.failed == 0


# ---- loading the library ------------------------------------------------------------------------


def _import_with(**environment):
    """Import mfa_native in a fresh interpreter with extra environment variables."""
    script = "import json, mfa_native; print(json.dumps(mfa_native.info()))"
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **environment},
    )


def test_mfa_library_and_mfa_header_select_the_library():
    details = mfa_native.info()
    library, header = details["library"], details["header"]
    result = _import_with(MFA_LIBRARY=library, MFA_HEADER=header)
    assert result.returncode == 0, result.stderr
    details = json.loads(result.stdout)
    assert (details["library"], details["header"]) == (library, header)


@pytest.mark.parametrize("variable", ["MFA_LIBRARY", "MFA_HEADER"])
def test_missing_override_files_fail_the_import(tmp_path, variable):
    details = mfa_native.info()
    environment = dict(MFA_LIBRARY=details["library"], MFA_HEADER=details["header"])
    environment[variable] = str(tmp_path / "missing")
    result = _import_with(**environment)
    assert result.returncode != 0
    assert f"ImportError: {variable}={str(tmp_path / 'missing')!r} is not a file" in result.stderr


def test_a_header_of_another_version_fails_the_import(tmp_path):
    details = mfa_native.info()
    header = Path(details["header"]).read_text()
    other, count = re.subn(
        r"#define MFA_VERSION_NUMBER \d+", "#define MFA_VERSION_NUMBER 999999", header
    )
    assert count == 1
    (tmp_path / "mfa.h").write_text(other)
    result = _import_with(MFA_LIBRARY=details["library"], MFA_HEADER=str(tmp_path / "mfa.h"))
    assert result.returncode != 0
    assert "do not belong together" in result.stderr


# ---- empty() ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_empty_is_page_aligned_writable_and_contiguous(dtype):
    array = mfa_native.empty((3, 5, 7), dtype)
    assert array.shape == (3, 5, 7) and array.dtype == dtype
    assert array.flags.c_contiguous and array.flags.writeable
    page = mfa_native._library.lib.mfa_page_size()
    assert array.__array_interface__["data"][0] % page == 0
    array[...] = 2
    assert np.all(array == 2)


def test_empty_arrays_work_as_inputs_and_outputs(rng):
    q, k, v = _arrays(rng)
    q_mfa, out = mfa_native.empty(q.shape), mfa_native.empty((B, HQ, NQ, DV))
    q_mfa[...] = q
    assert mfa_native.attention(q_mfa, k, v, out=out) is out
    np.testing.assert_array_equal(out, mfa_native.attention(q, k, v))


def test_empty_accepts_an_int_and_zero_sizes():
    assert mfa_native.empty(4).shape == (4,)
    assert mfa_native.empty((0, 3)).size == 0


@pytest.mark.parametrize(
    "shape, error, message",
    [
        ((2, -1), ValueError, "shape must not have negative sizes"),
        ((2.0, 3), TypeError, "shape must be an int or a tuple of ints"),
        ("23", TypeError, "shape must be an int or a tuple of ints"),
        ((2**40, 2**40), ValueError, "shape (1099511627776, 1099511627776) of float32 needs"),
    ],
)
def test_empty_rejects_bad_shapes(shape, error, message):
    with raises(error, message):
        mfa_native.empty(shape)


@pytest.mark.parametrize("dtype", [np.float64, "int8", "not a dtype"])
def test_empty_rejects_other_dtypes(dtype):
    with raises(TypeError, "dtype must be float32, float16 or bfloat16"):
        mfa_native.empty(3, dtype)
