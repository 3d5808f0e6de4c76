"""mfa_native.mlx on MLX's CPU device: forward and mx.grad (through mfa's fused backward)
against the float64 reference, scaled_dot_product_attention against
mx.fast.scaled_dot_product_attention, strided views, and what is refused."""

import _cases
import mfa_native
import numpy as np
import pytest
import reference
from _backends import Case, check_backward, check_forward, record_addresses, skip_unless_default_has
from mfa_native import _arrays

mx = pytest.importorskip("mlx.core")
mfa_mlx = pytest.importorskip("mfa_native.mlx")

MLX_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


def to_mlx(array, dtype):
    """A numpy array of a storage dtype as an MLX array of the same values (through float32,
    which holds every f16 and bf16 value exactly)."""
    return mx.array(np.asarray(array, np.float32)).astype(MLX_DTYPES[dtype])


def to_numpy(array):
    return np.array(array.astype(mx.float32)).astype(np.float64)


CASES = [
    Case(9, 13, 16, 8, query_heads=4, kv_heads=2, causal=True),
    Case(23, 9, 32, 32, batch=2, query_heads=2, kv_heads=1, causal=True, dtype="bf16"),
    Case(17, 40, 40, 24, query_heads=4, kv_heads=4, window=(3, 3), dtype="f16"),
    Case(1, 129, 64, 64, query_heads=8, kv_heads=2, causal=True, window=(31, 0)),
    Case(33, 17, 24, 24, query_heads=2, kv_heads=2, causal=True, causal_alignment="top_left",
         scale=0.4, dtype="bf16"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_forward_and_grad_match_reference(case, monkeypatch):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    arrays = [to_mlx(x, case.dtype) for x in (q, k, v)]
    out, lse = mfa_mlx.attention(*arrays, **case.options, return_lse=True)
    assert isinstance(out, mx.array) and out.dtype == MLX_DTYPES[case.dtype]
    check_forward(case, to_numpy(out), to_numpy(lse), q, k, v)

    calls = []
    backward = mfa_native._attention.attention_backward
    monkeypatch.setattr(
        mfa_native._attention,
        "attention_backward",
        lambda *args, **options: calls.append(options) or backward(*args, **options),
    )
    cotangent = to_mlx(dout, case.dtype)

    def loss(q, k, v):
        return (mfa_mlx.attention(q, k, v, **case.options) * cotangent).astype(mx.float32).sum()

    gradients = mx.grad(loss, argnums=(0, 1, 2))(*arrays)
    assert len(calls) == 1, "mx.grad ran mfa's backward"
    assert calls[0]["window"] == case.window and calls[0]["causal"] == case.causal
    check_backward(case, [to_numpy(g) for g in gradients], dout, q, k, v, to_numpy(out))


@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize(
    "shapes", [((2, 4, 9, 16), (2, 2, 13, 16)), ((1, 6, 17, 32), (1, 1, 11, 32))]
)
def test_sdpa_matches_mlx(shapes, mask):
    """mx.fast.scaled_dot_product_attention is an independent implementation (on the CPU
    device, MLX's unfused composition), bottom-right causal as mfa's. Both are float32 values
    of O(1) from sums of at most 13 terms of width 32: 1e-5 bounds the rounding of either
    (some dozen units of 2^-24), forward and backward."""
    q_shape, kv_shape = shapes
    mx.random.seed(3)
    q, k, v = (mx.random.normal(shape) for shape in (q_shape, kv_shape, kv_shape))
    scale = q_shape[-1] ** -0.5
    out = mfa_mlx.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    if mask == "causal" and q_shape[2] > kv_shape[2]:
        # Rows that see no key: 0 in mfa (and flash-attn); MLX's softmax gives NaN there.
        visible = reference.visible_keys(q_shape[2], kv_shape[2], causal=True)
        assert np.all(np.array(out)[:, :, ~visible.any(axis=1)] == 0)
        return
    np.testing.assert_allclose(np.array(out), np.array(expected), atol=1e-5, rtol=1e-5)

    def loss(function):
        return lambda q, k, v: (function(q, k, v, scale=scale, mask=mask) ** 2).sum()

    ours = mx.grad(loss(mfa_mlx.scaled_dot_product_attention), argnums=(0, 1, 2))(q, k, v)
    theirs = mx.grad(loss(mx.fast.scaled_dot_product_attention), argnums=(0, 1, 2))(q, k, v)
    for mine, wanted in zip(ours, theirs):
        np.testing.assert_allclose(np.array(mine), np.array(wanted), atol=1e-5, rtol=1e-5)


def test_strided_views_are_read_in_place():
    """A [B, N, H, D] array transposed to [B, H, N, D] is a view in MLX: read without a copy
    (the address libmfa reads is the original's)."""
    case = CASES[0]
    q, k, v = case.inputs(case.rng())
    originals = [to_mlx(np.ascontiguousarray(np.swapaxes(x, 1, 2)), "f32") for x in (q, k, v)]
    views = [x.transpose(0, 2, 1, 3) for x in originals]
    assert [_arrays.read_array("x", x).address for x in views] == [
        _arrays.read_array("x", x).address for x in originals
    ]
    out = mfa_mlx.attention(*views, **case.options)
    expected, _ = reference.attention_forward(q, k, v, **case.options)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


def test_lse_carries_no_gradient():
    q = mx.random.normal((1, 2, 5, 8))
    gradient = mx.grad(lambda q: mfa_mlx.attention(q, q, q, return_lse=True)[1].sum())(q)
    assert mx.all(gradient == 0).item()


def test_what_mlx_refuses_is_refused():
    q = mx.random.normal((1, 2, 5, 8))
    with pytest.raises(ValueError, match="^mask must be None, 'causal' or an array"):
        mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, mask="diagonal")
    with pytest.raises(TypeError, match="^mask must be None, 'causal' or an mx.array"):
        mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, mask=np.ones((5, 5), bool))
    with pytest.raises(ValueError, match="^q must have rank 4"):
        mfa_mlx.scaled_dot_product_attention(q[0], q[0], q[0], scale=1.0)
    with pytest.raises(TypeError, match="'is_causal': MLX's name for it is mask='causal'"):
        mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, is_causal=True)
    with pytest.raises(ValueError, match="^mask"):
        mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, mask=mx.ones((4, 5), mx.bool_))
    with pytest.raises(ValueError, match="^sinks"):
        mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, sinks=mx.zeros(3))
    # force_fused is honoured by construction: mfa always runs fused kernels.
    np.testing.assert_array_equal(
        np.array(mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, force_fused=True)),
        np.array(mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0)),
    )


