"""mfa_native.flash_attn: flash-attn 2.8's functions on torch tensors, forward and gradients
against the float64 reference and PyTorch's SDPA (with flash-attn's bottom-right masks spelled
out), the packed variants, return_attn_probs, what is refused, and a model trained through
flash_attn_func."""

import itertools

import mfa_native
import numpy as np
import pytest
import reference
from _backends import (
    Case,
    adapter_backends,
    allowed_error,
    assert_close,
    check_backward,
    check_forward,
    run_or_skip,
)
from _errors import raises

torch = pytest.importorskip("torch")
flash = pytest.importorskip("mfa_native.flash_attn")
from _torch_support import (  # noqa: E402  (needs torch, which may be absent)
    alibi_bias,
    explicit_attention,
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


def test_what_mfa_cannot_do_is_refused():
    q = torch.randn(1, 5, 2, 8)
    with raises(NotImplementedError, "dropout_p=0.1 is not supported"):
        flash_attn_func(q, q, q, dropout_p=0.1)
    for function, args in (
        (flash.flash_attn_qkvpacked_func, (torch.stack([q, q, q], 2),)),
        (flash.flash_attn_kvpacked_func, (q, torch.stack([q, q], 2))),
    ):
        with raises(NotImplementedError, "dropout_p=0.5 is not supported"):
            function(*args, dropout_p=0.5)
    packed = q[0]
    offsets = torch.tensor([0, 5], dtype=torch.int32)
    with raises(NotImplementedError, "flash_attn_varlen_func(block_table=...) is not supported"):
        flash.flash_attn_varlen_func(packed, packed, packed, offsets, offsets, 5, 5,
                                     block_table=torch.zeros(1, 1, dtype=torch.int32))  # fmt: skip
    cache = torch.zeros(1, 16, 2, 8)
    for name in ("rotary_cos", "rotary_sin", "cache_leftpad"):
        with raises(NotImplementedError, f"flash_attn_with_kvcache({name}=...) is not supported"):
            flash.flash_attn_with_kvcache(q, cache, cache, **{name: torch.zeros(1)})
    with raises(NotImplementedError, "a dense KV cache of seqlen_cache = 12 keys"):
        flash.flash_attn_with_kvcache(q, cache[:, :12], cache[:, :12], cache_seqlens=3)
    with raises(NotImplementedError, "a paged KV cache with page_block_size = 264"):
        pages = torch.zeros(2, 264, 2, 8)
        flash.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=3,
                                      block_table=torch.zeros(1, 1, dtype=torch.int32))  # fmt: skip
    with raises(ValueError, "k and v are given without cache_seqlens"):
        flash.flash_attn_with_kvcache(q, cache, cache, k=q[:, :1], v=q[:, :1])
    with raises(ValueError, "cache_batch_idx must hold 1 entries in [0, 1), got [3]"):
        flash.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3,
                                      cache_batch_idx=torch.tensor([3]))  # fmt: skip
    # What flash-attn itself treats as off, and the deterministic flag, are accepted.
    expected = flash_attn_func(q, q, q)
    for options in ({"softcap": -1.0}, {"softcap": 0.0}, {"deterministic": True}, {"dropout_p": 0}):
        torch.testing.assert_close(flash_attn_func(q, q, q, **options), expected, rtol=0, atol=0)


def float64_bound(dtype, expected, magnitude, reduction, score_size):
    """Twice allowed_error of the float64 reference: mfa's float32 path and the independent
    implementation (float64 here, exact in comparison) each within once of it."""
    return 2 * allowed_error(dtype, expected, magnitude, reduction, score_size)


