"""mfa_native.flash_attn: flash-attn 2.8's functions on torch tensors, forward and gradients
against the float64 reference and PyTorch's SDPA (with flash-attn's bottom-right masks spelled
out), the packed variants, return_attn_probs, what is refused, and a model trained through
flash_attn_func."""

import mfa_native
import numpy as np
import pytest
import reference
from _backends import Case, check_backward, check_forward

torch = pytest.importorskip("torch")
flash = pytest.importorskip("mfa_native.flash_attn")
from _torch_support import (  # noqa: E402  (needs torch, which may be absent)
    to_layout,
    to_numpy,
    to_torch,
    train_alongside_reference,
    visible,
)

F = torch.nn.functional
flash_attn_func = flash.flash_attn_func

# (case, flash-attn's window_size for it): bottom-right causal with Nq < Nk and Nq > Nk (rows
# that see no key), windows alone and with causal, GQA and MQA, every dtype, Dv != D.
CASES = [
    (Case(9, 23, 16, 16, batch=2, query_heads=4, kv_heads=2, causal=True), (-1, -1)),
    (Case(23, 9, 32, 16, query_heads=2, kv_heads=1, causal=True, dtype="bf16"), (-1, -1)),
    (Case(17, 17, 64, 64, query_heads=4, kv_heads=4, window=(4, 2), dtype="f16"), (4, 2)),
    (Case(1, 65, 64, 64, query_heads=8, kv_heads=1, causal=True, window=(16, 0)), (16, -1)),
    (Case(33, 40, 24, 8, query_heads=3, kv_heads=1, window=(-1, 0), dtype="bf16"), (-5, 0)),
]


def bshd(array, requires_grad=True):
    """A [B, H, N, D] numpy array as a contiguous [B, N, H, D] leaf tensor."""
    return to_layout(to_torch(array), "bshd").contiguous().requires_grad_(requires_grad)


@pytest.mark.parametrize("case, window_size", CASES, ids=[c.id for c, _ in CASES])
def test_flash_attn_func_matches_reference(case, window_size):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    inputs = [bshd(x) for x in (q, k, v)]
    out, lse, s_dmask = flash_attn_func(
        *inputs,
        softmax_scale=case.scale,
        causal=case.causal,
        window_size=window_size,
        return_attn_probs=True,
    )
    assert out.shape == (case.batch, case.num_queries, case.query_heads, case.value_dim)
    assert lse.shape == (case.batch, case.query_heads, case.num_queries)
    assert lse.dtype == torch.float32 and not lse.requires_grad
    assert s_dmask.shape == (0,)  # flash-attn's placeholder without dropout
    out_bhsd = to_numpy(to_layout(out, "bshd"))
    check_forward(case, out_bhsd, to_numpy(lse), q, k, v)
    out.backward(bshd(dout, requires_grad=False))
    gradients = [to_numpy(to_layout(x.grad, "bshd")) for x in inputs]
    check_backward(case, gradients, dout, q, k, v, out_bhsd)


@pytest.mark.parametrize("causal, window_size", [(True, (-1, -1)), (False, (3, 1)), (True, (2, 5))])
def test_flash_attn_func_matches_pytorch_sdpa_with_flash_attns_mask(causal, window_size):
    """PyTorch's SDPA with flash-attn's bottom-right visibility given as a boolean mask: an
    independent implementation. Nq <= Nk, so that no row is empty (PyTorch gives NaN there).
    Both are float32 results of O(1) size from sums of at most 21 terms of width 16: 1e-5
    bounds the rounding of either (a few dozen units of 2^-24)."""
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 13, 4, 16, generator=generator, requires_grad=True)
    k = torch.randn(2, 21, 2, 16, generator=generator, requires_grad=True)
    v = torch.randn(2, 21, 2, 16, generator=generator, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    mask = visible(13, 21, causal=causal, bottom_right=True, window=window_size)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    expected = F.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in leaves), attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    dout = torch.randn(out.shape, generator=generator)
    out.backward(dout)
    expected.backward(dout)
    for mine, theirs in zip((q, k, v), leaves):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)