def _mlx_modifiers(case, modifiers):
    """The numpy modifiers of a case as MLX arrays of the same values and dtypes (masks in q's
    dtype through float32, which holds them exactly)."""
    converted = dict(modifiers)
    mask = modifiers.get("mask")
    if mask is not None:
        if mask.dtype == np.bool_:
            converted["mask"] = mx.array(np.ascontiguousarray(mask))
        elif mask.dtype == np.float32:
            converted["mask"] = mx.array(mask)
        else:
            converted["mask"] = to_mlx(mask, case.dtype)
    for name in ("alibi_slopes", "sinks"):
        if name in modifiers:
            converted[name] = mx.array(modifiers[name])
    return converted


@pytest.mark.parametrize("case", _cases.MODIFIER_CASES, ids=lambda case: case.id)
def test_modifiers_forward_and_grad_match_reference(case):
    """Masks (boolean, key padding, additive in q's dtype or float32), softcap, ALiBi and
    sinks through mfa_mlx.attention and mx.grad, dsinks among the gradients, against the
    float64 reference with the tolerances of check_forward/check_backward."""
    skip_unless_default_has(case.features)
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    dout = case.output_gradient(rng)
    arrays = [to_mlx(x, case.dtype) for x in (q, k, v)]
    options = {**case.options, **_mlx_modifiers(case, modifiers)}
    out, lse = mfa_mlx.attention(*arrays, **options, return_lse=True)
    check_forward(case, to_numpy(out), to_numpy(lse), q, k, v, modifiers)

    cotangent = to_mlx(dout, case.dtype)
    sinks = options.pop("sinks", None)

    def loss(q, k, v, *sinks):
        result = mfa_mlx.attention(q, k, v, **options, sinks=sinks[0] if sinks else None)
        return (result * cotangent).astype(mx.float32).sum()

    primals = (*arrays, sinks) if case.sinks else tuple(arrays)
    gradients = mx.grad(loss, argnums=tuple(range(len(primals))))(*primals)
    check_backward(case, [to_numpy(g) for g in gradients], dout, q, k, v, to_numpy(out),
                   modifiers)  # fmt: skip


# Masks as MLX takes them: boolean [Nq, Nk] (broadcast over batch and heads), additive
# float32 [B, 1, Nq, Nk]; with and without sinks.
MASK_KINDS = ["bool-2d", "additive-b1"]