@pytest.mark.parametrize("backend", adapter_backends())
@pytest.mark.parametrize("slopes_shape", [(4,), (2, 4)])
def test_softcap_and_alibi_match_an_explicit_float64_attention(backend, slopes_shape):
    """flash_attn_func(softcap=, alibi_slopes=) against an explicit attention written in torch
    (float64): softcap * tanh(s / softcap) right after scaling, then flash-attn's bottom-right
    ALiBi bias, with causal bottom-right and Nq < Nk; forward and gradients."""
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(2, 9, 4, 16, generator=generator)
    k, v = (torch.randn(2, 21, 2, 16, generator=generator) for _ in "kv")
    slopes = torch.rand(slopes_shape, generator=generator) * 0.5
    dout = torch.randn(2, 9, 4, 16, generator=generator)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = run_or_skip(
        backend, "forward", {"softcap", "alibi"},
        lambda: flash_attn_func(*leaves, causal=True, softcap=2.5, alibi_slopes=slopes),
    )  # fmt: skip
    twins = [to_layout(x.double(), "bshd").clone().requires_grad_() for x in (q, k, v)]
    mask = visible(9, 21, causal=True, bottom_right=True)
    expected = explicit_attention(
        *twins, mask, softcap=2.5, bias=alibi_bias(slopes.double(), 9, 21)
    )
    arrays = [to_numpy(x) for x in twins]
    options = {"causal": True, "softcap": 2.5, "alibi_slopes": slopes.numpy()}
    magnitude, score_size = reference.forward_magnitudes(*arrays, **options)
    bound = float64_bound("f32", to_numpy(expected), magnitude, 16 + 21, score_size.max())
    assert_close("out", to_numpy(to_layout(out, "bshd")), to_numpy(expected), bound)
    run_or_skip(backend, "backward", {"softcap", "alibi"}, lambda: out.backward(dout))
    expected.backward(to_layout(dout.double(), "bshd"))
    magnitudes = reference.gradient_magnitudes(to_numpy(to_layout(dout, "bshd")), *arrays,
                                               out=to_numpy(expected), **options)  # fmt: skip
    for name, leaf, twin, size in zip(("dq", "dk", "dv"), leaves, twins, magnitudes):
        wanted = to_numpy(twin.grad)
        bound = float64_bound("f32", wanted, size, 16 + 16 + 21 + 18, score_size.max())
        assert_close(name, to_numpy(to_layout(leaf.grad, "bshd")), wanted, bound)


@pytest.mark.parametrize("backend", adapter_backends())
def test_alibi_matches_pytorch_sdpa_with_the_bias_as_attn_mask(backend):
    """ALiBi is an additive mask: PyTorch's SDPA given -slope |i + Nk - Nq - j| (and -inf
    outside flash-attn's bottom-right window) is an independent implementation. float32 O(1)
    values summed over at most 17 keys of width 16: 1e-5 bounds the rounding of either."""
    generator = torch.Generator().manual_seed(8)
    q = torch.randn(2, 13, 4, 16, generator=generator)
    k, v = (torch.randn(2, 17, 4, 16, generator=generator) for _ in "kv")
    slopes = torch.rand(2, 4, generator=generator)
    out = run_or_skip(
        backend, "forward", {"alibi"},
        lambda: flash_attn_func(q, k, v, window_size=(6, 2), alibi_slopes=slopes),
    )  # fmt: skip
    bias = alibi_bias(slopes, 13, 17).masked_fill(
        ~visible(13, 17, causal=False, bottom_right=True, window=(6, 2)), float("-inf")
    )
    expected = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                              attn_mask=bias).transpose(1, 2)  # fmt: skip
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# Sequences of 0 and 1 queries or keys among longer ones, causal bottom-right per sequence.
VARLEN_LENGTHS = [(3, 5), (0, 2), (1, 0), (6, 6), (1, 9)]


@pytest.mark.parametrize("backend", adapter_backends())
def test_flash_attn_varlen_func_matches_pytorch_sdpa_per_sequence(backend):
    """Each sequence against PyTorch's SDPA on its own rows and keys with flash-attn's
    bottom-right causal mask (rows that see no key compared with 0, which flash-attn gives and
    PyTorch does not), forward and gradients, with GQA. float32 O(1) values over at most 9 keys
    of width 16: 1e-5 bounds the rounding of either."""
    generator = torch.Generator().manual_seed(9)
    cu_q = torch.tensor([0, *itertools.accumulate(n for n, _ in VARLEN_LENGTHS)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(n for _, n in VARLEN_LENGTHS)], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), 4, 16, generator=generator, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 2, 16, generator=generator, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 2, 8, generator=generator, requires_grad=True)
    out, lse, _ = run_or_skip(
        backend, "forward", {"varlen"},
        lambda: flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 9, causal=True,
                                             return_attn_probs=True),
    )  # fmt: skip
    assert out.shape == (int(cu_q[-1]), 4, 8) and lse.shape == (4, int(cu_q[-1]))
    dout = torch.randn(out.shape, generator=generator)
    run_or_skip(backend, "backward", {"varlen"}, lambda: out.backward(dout))
    for b, (nq, nk) in enumerate(VARLEN_LENGTHS):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if nq == 0:
            continue
        if nk == 0:
            assert torch.all(out[rows] == 0) and torch.all(q.grad[rows] == 0)
            assert torch.all(torch.isneginf(lse[:, rows]))
            continue
        leaves = [
            x[part].detach().clone().requires_grad_()
            for x, part in ((q, rows), (k, keys), (v, keys))
        ]
        mask = visible(nq, nk, causal=True, bottom_right=True)
        seen = mask.any(dim=1)
        expected = F.scaled_dot_product_attention(
            *(x.transpose(0, 1)[None] for x in leaves), attn_mask=mask, enable_gqa=True
        )[0].transpose(0, 1)
        torch.testing.assert_close(out[rows][seen], expected[seen], atol=1e-5, rtol=1e-5)
        expected[seen].backward(dout[rows][seen])
        for mine, theirs in zip((q.grad[rows], k.grad[keys], v.grad[keys]), leaves):
            torch.testing.assert_close(mine, theirs.grad, atol=1e-5, rtol=1e-5)