def test_packed_functions_read_views_and_return_packed_gradients():
    """float32 against float64, on O(1) values summed over at most 11 keys of width 16 (and 2
    heads per group): 1e-5 is some hundred units of 2^-24, while reading a wrong slice of the
    packed tensor is off by O(1)."""
    case = Case(11, 11, 16, 16, query_heads=4, kv_heads=2, causal=True)
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    expected, _ = reference.attention_forward(q, k, v, causal=True)
    expected_gradients = reference.attention_backward(dout, q, k, v, causal=True)

    kv = torch.stack([bshd(k, False), bshd(v, False)], dim=2).requires_grad_()
    query = bshd(q)
    out = flash.flash_attn_kvpacked_func(query, kv, causal=True)
    out.backward(bshd(dout, False))
    np.testing.assert_allclose(to_numpy(to_layout(out, "bshd")), expected, atol=1e-5)
    for gradient, wanted in zip(
        (query.grad, kv.grad[:, :, 0], kv.grad[:, :, 1]), expected_gradients
    ):
        np.testing.assert_allclose(to_numpy(to_layout(gradient, "bshd")), wanted, atol=1e-5)

    # qkvpacked needs as many key/value heads as query heads: the first two query heads.
    q2, dout2 = q[:, :2], dout[:, :2]
    expected2, expected_lse2 = reference.attention_forward(q2, k, v, causal=True)
    gradients2 = reference.attention_backward(dout2, q2, k, v, causal=True)
    qkv = torch.stack([bshd(x, False) for x in (q2, k, v)], dim=2).requires_grad_()
    out, lse, _ = flash.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    out.backward(bshd(dout2, False))
    np.testing.assert_allclose(to_numpy(to_layout(out, "bshd")), expected2, atol=1e-5)
    np.testing.assert_allclose(to_numpy(lse), expected_lse2, atol=1e-5)
    for index, wanted in enumerate(gradients2):
        np.testing.assert_allclose(
            to_numpy(to_layout(qkv.grad[:, :, index], "bshd")), wanted, atol=1e-5
        )


def test_packed_shapes_are_checked():
    with pytest.raises(ValueError, match=r"^qkv must have shape \(batch, seqlen, 3, nheads"):
        flash.flash_attn_qkvpacked_func(torch.zeros(1, 4, 2, 2, 8))
    with pytest.raises(ValueError, match=r"^kv must have shape \(batch, seqlen_k, 2, nheads_k"):
        flash.flash_attn_kvpacked_func(torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 3, 2, 8))


def test_features_that_have_not_landed_are_refused():
    q = torch.randn(1, 5, 2, 8)
    with pytest.raises(NotImplementedError, match="^dropout_p=0.1 is not supported"):
        flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="^softcap=30.0 is not supported"):
        flash_attn_func(q, q, q, softcap=30.0)
    with pytest.raises(NotImplementedError, match="^alibi_slopes is not supported"):
        flash_attn_func(q, q, q, alibi_slopes=torch.ones(2))
    for function, args in (
        (flash.flash_attn_qkvpacked_func, (torch.stack([q, q, q], 2),)),
        (flash.flash_attn_kvpacked_func, (q, torch.stack([q, q], 2))),
    ):
        with pytest.raises(NotImplementedError, match="softcap"):
            function(*args, softcap=1.0)
    # What flash-attn itself treats as off, and the deterministic flag, are accepted.
    expected = flash_attn_func(q, q, q)
    for options in ({"softcap": -1.0}, {"deterministic": True}, {"dropout_p": 0}):
        torch.testing.assert_close(flash_attn_func(q, q, q, **options), expected, rtol=0, atol=0)


def test_keyword_names_of_mfa_get_flash_attns():
    q = torch.randn(1, 5, 2, 8)
    with pytest.raises(TypeError, match="'scale': flash-attn's name for it is softmax_scale="):
        flash_attn_func(q, q, q, scale=0.5)
    with pytest.raises(TypeError, match="'window': flash-attn's name for it is window_size="):
        flash_attn_func(q, q, q, window=(1, 1))
    with pytest.raises(ValueError, match="^window_size must be a pair"):
        flash_attn_func(q, q, q, window_size=3)
    with pytest.raises(TypeError, match="^causal must be a bool"):
        flash_attn_func(q, q, q, causal=1)


def test_flash_attn_func_compiles_without_graph_breaks():
    q = torch.randn(1, 7, 2, 8, requires_grad=True)

    def loss(q):
        return flash_attn_func(q, q, q, causal=True, window_size=(3, 0)).square().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value = compiled(q)
    value.backward()
    gradient = q.grad.clone()
    q.grad = None
    expected = loss(q)
    expected.backward()
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(gradient, q.grad)


def _flash_attention(q, k, v):
    """The model's [B, H, N, D] tensors through flash_attn_func's [B, N, H, D] (views)."""
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    return out.transpose(1, 2)


def test_a_model_trains_through_flash_attn_func(monkeypatch):
    calls = []
    original = mfa_native._attention.attention_backward
    monkeypatch.setattr(
        mfa_native._attention,
        "attention_backward",
        lambda *args, **options: calls.append(options["layout"]) or original(*args, **options),
    )
    before, after = train_alongside_reference(_flash_attention)
    assert calls == ["bshd"] * 6, "mfa's backward ran once per layer and step, on [B, N, H, D]"
    assert after < before