@pytest.mark.parametrize("with_sinks", [False, True], ids=["no-sinks", "sinks"])
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
def test_sdpa_masks_and_sinks_match_mlx(mask_kind, with_sinks):
    """mx.fast.scaled_dot_product_attention(mask=array, sinks=...) on MLX's CPU device (its
    unfused composition, differentiated by MLX itself) is an independent implementation: the
    forward and the gradients of q, k, v and the sinks. Every row keeps at least one key
    (MLX's result for a row that sees none is not mfa's zeros). float32 values of O(1) from
    sums of at most 19 terms of width 16: 2e-5 bounds either side's rounding (some hundred
    units of 2^-24), forward and backward; dsinks sums 2 x 9 rows, hence its 1e-4."""
    mx.random.seed(11)
    q = mx.random.normal((2, 4, 9, 16))
    k, v = mx.random.normal((2, 2, 19, 16)), mx.random.normal((2, 2, 19, 16))
    rng = np.random.default_rng(5)
    if mask_kind == "bool-2d":
        keep = rng.random((9, 19)) < 0.6
        keep[:, 0] = True
        mask = mx.array(keep)
    else:
        mask = mx.array(rng.standard_normal((2, 1, 9, 19)).astype(np.float32))
    sinks = mx.array(rng.normal(1.0, 1.0, 4).astype(np.float32)) if with_sinks else None
    scale = 0.3
    out = mfa_mlx.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask,
                                                    sinks=sinks)  # fmt: skip
    np.testing.assert_allclose(np.array(out), np.array(expected), atol=2e-5, rtol=2e-5)

    def loss(function):
        def value(q, k, v, *sinks):
            result = function(q, k, v, scale=scale, mask=mask, sinks=sinks[0] if sinks else None)
            return (result * mx.cos(result)).sum()

        return value

    primals = (q, k, v, sinks) if with_sinks else (q, k, v)
    argnums = tuple(range(len(primals)))
    ours = mx.grad(loss(mfa_mlx.scaled_dot_product_attention), argnums=argnums)(*primals)
    theirs = mx.grad(loss(mx.fast.scaled_dot_product_attention), argnums=argnums)(*primals)
    for name, mine, wanted in zip(("dq", "dk", "dv", "dsinks"), ours, theirs):
        tolerance = 1e-4 if name == "dsinks" else 2e-5
        np.testing.assert_allclose(np.array(mine), np.array(wanted), atol=tolerance,
                                   rtol=tolerance, err_msg=name)  # fmt: skip


def test_sinks_of_half_precision_are_cast_and_differentiated():
    """MLX takes sinks of q's dtype; mfa reads float32, and the cast is part of the graph: the
    gradient comes back in the sinks' dtype and equals the float32 call's."""
    mx.random.seed(2)
    q = mx.random.normal((1, 2, 5, 8)).astype(mx.float16)
    sinks16 = mx.array([0.5, -1.0]).astype(mx.float16)

    def loss(sinks):
        return (
            mfa_mlx.scaled_dot_product_attention(q, q, q, scale=0.35, sinks=sinks)
            .astype(mx.float32)
            .sum()
        )

    gradient16 = mx.grad(loss)(sinks16)
    gradient32 = mx.grad(loss)(sinks16.astype(mx.float32))
    assert gradient16.dtype == mx.float16
    np.testing.assert_allclose(np.array(gradient16.astype(mx.float32)), np.array(gradient32),
                               rtol=1e-3)  # fmt: skip


def test_gpu_streams_need_the_device_buffer_path():
    q = mx.random.normal((1, 2, 5, 8))
    with pytest.raises(NotImplementedError, match="Apple GPU need the metal backend's device"):
        mfa_mlx.scaled_dot_product_attention(q, q, q, scale=1.0, stream=mx.gpu)
    assert mfa_mlx.attention(q, q, q, stream=mx.cpu).shape == (1, 2, 5, 8)


def test_dtypes_must_match():
    q = mx.random.normal((1, 2, 5, 8))
    with pytest.raises(TypeError, match="^k.dtype must be float32, got float16"):
        mfa_mlx.attention(q, q.astype(mx.float16), q)


def test_the_module_docstring_example_runs():
    import doctest

    result = doctest.testmod(mfa_mlx)
    assert result.attempted and not result.failed


def test_results_are_the_arrays_mfa_wrote(monkeypatch):
    """No copy on the way out: what the custom function, stop_gradient and mx.grad return
    share the buffers libmfa wrote."""
    written = record_addresses(monkeypatch)
    q = mx.random.normal((1, 2, 5, 8))
    out = mfa_mlx.scaled_dot_product_attention(q, q, q, scale=0.3)
    assert _arrays.read_array("out", out).address == written[-1][3]
    out, lse = mfa_mlx.attention(q, q, q, return_lse=True)
    assert [_arrays.read_array("x", x).address for x in (out, lse)] == written[-1][3:5]
    k, v = mx.random.normal((1, 1, 7, 8)), mx.random.normal((1, 1, 7, 8))
    loss = lambda q, k, v: mfa_mlx.attention(q, k, v).sum()  # noqa: E731
    gradients = mx.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert [_arrays.read_array("x", x).address for x in gradients] == written[-1][6:9]


def test_result_sources_sit_half_a_page_into_a_page():
    """MLX results are copied from a shared source (MLX makes no array of host memory in
    place). The C library and MLX's allocator put large blocks 16 and 24 bytes past a page
    boundary, and a copy between addresses that close modulo the page size is some ten times
    slower (4K aliasing): every source starts half a page in, whatever its size."""
    sources = [
        ((1, 8, 128, 64), np.dtype(np.float32)),
        ((3, 5, 7), _arrays.BOOL),
        ((2, 40), _arrays.bfloat16()),  # no buffer format: the array itself, not a memoryview
    ]
    for shape, dtype in sources:
        source = np.asarray(_arrays._uninitialized(shape, dtype))
        assert source.shape == shape and source.dtype == dtype
        assert source.ctypes.data % 4096 == 2048