def _paged(cache, lengths, page, order):
    """A dense [B, N, H, D] cache's first lengths[b] rows of each entry in pages of `page` rows
    taken in `order`: (pages [num_pages, page, H, D], block_table int32 [B, max_pages])."""
    batch, length, heads, dim = cache.shape
    per_entry = -(-length // page)
    pages = torch.full((len(order), page, heads, dim), float("nan"))
    table = torch.zeros(batch, per_entry, dtype=torch.int32)
    for b in range(batch):
        for p in range(per_entry):
            table[b, p] = order[b * per_entry + p]
            rows = cache[b, p * page : (p + 1) * page]
            pages[table[b, p], : rows.shape[0]] = rows
    return pages, table


@pytest.mark.parametrize(
    "paging", ["dense", "dense, cache_batch_idx", "pages of 16", "pages of 512"]
)
@pytest.mark.parametrize("backend", adapter_backends())
def test_flash_attn_with_kvcache_appends_and_matches_pytorch_sdpa(backend, paging):
    """Decoding two new tokens per sequence (cache_seqlens differing per sequence) against
    PyTorch's SDPA over each sequence's keys with flash-attn's bottom-right causal mask; the
    new rows are written into the cache in place and nothing else changes. float32 O(1)
    values over at most 42 keys of width 16: 1e-5 bounds the rounding of either."""
    generator = torch.Generator().manual_seed(10)
    lengths, new = [40, 7, 0], 2
    capacity = 48 if paging != "pages of 512" else 512
    keys = torch.randn(3, capacity, 2, 16, generator=generator)
    values = torch.randn(3, capacity, 2, 16, generator=generator)
    q = torch.randn(3, new, 4, 16, generator=generator)
    k_new, v_new = (torch.randn(3, new, 2, 16, generator=generator) for _ in "kv")
    options = {"cache_seqlens": torch.tensor(lengths, dtype=torch.int32), "causal": True}
    entries = [0, 1, 2]
    if paging == "dense":
        k_cache, v_cache = keys.clone(), values.clone()
    elif paging == "dense, cache_batch_idx":
        # Sequence b reads cache entry entries[b] of four; entry 1 belongs to no sequence.
        entries = [2, 0, 3]
        k_cache, v_cache = (torch.randn(4, capacity, 2, 16, generator=generator) for _ in "kv")
        for b, entry in enumerate(entries):
            k_cache[entry], v_cache[entry] = keys[b], values[b]
        options["cache_batch_idx"] = torch.tensor(entries, dtype=torch.int32)
    else:
        page = 16 if paging == "pages of 16" else 512
        order = torch.randperm(3 * (capacity // page) + 1, generator=generator)
        (k_cache, table), (v_cache, _) = (_paged(x, lengths, page, order) for x in (keys, values))
        options["block_table"] = table
    k_before = k_cache.clone()
    out, lse = run_or_skip(
        backend, "forward", {"paged_kv"},
        lambda: flash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                              return_softmax_lse=True, **options),
    )  # fmt: skip
    assert out.shape == (3, new, 4, 16) and lse.shape == (3, 4, new)
    for b, n in enumerate(lengths):
        every_key = torch.cat([keys[b, :n], k_new[b]])
        every_value = torch.cat([values[b, :n], v_new[b]])
        expected = F.scaled_dot_product_attention(
            q[b].transpose(0, 1)[None], every_key.transpose(0, 1)[None],
            every_value.transpose(0, 1)[None],
            attn_mask=visible(new, n + new, causal=True, bottom_right=True), enable_gqa=True,
        )[0].transpose(0, 1)  # fmt: skip
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=1e-5)
    # The cache now holds the new rows after each sequence's old ones; nothing else changed.
    written = k_before.clone()
    for b, n in enumerate(lengths):
        for t in range(new):
            j = n + t
            if paging.startswith("dense"):
                written[entries[b], j] = k_new[b, t]
            else:
                page = k_cache.shape[1]
                written[options["block_table"][b, j // page], j % page] = k_new[b, t]
    torch.testing.assert_close(k_cache, written, rtol=0, atol=0, equal_nan=True)


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
