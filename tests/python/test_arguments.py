"""The 0.2 arguments of the Python API: what each entry point hands the library, and how each
new argument is checked.

What is handed over is checked through _abi_reference's backend: the library validates each
call, then the float64 reference computes from the arrays the call passed, read as mfa.h
defines them. The results must be the reference's on the caller's own arrays, rounded once to
the output dtype: a wrong axis, stride, broadcast, offset or option changes them by far more.
Bad input (type, dtype, rank, shape or value of every new argument) raises TypeError or
ValueError naming the argument, or MFAError for what the library finds in the contents of the
integer arrays, before anything is written."""

import math

import mfa_native
import ml_dtypes
import numpy as np
import pytest
import reference
from _abi_reference import reference_backend
from _errors import raises
from mfa_native import MFAError

# Distinct sizes, so that a message or a view naming the wrong axis cannot pass.
B, HQ, HKV, NQ, NK, D, DV = 2, 4, 2, 5, 7, 8, 6
SENTINEL = 1234.5
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16}
# Unit roundoff of each output dtype: storing a float64 result rounds it by at most that much.
ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BF16: 2.0**-8}


def assert_rounded_once(name, actual, expected):
    """actual is expected (float64) stored once in actual's dtype. The backend computes the
    same float64 reference from the same numbers, so the difference is its one rounding, up to
    u |expected|; 2 u leaves room for float64 sums taken in another order."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    finite = np.isfinite(expected)
    assert np.array_equal(actual[~finite], expected[~finite]), f"{name}: infinities differ"
    error = np.abs(actual[finite].astype(np.float64) - expected[finite])
    allowed = 2 * ROUNDOFF[actual.dtype] * np.abs(expected[finite]) + 1e-300
    assert np.all(error <= allowed), f"{name}: off by up to {error.max():.3g}"


def qkv(rng, dtype="f32", layout="bhsd", batch=B, seq_q=NQ, seq_k=NK):
    def make(heads, seq, dim):
        shape = (batch, heads, seq, dim) if layout == "bhsd" else (batch, seq, heads, dim)
        return rng.standard_normal(shape).astype(DTYPES[dtype])

    return make(HQ, seq_q, D), make(HKV, seq_k, D), make(HKV, seq_k, DV)


def to_bhsd(array, layout):
    return array if layout == "bhsd" else np.swapaxes(array, -3, -2)


def every_modifier(rng, batch=B, seq_q=NQ, seq_k=NK):
    """A boolean mask the same for every batch, slopes per batch and head, sinks, a softcap
    that bends the scores."""
    keep = rng.random((1, HQ, seq_q, seq_k)) < 0.7
    keep[..., 0] = True
    return {
        "mask": keep,
        "softcap": 1.25,
        "alibi_slopes": rng.uniform(0.1, 1.0, (batch, HQ)).astype(np.float32),
        "sinks": rng.standard_normal(HQ).astype(np.float32),
    }


# ---- what each entry point hands the library ------------------------------------------------

WINDOWED = {"causal": True, "causal_alignment": "top_left", "window": (3, None), "scale": 0.625}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout, rank", [("bhsd", 4), ("bshd", 4), ("bhsd", 3), ("bshd", 3)])
def test_attention_hands_over_every_modifier(rng, dtype, layout, rank):
    q, k, v = qkv(rng, dtype, layout)
    options = every_modifier(rng)
    if rank == 3:
        q, k, v = q[1], k[1], v[1]
        options["alibi_slopes"] = options["alibi_slopes"][1]
    with reference_backend():
        out, lse = mfa_native.attention(
            q, k, v, **WINDOWED, **options, layout=layout, return_lse=True, backend="cpu"
        )
    inputs = [to_bhsd(x, layout) for x in (q, k, v)]
    inputs = [x[None] for x in inputs] if rank == 3 else inputs
    expected, expected_lse = reference.attention_forward(*inputs, **WINDOWED, **options)
    if rank == 3:
        expected, expected_lse = expected[0], expected_lse[0]
    assert out.dtype == q.dtype and lse.dtype == np.float32
    assert_rounded_once("out", to_bhsd(out, layout), expected)
    assert_rounded_once("lse", lse, expected_lse)


def mask_forms(rng, dtype):
    """(name, mask): every way a mask can be given, each broadcastable to [B, Hq, Nq, Nk]."""
    keep = rng.random((B, HQ, NQ, NK)) < 0.6
    keep[..., 0] = True
    additive = rng.standard_normal((NQ, NK))
    additive[rng.random((NQ, NK)) < 0.2] = -np.inf
    additive[:, 0] = 0.0
    wide = np.full((B, HQ, NQ, 2 * NK), np.nan, np.float32)
    wide[..., ::2] = additive
    return [
        ("bool, full", keep),
        ("bool, [1, 1, 1, Nk]", keep[:1, :1, :1]),
        ("bool, stride 0 over batch and heads", np.broadcast_to(keep[0, 0], keep.shape)),
        ("bool, transposed memory", np.ascontiguousarray(keep.swapaxes(2, 3)).swapaxes(2, 3)),
        ("additive, rank 2, q's dtype", additive.astype(DTYPES[dtype])),
        ("additive, float32, every other column of a NaN buffer", wide[..., ::2]),
        (
            "additive, float32, [B, 1, Nq, 1]",
            np.repeat(additive[None, None, :, :1], B, 0).astype(np.float32),
        ),
        ("additive, reversed keys", additive[:, ::-1].astype(np.float32)),
    ]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("form", range(8))
def test_masks_are_handed_over_in_every_form(rng, dtype, form):
    name, mask = mask_forms(rng, dtype)[form]
    q, k, v = qkv(rng, dtype)
    with reference_backend():
        out = mfa_native.attention(q, k, v, mask=mask, causal=True, backend="cpu")
    expected, _ = reference.attention_forward(q, k, v, mask=mask, causal=True)
    assert_rounded_once(name, out, expected)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_attention_backward_hands_over_every_modifier_and_dsinks(rng, layout):
    q, k, v = qkv(rng, "f32", layout)
    dout = rng.standard_normal(q.shape[:-1] + (DV,)).astype(np.float32)
    options = every_modifier(rng)
    inputs = [to_bhsd(x, layout) for x in (q, k, v)]
    out, lse = reference.attention_forward(*inputs, **WINDOWED, **options)
    out = to_bhsd(out.astype(np.float32), layout)
    lse = lse.astype(np.float32)
    expected = reference.attention_backward(
        to_bhsd(dout, layout), *inputs, out=to_bhsd(out, layout), return_dsinks=True,
        **WINDOWED, **options,
    )  # fmt: skip
    given = np.full(HQ, SENTINEL, np.float32)
    with reference_backend():
        returned = mfa_native.attention_backward(
            dout, q, k, v, out, lse, **WINDOWED, **options, layout=layout, return_dsinks=True,
            backend="cpu",
        )  # fmt: skip
        written = mfa_native.attention_backward(
            dout, q, k, v, out, lse, **WINDOWED, **options, layout=layout, dsinks=given,
            backend="cpu",
        )  # fmt: skip
    assert len(returned) == 4 and len(written) == 3
    for name, actual, wanted in zip(("dq", "dk", "dv"), returned, expected):
        assert_rounded_once(name, to_bhsd(actual, layout), wanted)
    assert_rounded_once("dsinks", returned[3], expected[3])
    np.testing.assert_array_equal(given, returned[3])


def test_accumulate_folds_the_call_into_out_and_lse(rng):
    q, k, v = qkv(rng, "f16")
    sinks = rng.standard_normal(HQ).astype(np.float32)
    # The state of the first 3 keys, with rows whose state is empty (lse -inf, out NaN: never
    # read) in the first batch.
    state, state_lse = reference.attention_forward(q, k[:, :, :3], v[:, :, :3], sinks=sinks)
    out, lse = state.astype(np.float16), state_lse.astype(np.float32)
    out[0, :, :2], lse[0, :, :2] = np.nan, -np.inf
    expected, expected_lse = reference.merge_states(
        [out, reference.attention_forward(q, k[:, :, 3:], v[:, :, 3:])[0]],
        [lse, reference.attention_forward(q, k[:, :, 3:], v[:, :, 3:])[1]],
    )
    with reference_backend():
        result = mfa_native.attention(
            q, k[:, :, 3:], v[:, :, 3:], out=out, lse=lse, accumulate=True, backend="cpu"
        )
    assert result is out
    assert_rounded_once("out", out, expected)
    assert_rounded_once("lse", lse, expected_lse)


def test_a_block_mask_is_handed_over_with_its_mask(rng):
    # 130 queries and keys: summaries of 3 x 3 blocks; the reference backend checks that the
    # block mask it receives is the summary of the mask it receives.
    q, k, v = qkv(rng, "f32", seq_q=130, seq_k=130)
    keep = reference.visible_keys(130, 130, causal=True) & (rng.random((130, 130)) < 0.9)
    keep[:, 0] = True
    summary = mfa_native.mask_summary(keep, 130, 130)
    with reference_backend():
        out = mfa_native.attention(q, k, v, mask=keep, block_mask=summary, backend="cpu")
    assert_rounded_once("out", out, reference.attention_forward(q, k, v, mask=keep)[0])


# Lengths 0 and 1 among others: a sequence without queries, one without keys.
CU_Q, CU_K = [0, 3, 3, 4, 9], [0, 5, 7, 7, 13]


def test_attention_varlen_and_its_backward_hand_over_packed_sequences(rng):
    total_q, total_k, batch = CU_Q[-1], CU_K[-1], len(CU_Q) - 1
    q = rng.standard_normal((total_q, HQ, D)).astype(np.float32)
    k = rng.standard_normal((total_k, HKV, D)).astype(np.float32)
    v = rng.standard_normal((total_k, HKV, DV)).astype(np.float32)
    dout = rng.standard_normal((total_q, HQ, DV)).astype(np.float32)
    cu_q, cu_k = np.array(CU_Q, np.int32), np.array(CU_K, np.int32)
    options = every_modifier(rng, batch=batch, seq_q=6, seq_k=8)
    options["mask"] = np.repeat(options["mask"], batch, axis=0)  # [B, Hq, max_q, max_k]
    packed = [x.swapaxes(0, 1)[None] for x in (q, k, v)]  # the reference's [1, H, total, D]
    expected, expected_lse = reference.varlen_attention_forward(
        *packed, CU_Q, CU_K, causal=True, **options
    )
    with reference_backend():
        out, lse = mfa_native.attention_varlen(
            q, k, v, cu_q, cu_k, 6, 8, causal=True, **options, return_lse=True, backend="cpu"
        )
        assert out.shape == (total_q, HQ, DV) and lse.shape == (HQ, total_q)
        assert_rounded_once("out", out.swapaxes(0, 1)[None], expected)
        assert_rounded_once("lse", lse[None], expected_lse)
        gradients = mfa_native.attention_varlen_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, 6, 8, causal=True, **options,
            return_dsinks=True, backend="cpu",
        )  # fmt: skip
    expected = reference.varlen_attention_backward(
        dout.swapaxes(0, 1)[None], *packed, CU_Q, CU_K, out=out.swapaxes(0, 1)[None],
        return_dsinks=True, causal=True, **options,
    )  # fmt: skip
    for name, actual, wanted in zip(("dq", "dk", "dv"), gradients, expected):
        assert_rounded_once(name, actual.swapaxes(0, 1)[None], wanted)
    assert_rounded_once("dsinks", gradients[3], expected[3])


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_attention_with_kvcache_hands_over_the_cache_and_writes_the_appends(rng, layout):
    block_size, num_blocks, lengths, new = 8, 7, [5, 11, 0], 2
    table = np.array([[4, 0, -1], [6, 2, 5], [1, -1, -1]], np.int32)  # -1: never read
    q = rng.standard_normal((3, HQ, 2, D)).astype(np.float32)
    caches = [
        rng.standard_normal((num_blocks, HKV, block_size, dim)).astype(np.float32)
        for dim in (D, DV)
    ]
    k_new = rng.standard_normal((3, HKV, new, D)).astype(np.float32)
    v_new = rng.standard_normal((3, HKV, new, DV)).astype(np.float32)
    sinks = rng.standard_normal(HQ).astype(np.float32)
    expected, expected_lse, k_after, v_after = reference.paged_attention_forward(
        q, *caches, table, lengths, k_new=k_new, v_new=v_new, causal=True, sinks=sinks
    )
    given = [to_bhsd(x, layout) for x in (q, *caches, k_new, v_new)]
    if layout == "bshd":  # the caller's own memory order: [.., block_size, Hkv, D]
        given = [np.ascontiguousarray(x) for x in given]
    with reference_backend():
        out, lse = mfa_native.attention_with_kvcache(
            given[0], given[1], given[2], table, np.array(lengths, np.int32), given[3],
            given[4], causal=True, sinks=sinks, layout=layout, return_lse=True, backend="cpu",
        )  # fmt: skip
    assert_rounded_once("out", to_bhsd(out, layout), expected)
    assert_rounded_once("lse", lse, expected_lse)
    np.testing.assert_array_equal(to_bhsd(given[1], layout), k_after.astype(np.float32))
    np.testing.assert_array_equal(to_bhsd(given[2], layout), v_after.astype(np.float32))


def test_torch_and_mlx_arrays_hand_over_their_modifiers(rng):
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("mlx.core")
    q, k, v = qkv(rng, "f32")
    options = every_modifier(rng)
    expected, _ = reference.attention_forward(q, k, v, **options)
    as_torch = {name: torch.from_numpy(np.asarray(x)) if name != "softcap" else x
                for name, x in options.items()}  # fmt: skip
    as_mlx = {name: mx.array(x) if name != "softcap" else x for name, x in options.items()}
    with reference_backend():
        from_torch = mfa_native.attention(
            *(torch.from_numpy(x) for x in (q, k, v)), **as_torch, backend="cpu"
        )
        from_mlx = mfa_native.attention(*(mx.array(x) for x in (q, k, v)), **as_mlx, backend="cpu")
    assert isinstance(from_torch, torch.Tensor) and isinstance(from_mlx, mx.array)
    assert_rounded_once("torch", from_torch.numpy(), expected)
    assert_rounded_once("mlx", np.array(from_mlx), expected)


# ---- bad input ------------------------------------------------------------------------------


def forward_arguments(rng):
    q, k, v = qkv(rng)
    return {"q": q, "k": k, "v": v}


_NOT_AN_ARRAY = "must be an array (numpy, torch, MLX or any DLPack producer), got list"
_BAD_FORWARD = [
    ({"mask": [[True]]}, TypeError, f"mask {_NOT_AN_ARRAY}"),
    ({"mask": np.ones((NQ, NK), np.int32)}, TypeError, "mask.dtype must be bool or float32, got"),
    (
        {"mask": np.ones((1, 1, 1, NQ, NK), bool)},
        ValueError,
        "mask must have rank at most 4 (batch, heads, queries, keys), got shape (1, 1, 1, 5, 7)",
    ),
    (
        {"mask": np.ones((3, NK), bool)},
        ValueError,
        f"mask.shape (3, 7) must broadcast to (batch, heads, queries, keys) = {(B, HQ, NQ, NK)}",
    ),
    ({"mask": np.ones((HKV, 1, NK), bool)}, ValueError, "mask.shape (2, 1, 7) must broadcast"),
    (
        {"block_mask": np.ones((1, 1, 1, 1), np.uint8)},
        ValueError,
        "block_mask is given without mask",
    ),
    (
        {"mask": np.ones((NQ, NK), bool), "block_mask": np.ones((1, 1, 1, 1), bool)},
        TypeError,
        "block_mask.dtype must be uint8, got bool",
    ),
    (
        {"mask": np.ones((B, 1, NQ, NK), bool), "block_mask": np.ones((1, 1, 1, 1), np.uint8)},
        ValueError,
        "block_mask.shape must be (2, 1, 1, 1) (mask_summary(mask, 5, 7)), got (1, 1, 1, 1)",
    ),
    ({"softcap": "1"}, TypeError, "softcap must be None or a real number, got str"),
    ({"softcap": True}, TypeError, "softcap must be None or a real number, got bool"),
    ({"softcap": 0.0}, ValueError, "softcap must be None (none) or finite and > 0 as a float32"),
    ({"softcap": -2.0}, ValueError, "softcap must be None (none) or finite and > 0"),
    ({"softcap": math.nan}, ValueError, "softcap must be None (none) or finite and > 0"),
    ({"softcap": math.inf}, ValueError, "softcap must be None (none) or finite and > 0"),
    ({"softcap": 1e-50}, ValueError, "softcap must be None (none) or finite and > 0 as a float32"),
    ({"softcap": 1e39}, ValueError, "softcap must be None (none) or finite and > 0 as a float32"),
    ({"alibi_slopes": [1.0] * HQ}, TypeError, f"alibi_slopes {_NOT_AN_ARRAY}"),
    (
        {"alibi_slopes": np.ones(HQ, np.float16)},
        TypeError,
        "alibi_slopes.dtype must be float32, got float16",
    ),
    (
        {"alibi_slopes": np.ones(HKV, np.float32)},
        ValueError,
        f"alibi_slopes.shape must be ({HQ},) or ({B}, {HQ}) (query heads, or batch and query "
        "heads), got (2,)",
    ),
    ({"alibi_slopes": np.ones((3, HQ), np.float32)}, ValueError, "alibi_slopes.shape must be"),
    ({"alibi_slopes": np.ones((B, HQ, 1), np.float32)}, ValueError, "alibi_slopes.shape must"),
    ({"sinks": np.zeros(HQ)}, TypeError, "sinks.dtype must be float32, got float64"),
    (
        {"sinks": np.zeros((1, HQ), np.float32)},
        ValueError,
        f"sinks.shape must be ({HQ},) (query heads), got (1, 4)",
    ),
    ({"accumulate": 1}, TypeError, "accumulate must be a bool, got int"),
    ({"accumulate": True}, ValueError, "accumulate=True needs out= and lse="),
    ({"lse": np.zeros((B, HQ, NQ))}, TypeError, "lse.dtype must be float32, got float64"),
    (
        {"lse": np.zeros((B, HQ, NQ, 1), np.float32)},
        ValueError,
        f"lse.shape must be {(B, HQ, NQ)} (batch, heads, queries), got {(B, HQ, NQ, 1)}",
    ),
]


def _ids(cases):
    return [", ".join(f"{k}={v!r}"[:40] for k, v in options.items()) for options, _, _ in cases]


@pytest.mark.parametrize("options, error, message", _BAD_FORWARD, ids=_ids(_BAD_FORWARD))
def test_bad_modifiers_raise_before_writing(rng, options, error, message):
    out = np.full((B, HQ, NQ, DV), SENTINEL, np.float32)
    with raises(error, message):
        mfa_native.attention(**forward_arguments(rng), out=out, **options)
    assert np.all(out == SENTINEL)


def test_a_mask_in_another_dtype_names_the_three_it_may_have(rng):
    q, k, v = qkv(rng, "f16")
    with raises(TypeError, "mask.dtype must be bool, float32 or float16, got bfloat16"):
        mfa_native.attention(q, k, v, mask=np.zeros((NQ, NK), BF16))


def test_lse_given_must_be_writable_and_is_written_without_return_lse(rng):
    arguments = forward_arguments(rng)
    lse = np.full((B, HQ, NQ), SENTINEL, np.float32)
    lse.flags.writeable = False
    with raises(ValueError, "lse must be writable"):
        mfa_native.attention(**arguments, lse=lse)
    lse = np.full((B, HQ, NQ), SENTINEL, np.float32)
    out = mfa_native.attention(**arguments, lse=lse)
    expected_out, expected_lse = reference.attention_forward(*arguments.values())
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5)
    np.testing.assert_allclose(out, expected_out, rtol=1e-4, atol=1e-5)


def backward_arguments(rng, sinks=True):
    q, k, v = qkv(rng)
    out, lse = mfa_native.attention(q, k, v, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    extra = {"sinks": np.zeros(HQ, np.float32)} if sinks else {}
    return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, **extra)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"return_dsinks": 1}, TypeError, "return_dsinks must be a bool, got int"),
        ({"dsinks": np.zeros(HQ)}, TypeError, "dsinks.dtype must be float32, got float64"),
        (
            {"dsinks": np.zeros(HQ + 1, np.float32)},
            ValueError,
            f"dsinks.shape must be ({HQ},) (query heads), got (5,)",
        ),
    ],
)
def test_bad_dsinks_raise_before_writing(rng, options, error, message):
    gradients = {name: np.full(like.shape, SENTINEL, np.float32) for name, like in
                 zip(("dq", "dk", "dv"), qkv(rng))}  # fmt: skip
    with raises(error, message):
        mfa_native.attention_backward(**backward_arguments(rng), **gradients, **options)
    assert all(np.all(g == SENTINEL) for g in gradients.values())


def test_dsinks_need_sinks(rng):
    arguments = backward_arguments(rng, sinks=False)
    with raises(ValueError, "return_dsinks=True is given without sinks"):
        mfa_native.attention_backward(**arguments, return_dsinks=True)
    with raises(ValueError, "dsinks is given without sinks"):
        mfa_native.attention_backward(**arguments, dsinks=np.zeros(HQ, np.float32))
    read_only = np.zeros(HQ, np.float32)
    read_only.flags.writeable = False
    with raises(ValueError, "dsinks must be writable"):
        mfa_native.attention_backward(**backward_arguments(rng), dsinks=read_only)


def varlen_arguments(rng, cu_q=(0, 2, 5), cu_k=(0, 4, 7)):
    return {
        "q": rng.standard_normal((cu_q[-1], HQ, D)).astype(np.float32),
        "k": rng.standard_normal((cu_k[-1], HKV, D)).astype(np.float32),
        "v": rng.standard_normal((cu_k[-1], HKV, DV)).astype(np.float32),
        "cu_seqlens_q": np.array(cu_q, np.int32),
        "cu_seqlens_k": np.array(cu_k, np.int32),
        "max_seqlen_q": 3,
        "max_seqlen_k": 4,
    }


_BAD_VARLEN = [
    (
        {"q": np.zeros((1, 5, HQ, D), np.float32)},
        ValueError,
        "q must have rank 3 (total_q, heads, head dim) for packed sequences, got shape",
    ),
    ({"v": np.zeros((7, HKV, 0), np.float32)}, ValueError, "v.shape[2] (head dim) must be at"),
    ({"k": np.zeros((6, HKV, D), np.float32)}, ValueError, "v.shape[0] (sequence length) must"),
    ({"k": np.zeros((7, 3, D), np.float32)}, ValueError, "v.shape[1] (heads) must equal k.shape"),
    (
        {"cu_seqlens_q": np.array([0, 2, 5])},
        TypeError,
        "cu_seqlens_q.dtype must be int32, got int64",
    ),
    (
        {"cu_seqlens_k": np.array([[0, 4, 7]], np.int32)},
        ValueError,
        "cu_seqlens_k must have shape (B + 1,) for B >= 1 sequences, got (1, 3)",
    ),
    ({"cu_seqlens_q": np.array([0], np.int32)}, ValueError, "cu_seqlens_q must have shape (B"),
    (
        {"cu_seqlens_k": np.array([0, 7], np.int32)},
        ValueError,
        "cu_seqlens_k.shape must equal cu_seqlens_q.shape = (3,), got (2,)",
    ),
    ({"max_seqlen_q": 0}, ValueError, "max_seqlen_q must be in [1, 2**31 - 1], got 0"),
    ({"max_seqlen_k": 2**31}, ValueError, "max_seqlen_k must be in [1, 2**31 - 1]"),
    ({"max_seqlen_k": 4.0}, TypeError, "max_seqlen_k must be an int, got float"),
    (
        {"mask": np.ones((3, 1, 3, 4), bool)},
        ValueError,
        f"mask.shape (3, 1, 3, 4) must broadcast to (batch, heads, queries, keys) = "
        f"{(2, HQ, 3, 4)}",
    ),
]


@pytest.mark.parametrize("changes, error, message", _BAD_VARLEN, ids=_ids(_BAD_VARLEN))
def test_bad_packed_arguments_raise_before_writing(rng, changes, error, message):
    out = np.full((5, HQ, DV), SENTINEL, np.float32)
    with raises(error, message):
        mfa_native.attention_varlen(**{**varlen_arguments(rng), **changes}, out=out)
    assert np.all(out == SENTINEL)


@pytest.mark.parametrize(
    "cu_q, cu_k, message",
    [
        ((0, 3, 2), (0, 4, 7), "args.cu_seqlens_q[2] = 2 must equal the packed length"),
        ((0, 2, 3, 5), (0, 4, 3, 7), "args.cu_seqlens_k decreases at entry 2: 3 after 4"),
        ((0, 1, 5), (0, 4, 7), "args.cu_seqlens_q: sequence 1 has 4 queries, more than"),
        ((1, 2, 5), (0, 4, 7), "args.cu_seqlens_q[0] must be 0, got 1"),
    ],
)
def test_offsets_the_library_reads_are_checked_before_writing(rng, cu_q, cu_k, message):
    arguments = varlen_arguments(rng)
    arguments["cu_seqlens_q"] = np.array(cu_q, np.int32)
    arguments["cu_seqlens_k"] = np.array(cu_k, np.int32)
    out = np.full((5, HQ, DV), SENTINEL, np.float32)
    with raises(MFAError, message, status="INVALID_ARGUMENT"):
        mfa_native.attention_varlen(**arguments, out=out)
    assert np.all(out == SENTINEL)


def paged_arguments(rng, block_size=8, num_blocks=4):
    return {
        "q": rng.standard_normal((B, HQ, 1, D)).astype(np.float32),
        "k_cache": rng.standard_normal((num_blocks, HKV, block_size, D)).astype(np.float32),
        "v_cache": rng.standard_normal((num_blocks, HKV, block_size, DV)).astype(np.float32),
        "block_table": np.array([[0, 1], [2, 3]], np.int32),
        "cache_seqlens": np.array([9, 3], np.int32),
    }


_BAD_PAGED = [
    ({"q": np.zeros((HQ, 1, D), np.float32)}, ValueError, "q must have rank 4 with a paged KV"),
    (
        {"k_cache": np.zeros((4, HKV, 12, D), np.float32)},
        ValueError,
        "v_cache.shape[2] (sequence length) must equal k_cache.shape[2] = 12",
    ),
    (
        {
            "k_cache": np.zeros((4, HKV, 12, D), np.float32),
            "v_cache": np.zeros((4, HKV, 12, DV), np.float32),
        },
        ValueError,
        "k_cache.shape[2] (block size) must be a multiple of 8 from 8 to 256, got 12",
    ),  # fmt: skip
    (
        {"k_cache": np.zeros((4, HKV, 8, D), np.float16)},
        TypeError,
        "k_cache.dtype must be float32, got float16",
    ),
    ({"k_cache": np.zeros((4, HKV, 8, D + 1), np.float32)}, ValueError, "k_cache.shape[3] (head"),
    (
        {"block_table": np.array([[0, 1], [2, 3]])},
        TypeError,
        "block_table.dtype must be int32, got int64",
    ),
    (
        {"block_table": np.array([0, 1], np.int32)},
        ValueError,
        "block_table.shape must be (2, max_blocks) (batch from q, max_blocks >= 1), got (2,)",
    ),
    (
        {"cache_seqlens": np.array([9, 3, 1], np.int32)},
        ValueError,
        "cache_seqlens.shape must be (2,) (batch from q), got (3,)",
    ),
    ({"k": np.zeros((B, HKV, 1, D), np.float32)}, ValueError, "v is None while the other is"),
    (
        {"k": np.zeros((B, HKV, 1, D + 1), np.float32), "v": np.zeros((B, HKV, 1, DV))},
        ValueError,
        f"k.shape must be {(B, HKV, 1, D)} (batch from q, heads and head dim from k_cache)",
    ),
    (
        {"k": np.zeros((B, HKV, 1, D), np.float32), "v": np.zeros((B, HKV, 2, DV), np.float32)},
        ValueError,
        f"v.shape must be {(B, HKV, 1, DV)} (from k and v_cache), got {(B, HKV, 2, DV)}",
    ),
    (
        {"mask": np.ones((B, 1, 1, 15), bool)},
        ValueError,
        f"mask.shape (2, 1, 1, 15) must broadcast to (batch, heads, queries, keys) = "
        f"{(B, HQ, 1, 16)}",
    ),
]


@pytest.mark.parametrize("changes, error, message", _BAD_PAGED, ids=_ids(_BAD_PAGED))
def test_bad_paged_arguments_raise_before_writing(rng, changes, error, message):
    out = np.full((B, HQ, 1, DV), SENTINEL, np.float32)
    with raises(error, message):
        mfa_native.attention_with_kvcache(**{**paged_arguments(rng), **changes}, out=out)
    assert np.all(out == SENTINEL)


@pytest.mark.parametrize(
    "table, lengths, message",
    [
        ([[0, 7], [2, 3]], [9, 3], "args.block_table[0, 1] = 7 is not a block of the cache"),
        ([[0, 1], [2, 3]], [17, 3], "args.cache_seqlens[0] = 17 plus 1 new keys exceeds"),
        ([[0, 1], [2, 3]], [9, -1], "args.cache_seqlens[1] = -1 must be >= 0"),
        ([[0, 1], [1, 3]], [9, 3], "args.block_table: block 1 receives new keys"),
    ],
)
def test_block_tables_the_library_reads_are_checked_before_writing(rng, table, lengths, message):
    arguments = paged_arguments(rng)
    arguments["block_table"] = np.array(table, np.int32)
    arguments["cache_seqlens"] = np.array(lengths, np.int32)
    caches = [arguments["k_cache"].copy(), arguments["v_cache"].copy()]
    new = {"k": np.ones((B, HKV, 1, D), np.float32), "v": np.ones((B, HKV, 1, DV), np.float32)}
    out = np.full((B, HQ, 1, DV), SENTINEL, np.float32)
    with raises(MFAError, message, status="INVALID_ARGUMENT"):
        mfa_native.attention_with_kvcache(**arguments, **new, out=out)
    assert np.all(out == SENTINEL)
    np.testing.assert_array_equal(arguments["k_cache"], caches[0])
    np.testing.assert_array_equal(arguments["v_cache"], caches[1])


def merge_arguments(rng, parts=2):
    outs = [rng.standard_normal((B, HQ, NQ, DV)).astype(np.float32) for _ in range(parts)]
    lses = [rng.standard_normal((B, HQ, NQ)).astype(np.float32) for _ in range(parts)]
    return outs, lses


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda o, s: (o[0], s), TypeError, "outs must be a non-empty list or tuple of arrays"),
        (lambda o, s: ([], []), TypeError, "outs must be a non-empty list or tuple of arrays"),
        (lambda o, s: (o, s[:1]), ValueError, "lses must have one array per part: 2 outs, 1"),
        (lambda o, s: (o, [s[0], s[1].astype(np.float16)]), TypeError, "lses[1].dtype must be"),
        (lambda o, s: ([o[0], o[1][:, :, :-1]], s), ValueError, "outs[1].shape must equal outs"),
        (lambda o, s: ([o[0], o[1].astype(np.float64)], s), TypeError, "outs[1].dtype must be"),
        (lambda o, s: ([o[0][0, 0, 0]], s[:1]), ValueError, "outs[0] must have rank 4"),
        (lambda o, s: (o, [s[0], s[1][..., None]]), ValueError, "lses[1].shape must be"),
    ],
)
def test_bad_merge_arguments_raise_before_writing(rng, change, error, message):
    outs, lses = change(*merge_arguments(rng))
    out = np.full((B, HQ, NQ, DV), SENTINEL, np.float32)
    with raises(error, message):
        mfa_native.merge_attention_states(outs, lses, out=out)
    assert np.all(out == SENTINEL)


def test_merge_out_and_lse_given_are_checked(rng):
    outs, lses = merge_arguments(rng)
    with raises(ValueError, f"out.shape must be {(B, HQ, NQ, DV)} (from outs[0]), got"):
        mfa_native.merge_attention_states(outs, lses, out=np.zeros((B, HQ, NQ, D), np.float32))
    with raises(TypeError, "lse.dtype must be float32, got float16"):
        mfa_native.merge_attention_states(outs, lses, lse=np.zeros((B, HQ, NQ), np.float16))
    with raises(MFAError, "out overlaps", status="INVALID_ARGUMENT"):
        # Neither exactly one part (in place) nor apart from them: refused by the library.
        mfa_native.merge_attention_states(outs, lses, out=outs[1][:, ::-1])


@pytest.mark.parametrize(
    "mask, seq_q, seq_k, error, message",
    [
        (np.ones((5, 7), bool), 0, 7, ValueError, "seq_q must be >= 1, got 0"),
        (np.ones((5, 7), bool), 5, 7.0, TypeError, "seq_k must be an int, got float"),
        (np.ones((5, 7), np.int32), 5, 7, TypeError, "mask.dtype must be bool, float32, float16"),
        (np.ones((1, 1, 1, 5, 7), bool), 5, 7, ValueError, "mask must have rank at most 4"),
        (
            np.ones((5, 7), bool),
            5,
            8,
            ValueError,
            "mask.shape (5, 7) must broadcast to (M0, M1, seq_q, seq_k) = (., ., 5, 8)",
        ),
    ],
)
def test_bad_mask_summary_arguments(mask, seq_q, seq_k, error, message):
    with raises(error, message):
        mfa_native.mask_summary(mask, seq_q, seq_k)


def test_other_libraries_keywords_for_the_new_arguments_get_mfas_names(rng):
    arguments = forward_arguments(rng)
    with raises(TypeError, "attention() got an unexpected keyword argument 'attn_mask': "
                "mfa_native's name for it is mask="):  # fmt: skip
        mfa_native.attention(**arguments, attn_mask=None)
    with raises(TypeError, "attention() got an unexpected keyword argument 'return_dsinks'"):
        mfa_native.attention(**arguments, return_dsinks=True)
    with raises(TypeError, "attention_with_kvcache() got an unexpected keyword argument 'k_new'"):
        mfa_native.attention_with_kvcache(**paged_arguments(rng), k_new=None)
