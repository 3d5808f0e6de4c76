"""mfa_native.torch: the custom operators (forward, backward through autograd, fake kernels,
torch.compile), scaled_dot_product_attention against PyTorch's own, routing
torch.nn.functional.scaled_dot_product_attention, and a small model trained through them; every
result against the float64 reference or an independent implementation."""

import time

import _cases
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
    skip_unless_default_has,
)
from _errors import raises
from mfa_native import _arrays

torch = pytest.importorskip("torch")
mfa_torch = pytest.importorskip("mfa_native.torch")
from _torch_support import (  # noqa: E402  (needs torch, which may be absent)
    explicit_attention,
    to_layout,
    to_numpy,
    to_torch,
    train_alongside_reference,
    visible,
)

F = torch.nn.functional
# The operators' leading options (mask, block mask, slopes, sinks, packed offsets and bounds)
# for a dense call without modifiers; the scalar options follow.
NO_TENSOR_OPTIONS = (None, None, None, None, None, None, 0, 0)

# Every dtype; GQA and MQA; causal both ways, windows, both; decoding; rows that see no key
# (bottom-right with Nq > Nk); Dv != D. Small, as the kernels themselves are tested elsewhere:
# what is tested here is the path through torch.
CASES = [
    Case(9, 13, 16, 8, query_heads=4, kv_heads=2, causal=True, window=(5, None)),
    Case(33, 17, 24, 24, batch=2, query_heads=2, kv_heads=1, causal=True,
         causal_alignment="top_left", dtype="f16"),
    Case(17, 40, 40, 24, batch=2, query_heads=4, kv_heads=4, window=(3, 3), dtype="bf16"),
    Case(64, 64, 64, 64, query_heads=8, kv_heads=2, causal=True, scale=0.3, dtype="bf16"),
    Case(1, 129, 64, 64, query_heads=4, kv_heads=1, dtype="f16"),
    Case(40, 7, 8, 3, query_heads=2, kv_heads=2, causal=True),
]  # fmt: skip


def arrange(array, layout, strided, requires_grad=True):
    """(leaf, view): a leaf tensor holding `array` ([B, H, N, D] numpy), and the view of it in
    `layout` that is handed to mfa. Strided: the leaf is in the other axis order with every
    other element of the last axis unused, so the view is transposed and has a step of 2."""
    values = to_torch(array)
    if not strided:
        leaf = to_layout(values, layout).contiguous().requires_grad_(requires_grad)
        return leaf, leaf
    other = "bshd" if layout == "bhsd" else "bhsd"
    inner = to_layout(values, other)
    leaf = torch.zeros((*inner.shape[:-1], 2 * inner.shape[-1]), dtype=values.dtype)
    leaf[..., ::2] = inner
    leaf.requires_grad_(requires_grad)
    view = leaf[..., ::2].transpose(1, 2)
    assert not view.is_contiguous()
    return leaf, view


def gradient_of(leaf, layout, strided):
    """The gradient of the [B, H, N, D] values from the leaf's, undoing arrange()."""
    if not strided:
        return to_numpy(to_layout(leaf.grad, layout))
    other = "bshd" if layout == "bhsd" else "bhsd"
    assert torch.all(leaf.grad[..., 1::2] == 0), "the unused elements got a gradient"
    return to_numpy(to_layout(leaf.grad[..., ::2], other))


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_operator_forward_and_gradients_match_reference(case, layout, strided):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    leaves, views = zip(*(arrange(x, layout, strided) for x in (q, k, v)))
    out, lse = mfa_torch.attention(*views, **case.options, layout=layout, return_lse=True)
    assert out.dtype == views[0].dtype and lse.dtype == torch.float32
    assert not lse.requires_grad  # marked non-differentiable
    out_bhsd = to_numpy(to_layout(out, layout))
    check_forward(case, out_bhsd, to_numpy(lse), q, k, v)
    out.backward(to_layout(to_torch(dout), layout))
    gradients = [gradient_of(leaf, layout, strided) for leaf in leaves]
    check_backward(case, gradients, dout, q, k, v, out_bhsd)


def torch_modifiers(modifiers):
    """A case's numpy modifiers as torch tensors of the same values and dtypes (a stride-0
    broadcast mask stays a stride-0 view, as torch.from_numpy keeps strides)."""
    converted = dict(modifiers)
    for name in ("mask", "alibi_slopes", "sinks"):
        value = modifiers.get(name)
        if value is None:
            continue
        if value.dtype in (np.bool_, np.float32):
            converted[name] = torch.from_numpy(value)
        else:
            converted[name] = to_torch(value)
    return converted


# A key-padding mask is a read-only stride-0 numpy view; mfa never writes masks.
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")
@pytest.mark.parametrize("case", _cases.MODIFIER_CASES, ids=lambda case: case.id)
def test_modifiers_through_autograd_match_reference(case):
    """Masks of four kinds, softcap, ALiBi and sinks through mfa_torch.attention and
    loss.backward(), sinks a leaf whose .grad is mfa's dsinks, against the float64 reference
    with check_forward/check_backward's tolerances."""
    skip_unless_default_has(case.features)
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    dout = case.output_gradient(rng)
    leaves = [to_torch(x).requires_grad_() for x in (q, k, v)]
    options = torch_modifiers(modifiers)
    if case.sinks:
        options["sinks"] = options["sinks"].clone().requires_grad_()
    out, lse = mfa_torch.attention(*leaves, **case.options, **options, return_lse=True)
    check_forward(case, to_numpy(out), to_numpy(lse), q, k, v, modifiers)
    out.backward(to_torch(dout))
    gradients = [to_numpy(x.grad) for x in leaves]
    if case.sinks:
        gradients.append(to_numpy(options["sinks"].grad))
    check_backward(case, gradients, dout, q, k, v, to_numpy(out), modifiers)


# Masks of the packed cases are numpy views as the ones above.
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")
@pytest.mark.parametrize("packed", _cases.PACKED_CASES, ids=lambda packed: packed.id)
def test_packed_sequences_through_autograd_match_reference(packed):
    """mfa_torch.attention_varlen over sequences of length 0 and 1 with modifiers, forward and
    loss.backward() (sinks a leaf), each sequence against the float64 reference with
    test_varlen's tolerances; dsinks, one float32 sum over every sequence's rows, likewise."""
    from test_varlen import bhsd, call_args, packed_inputs, sequences

    skip_unless_default_has(packed.features)
    case = packed.case
    q, k, v, dout, modifiers = packed_inputs(packed, case.rng())
    leaves = [to_torch(x).requires_grad_() for x in (q, k, v)]
    options = torch_modifiers(modifiers)
    if case.sinks:
        options["sinks"] = options["sinks"].clone().requires_grad_()
    offsets = [torch.from_numpy(x) for x in call_args(packed, q, k, v)[3:5]]
    out, lse = mfa_torch.attention_varlen(*leaves, *offsets, case.num_queries, case.num_keys,
                                          **case.options, **options, return_lse=True)  # fmt: skip
    out.backward(to_torch(dout))
    q4, k4, v4, dout4, out4 = (bhsd(x) for x in (q, k, v, dout, to_numpy(out)))
    dq, dk, dv = (bhsd(to_numpy(x.grad)) for x in leaves)
    lse = to_numpy(lse)
    dsinks_magnitude = np.zeros(case.query_heads)
    for rows, keys, alone, sequence in sequences(packed, modifiers):
        if rows.stop > rows.start:
            check_forward(alone, out4[:, :, rows], lse[None, :, rows], q4[:, :, rows],
                          k4[:, :, keys], v4[:, :, keys], sequence)  # fmt: skip
        parts = [x[:, :, rows] for x in (dout4, q4)] + [x[:, :, keys] for x in (k4, v4)]
        check_backward(alone, [dq[:, :, rows], dk[:, :, keys], dv[:, :, keys]], *parts,
                       out4[:, :, rows], sequence)  # fmt: skip
        if case.sinks:
            dsinks_magnitude += reference.gradient_magnitudes(
                *parts, out=out4[:, :, rows], return_dsinks=True, **case.options, **sequence
            )[3]
    if case.sinks:
        cu = (packed.cu_seqlens_q, packed.cu_seqlens_k)
        expected = reference.varlen_attention_backward(
            dout4, q4, k4, v4, *cu, out=out4, return_dsinks=True, **case.options, **modifiers
        )[3]
        size = np.max(np.abs(lse[np.isfinite(lse)]), initial=0.0)
        allowed = allowed_error("f32", expected, dsinks_magnitude, q.shape[0] + case.value_dim,
                                size)  # fmt: skip
        assert_close("dsinks", to_numpy(options["sinks"].grad), expected, allowed)


def test_backward_runs_with_the_forwards_options(monkeypatch):
    """The options reach the backward from the forward itself: recorded at the kernel."""
    calls = []
    original = mfa_native._attention.attention_backward

    def recording_backward(*args, **options):
        calls.append(options)
        return original(*args, **options)

    monkeypatch.setattr(mfa_native._attention, "attention_backward", recording_backward)
    q = torch.randn(1, 2, 6, 8, requires_grad=True)
    mask = torch.rand(6, 6) < 0.7
    slopes = torch.tensor([0.1, 0.2])
    sinks = torch.tensor([0.5, -0.5], requires_grad=True)
    out = mfa_torch.attention(
        q, q, q, causal=True, causal_alignment="top_left", window=(2, None), scale=0.7,
        mask=mask, softcap=3.0, alibi_slopes=slopes, sinks=sinks,
    )  # fmt: skip
    out.sum().backward()
    (options,) = calls
    assert options["causal"] is True and options["causal_alignment"] == "top_left"
    assert options["window"] == (2, -1) and options["scale"] == pytest.approx(0.7)
    assert options["softcap"] == 3.0 and options["return_dsinks"] is True
    for name, given in (("mask", mask), ("alibi_slopes", slopes), ("sinks", sinks)):
        assert options[name].data_ptr() == given.data_ptr(), name
    assert sinks.grad is not None and sinks.grad.shape == (2,)


def test_the_operator_called_directly_records_autograd_too():
    """torch.ops.mfa_native.attention_forward has its own registered autograd formula (the
    functions of mfa_native.torch bind the same formula through an autograd.Function): both
    give the same gradients, from the same kernels."""
    generator = torch.Generator().manual_seed(4)
    inputs = [torch.randn(1, 4, 6, 8, generator=generator) for _ in range(3)]
    gradients = []
    for function in (
        lambda q, k, v: torch.ops.mfa_native.attention_forward(
            q, k, v, *NO_TENSOR_OPTIONS, True, "top_left", 2, -1, 0.5, None, "bhsd", None
        )[0],
        lambda q, k, v: mfa_torch.attention(
            q, k, v, causal=True, causal_alignment="top_left", window=(2, None), scale=0.5
        ),
    ):
        leaves = [x.clone().requires_grad_() for x in inputs]
        function(*leaves).square().sum().backward()
        gradients.append([x.grad for x in leaves])
    for direct, through_the_module in zip(*gradients):
        torch.testing.assert_close(direct, through_the_module, rtol=0, atol=0)


def test_an_lse_returned_and_then_changed_in_place_is_refused_by_the_backward():
    """The backward reads the forward's lse. One returned to the caller is saved for autograd,
    which refuses a backward after it was changed in place (rather than use the changed
    values); one the caller never sees is only kept, as nothing else can change it."""
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    out, lse = mfa_torch.attention(q, q, q, causal=True, return_lse=True)
    lse.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    mfa_torch.attention(q, q, q, causal=True).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("create_graph", [False, True], ids=["backward", "create_graph"])
@pytest.mark.parametrize("case", CASES[:2], ids=[case.id for case in CASES[:2]])
def test_gradients_through_the_lse_the_forward_keeps(case, create_graph):
    """Without return_lse the forward keeps its lse to itself, outside autograd's saved
    tensors: the backward reads it by the kernel directly, and with create_graph=True through
    the operator; both against the float64 reference."""
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    leaves = [to_torch(x).requires_grad_() for x in (q, k, v)]
    out = mfa_torch.attention(*leaves, **case.options)
    gradients = torch.autograd.grad(out, leaves, to_torch(dout), create_graph=create_graph)
    check_backward(
        case, [to_numpy(g.detach()) for g in gradients], dout, q, k, v, to_numpy(out.detach())
    )


def test_double_backward_is_refused_clearly():
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    out = mfa_torch.attention(q, q, q, causal=True)
    (gradient,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward .* is not supported"):
        gradient.sum().backward()


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_gradcheck_in_float32():
    """torch.autograd.gradcheck compares the backward with central differences of the
    forward. Its defaults (eps 1e-6, atol 1e-5) are for float64: in float32 a difference over
    2 eps = 2e-6 is pure rounding noise (2^-24 / 1e-6 ~ 6%). With eps = 1e-2 the rounding part
    is ~ 2^-24 * |out| / eps ~ 1e-5 per output, the truncation part ~ eps^2 |f'''| ~ 1e-4;
    fast_mode projects both on random vectors over ~40 outputs (x ~6, as a random walk), so
    atol 5e-3 with rtol 1e-2 bounds them, while a wrong gradient is off by O(1)."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 4, generator=generator, requires_grad=True)
    k = torch.randn(1, 1, 7, 4, generator=generator, requires_grad=True)
    v = torch.randn(1, 1, 7, 3, generator=generator, requires_grad=True)

    def function(q, k, v):
        return mfa_torch.attention(q, k, v, causal=True, window=(3, None), scale=0.9)

    assert torch.autograd.gradcheck(
        function, (q, k, v), eps=1e-2, atol=5e-3, rtol=1e-2, fast_mode=True
    )


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_gradcheck_with_every_modifier_in_float32():
    """gradcheck of q, k, v and the sinks through an additive mask, softcap, ALiBi and sinks,
    with test_gradcheck_in_float32's step and tolerances (the same float32 argument: softcap
    and the bias keep the scores' size, the sinks a logit of O(1))."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 5, 4, generator=generator, requires_grad=True)
    k = torch.randn(1, 1, 7, 4, generator=generator, requires_grad=True)
    v = torch.randn(1, 1, 7, 3, generator=generator, requires_grad=True)
    sinks = torch.tensor([0.3, -0.4], requires_grad=True)
    mask = torch.randn(5, 7, generator=generator)
    mask[0, 3] = float("-inf")
    slopes = torch.tensor([0.2, 0.05])

    def function(q, k, v, sinks):
        return mfa_torch.attention(q, k, v, mask=mask, softcap=2.0, alibi_slopes=slopes,
                                   sinks=sinks, scale=0.9)  # fmt: skip

    assert torch.autograd.gradcheck(
        function, (q, k, v, sinks), eps=1e-2, atol=5e-3, rtol=1e-2, fast_mode=True
    )


def test_opcheck_of_both_operators():
    """torch.library.opcheck: schema, fake kernels, autograd registration and AOT dispatch
    agree with the real kernels, including the strides of results for a transposed q (the
    fake backward once reported q's strides for dq, where the kernel allocates it
    contiguous)."""
    q = torch.randn(2, 6, 4, 8).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 2, 9, 8, requires_grad=True)
    v = torch.randn(2, 2, 9, 5, requires_grad=True)
    options = (*NO_TENSOR_OPTIONS, True, "bottom_right", 3, -1, None, None, "bhsd", None)
    torch.library.opcheck(torch.ops.mfa_native.attention_forward.default, (q, k, v, *options))
    with torch.no_grad():
        out, lse = torch.ops.mfa_native.attention_forward(q, k, v, *options)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.mfa_native.attention_backward.default,
        (dout, q.detach(), k.detach(), v.detach(), out, lse, *options),
    )
    # With every modifier: the fake kernels' dsinks, the saved mask and slopes.
    mask = torch.rand(2, 1, 6, 9) < 0.8
    slopes, sinks = torch.rand(4), torch.randn(4, requires_grad=True)
    options = (mask, None, slopes, sinks, None, None, 0, 0, False, "bottom_right", -1, -1,
               0.4, 5.0, "bhsd", None)  # fmt: skip
    torch.library.opcheck(torch.ops.mfa_native.attention_forward.default, (q, k, v, *options))
    with torch.no_grad():
        out, lse = torch.ops.mfa_native.attention_forward(q, k, v, *options)
    options = (*options[:3], sinks.detach(), *options[4:])
    torch.library.opcheck(
        torch.ops.mfa_native.attention_backward.default,
        (dout, q.detach(), k.detach(), v.detach(), out, lse, *options),
    )


class AttentionBlock(torch.nn.Module):
    """Projections, mfa's SDPA with GQA and a causal mask, and an output projection."""

    def __init__(self, width=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.queries = torch.nn.Linear(width, width)
        self.keys_values = torch.nn.Linear(width, 2 * kv_heads * self.head_dim)
        self.output = torch.nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q = self.queries(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        kv = self.keys_values(x).view(batch, length, 2, self.kv_heads, self.head_dim)
        k, v = kv.unbind(2)
        mixed = mfa_torch.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return self.output(mixed.transpose(1, 2).reshape(batch, length, width))


def test_torch_compile_fullgraph_traces_the_operators():
    """Dynamo captures the block in one graph (fullgraph=True fails on any break) containing
    mfa's operator, and AOTAutograd traces forward and backward through the fake kernels and
    the autograd formula. backend="aot_eager" runs everything up to code generation: inductor's
    C++ compilation adds tens of seconds on CI's two cores and nothing mfa-specific."""
    torch.manual_seed(0)
    block = AttentionBlock()
    x = torch.randn(2, 11, 32, requires_grad=True)
    graphs = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return aot_eager(graph_module, example_inputs)

    torch._dynamo.reset()
    started = time.perf_counter()
    compiled = torch.compile(block, fullgraph=True, backend=recording_backend)
    out = compiled(x)
    out.square().sum().backward()
    compile_seconds = time.perf_counter() - started
    compiled_gradients = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]

    block.zero_grad()
    x.grad = None
    expected = block(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)  # the same kernels: equal up to float32 noise
    for compiled_gradient, parameter in zip(compiled_gradients, [*block.parameters(), x]):
        torch.testing.assert_close(compiled_gradient, parameter.grad)
    (graph,) = graphs
    targets = [str(node.target) for node in graph.graph.nodes]
    assert "mfa_native.attention_forward.default" in targets, targets
    print(f"torch.compile(fullgraph=True, backend='aot_eager'): {compile_seconds:.1f} s")


def test_torch_compile_fullgraph_traces_every_modifier():
    """A boolean mask, softcap, ALiBi and differentiable sinks through torch.compile
    (fullgraph, aot_eager as above): one graph, the fake kernels' shapes (dsinks among them),
    and the same results and gradients as eager mode (the same kernels: equal up to float32
    noise)."""
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(1, 4, 7, 8, generator=generator)
    k, v = (torch.randn(1, 2, 9, 8, generator=generator) for _ in "kv")
    mask = torch.rand(1, 1, 7, 9, generator=generator) < 0.8
    slopes = torch.tensor([0.1, 0.2, 0.3, 0.4])

    def function(q, k, v, sinks):
        return mfa_torch.attention(q, k, v, mask=mask, softcap=4.0, alibi_slopes=slopes,
                                   sinks=sinks, causal=True)  # fmt: skip

    results = []
    torch._dynamo.reset()
    for run in (torch.compile(function, fullgraph=True, backend="aot_eager"), function):
        sinks = torch.tensor([0.5, 0.0, -1.0, 1.0])
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        out = run(*leaves)
        out.square().sum().backward()
        results.append([out, *(x.grad for x in leaves)])
    for compiled, eager in zip(*results):
        torch.testing.assert_close(compiled, eager)


# ---- scaled_dot_product_attention against PyTorch's ------------------------------------------


SDPA_CASES = [
    # (query, key, value shapes, is_causal, scale, enable_gqa)
    ((2, 4, 9, 16), (2, 4, 13, 16), (2, 4, 13, 8), True, None, False),  # top-left, Nq < Nk
    ((1, 4, 13, 16), (1, 4, 9, 16), (1, 4, 9, 16), True, 0.5, False),  # top-left, Nq > Nk
    ((2, 6, 17, 32), (2, 2, 17, 32), (2, 2, 17, 32), True, None, True),  # GQA
    ((4, 11, 8), (1, 11, 8), (1, 11, 8), False, 2.0, True),  # rank 3, MQA
]


def _both_sdpa(query, key, value, is_causal, scale, enable_gqa):
    """(mfa's, PyTorch's) outputs and gradients for the same inputs and output gradient."""
    results = []
    for function in (mfa_torch.scaled_dot_product_attention, F.scaled_dot_product_attention):
        inputs = [x.detach().clone().requires_grad_() for x in (query, key, value)]
        out = function(*inputs, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        out.backward(torch.ones_like(out) + torch.arange(out.numel()).view(out.shape) % 3)
        results.append([out, *(x.grad for x in inputs)])
    return results


@pytest.mark.parametrize("shapes_and_options", SDPA_CASES)
def test_sdpa_matches_pytorch(shapes_and_options):
    """Both are float32 approximations of the exact attention, each within the rounding model
    of _backends.allowed_error of the float64 reference, so they agree within twice that."""
    *shapes, is_causal, scale, enable_gqa = shapes_and_options
    generator = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(shape, generator=generator) for shape in shapes)
    ours, theirs = _both_sdpa(query, key, value, is_causal, scale, enable_gqa)
    # The float64 reference of the rank-4 problem sizes the bound.
    batched = [to_numpy(x if x.dim() == 4 else x[None]) for x in (query, key, value)]
    case_options = dict(causal=is_causal, causal_alignment="top_left", scale=scale)
    expected, _ = reference.attention_forward(*batched, **case_options)
    magnitude, score_size = reference.forward_magnitudes(*batched, **case_options)
    bound = allowed_error(
        "f32", expected, magnitude, shapes[0][-1] + shapes[1][-2], score_size.max()
    )
    if query.dim() == 3:
        bound = bound[0]
    assert_close("out vs torch", to_numpy(ours[0]), to_numpy(theirs[0]), 2 * bound)
    for name, mine, torch_gradient in zip(("dq", "dk", "dv"), ours[1:], theirs[1:]):
        scale_of = max(to_numpy(torch_gradient).__abs__().max(), 1.0)
        # Gradients sum over up to 17 keys and 3 heads per group: 1e-5 of their size bounds
        # float32 rounding (a few dozen units of 2^-24) with margin.
        assert_close(f"{name} vs torch", to_numpy(mine), to_numpy(torch_gradient), 1e-5 * scale_of)


def sdpa_masks(generator, dtype):
    """(name, attn_mask) of PyTorch's kinds for query [2, 4, 9, .] and key [2, 2, 13, .]:
    boolean (True: the pair takes part) full or broadcast, float in q's dtype (added to the
    scores, -inf hiding pairs). Every row keeps key 0, as PyTorch gives NaN for a row its mask
    hides entirely (mfa gives 0)."""
    keep = torch.rand(2, 4, 9, 13, generator=generator) < 0.6
    keep[..., 0] = True
    additive = torch.randn(9, 13, generator=generator, dtype=torch.float64) * 2
    additive[torch.rand(9, 13, generator=generator) < 0.2] = float("-inf")
    additive[:, 0] = 0.0
    return [
        ("bool", keep),
        ("bool [2, 1, 1, 13]", keep[:, :1, :1]),
        ("float [9, 13]", additive.to(dtype)),
        ("float [1, 4, 9, 13]", additive.to(dtype).expand(1, 4, 9, 13)),
    ]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("index", range(4))
@pytest.mark.parametrize("backend", adapter_backends())
def test_sdpa_attn_mask_matches_pytorch(backend, index, dtype):
    """mfa's SDPA with each kind of attn_mask against PyTorch's (its math backend on CPU: an
    independent implementation), forward and gradients. Both round like the float32 path
    (bf16 inputs and outputs), so they agree within the sum of their bounds: 2 allowed_error
    of the reference, forward and backward."""
    generator = torch.Generator().manual_seed(5 + index)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    query = torch.randn(2, 4, 9, 16, generator=generator).to(torch_dtype)
    key, value = (torch.randn(2, 2, 13, 16, generator=generator).to(torch_dtype) for _ in "kv")
    name, mask = sdpa_masks(generator, torch_dtype)[index]
    dout = torch.randn(2, 4, 9, 16, generator=generator).to(torch_dtype)
    results = []
    for function in (mfa_torch.scaled_dot_product_attention, F.scaled_dot_product_attention):
        inputs = [x.clone().requires_grad_() for x in (query, key, value)]

        def call(function=function, inputs=inputs):
            return function(*inputs, attn_mask=mask, enable_gqa=True)

        out = run_or_skip(backend, "forward", {"mask"}, call) if not results else call()
        out.backward(dout)
        results.append([out, *(x.grad for x in inputs)])
    arrays = [to_numpy(x) for x in (query, key, value)]
    modifiers = {"mask": mask.numpy() if mask.dtype == torch.bool else to_numpy(mask)}
    expected, _ = reference.attention_forward(*arrays, **modifiers)
    magnitude, score_size = reference.forward_magnitudes(*arrays, **modifiers)
    bound = allowed_error(dtype, expected, magnitude, 16 + 13, score_size.max())
    assert_close(
        f"out ({name}) vs torch", to_numpy(results[0][0]), to_numpy(results[1][0]), 2 * bound
    )
    gradients = reference.attention_backward(to_numpy(dout), *arrays, **modifiers)
    magnitudes = reference.gradient_magnitudes(to_numpy(dout), *arrays, **modifiers)
    for position, label in enumerate(("dq", "dk", "dv"), start=1):
        bound = allowed_error(dtype, gradients[position - 1], magnitudes[position - 1],
                              16 + 16 + 13 + 9 * 2, score_size.max())  # fmt: skip
        assert_close(f"{label} ({name}) vs torch", to_numpy(results[0][position]),
                     to_numpy(results[1][position]), 2 * bound)  # fmt: skip


def test_sdpa_refuses_what_it_cannot_do():
    q = torch.randn(1, 2, 5, 8)
    keep = torch.ones(5, 5, dtype=bool)
    with raises(ValueError, "attn_mask and is_causal=True are given together"):
        mfa_torch.scaled_dot_product_attention(q, q, q, attn_mask=keep, is_causal=True)
    with raises(NotImplementedError, "attn_mask requires grad: mfa does not differentiate"):
        mfa_torch.scaled_dot_product_attention(
            q, q, q, attn_mask=torch.zeros(5, 5).requires_grad_()
        )
    with raises(TypeError, "mask requires grad, but mfa does not differentiate masks"):
        mfa_torch.attention(q, q, q, mask=torch.zeros(5, 5).requires_grad_())
    with pytest.raises(
        NotImplementedError, match="dropout_p=0.1\\) is not supported: mfa has no dropout"
    ):
        mfa_torch.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    k = torch.randn(1, 1, 5, 8)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        mfa_torch.scaled_dot_product_attention(q, k, k)
    with pytest.raises(TypeError, match="'causal': PyTorch's name for it is is_causal="):
        mfa_torch.scaled_dot_product_attention(q, q, q, causal=True)
    with pytest.raises(TypeError, match="'is_causal': .*causal="):
        mfa_torch.attention(q, q, q, is_causal=True)
    with pytest.raises(TypeError, match="^backend must be None or a backend name"):
        mfa_torch.attention(q, q, q, backend=mfa_native.Context("cpu"))


def test_mps_and_meta_tensors_are_not_copied():
    """Tensors outside CPU memory are refused by the kernel, never copied (MPS tensors would be
    sent to the metal backend's device-buffer path; that needs a Mac)."""
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="^q is on the 'meta' device"):
        mfa_native.attention(q.to("meta"), q, q)


def test_tensors_the_dispatcher_must_transform_do_not_take_the_direct_path():
    """Eager calls of plain tensors skip the dispatcher; a negative view (whose values are the
    negation of its memory's) must not: the dispatcher materialises it first."""
    q = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(3))
    expected = reference.attention_forward(-q.numpy(), q.numpy(), q.numpy())[0]
    # float32 softmax of 8 keys: a few ulps of values of order 1.
    assert_close("out", mfa_torch.attention(q._neg_view(), q, q).numpy(), expected, 1e-5)
    # Recording autograd likewise: the operator below autograd, then its gradient through the
    # view's negation (the reference's dq of -q, negated).
    leaf = q.clone().requires_grad_()
    out = mfa_torch.attention(leaf._neg_view(), q, q)
    assert_close("out", out.detach().numpy(), expected, 1e-5)
    dout = torch.ones_like(out)
    out.backward(dout)
    dq = reference.attention_backward(dout.numpy(), -q.numpy(), q.numpy(), q.numpy())[0]
    assert_close("dq", leaf.grad.numpy(), -dq, 1e-5)
    with pytest.raises(TypeError, match="^return_lse must be a bool, got int"):
        mfa_torch.attention(q, q, q, return_lse=1)


def test_an_mps_tensor_is_read_as_its_buffer_and_byte_offset():
    """What an MPS tensor gives libmfa (no MPS device here: its attributes stood in): the
    storage pointer, which is the id<MTLBuffer>, and storage_offset elements into it."""

    class Storage:
        def data_ptr(self):
            return 0x7000

    class MpsTensor:
        is_cpu, is_mps, requires_grad, dtype, shape = False, True, False, torch.float16, (2, 3)

        def untyped_storage(self):
            return Storage()

        def storage_offset(self):
            return 5

        def stride(self):
            return (1, 2)

    view = _arrays._torch_kind(torch).read("q", MpsTensor(), None)
    assert (view.device, view.address, view.byte_offset) == (_arrays.METAL, 0x7000, 10)
    assert view.shape == (2, 3) and view.strides == (1, 2)


# ---- routing torch.nn.functional.scaled_dot_product_attention --------------------------------


def _ran_mfa(out):
    """Whether out came from mfa's forward: eager mode records it under mfa_native.torch's
    autograd.Function, a call of the operator itself under its registered formula."""
    names = ("_AttentionBackward", "GeneratedBackwardFor_mfa_native_attention_forward_default")
    return out.grad_fn.name() in names


def test_enable_routes_and_disable_restores():
    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    try:
        mfa_torch.enable()
        mfa_torch.enable()  # twice is allowed
        assert mfa_torch.is_enabled()
        assert _ran_mfa(F.scaled_dot_product_attention(q, q, q, is_causal=True))
        # Refused, not silently computed by PyTorch.
        with pytest.raises(NotImplementedError, match="dropout"):
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    finally:
        mfa_torch.disable()
    assert F.scaled_dot_product_attention is original and not mfa_torch.is_enabled()
    assert not _ran_mfa(F.scaled_dot_product_attention(q, q, q, is_causal=True))


def test_routed_nests_and_restores_on_error():
    original = F.scaled_dot_product_attention
    with mfa_torch.routed():
        with mfa_torch.routed():
            assert mfa_torch.is_enabled()
        assert mfa_torch.is_enabled()
        with pytest.raises(RuntimeError, match="inside"):
            with mfa_torch.routed():
                raise RuntimeError("inside")
        assert mfa_torch.is_enabled()
    assert F.scaled_dot_product_attention is original


def _count_calls(monkeypatch, name):
    """A list that gets one entry per call of mfa_native's function `name` (still called)."""
    calls = []
    original = getattr(mfa_native._attention, name)
    monkeypatch.setattr(
        mfa_native._attention,
        name,
        lambda *args, **options: calls.append(1) or original(*args, **options),
    )
    return calls


def test_multihead_attention_runs_through_mfa_when_routed(monkeypatch):
    """torch.nn.MultiheadAttention looks the function up at call time."""
    calls = _count_calls(monkeypatch, "attend")
    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 7, 16)
    expected, _ = layer(x, x, x, need_weights=False)
    assert not calls
    with mfa_torch.routed():
        out, _ = layer(x, x, x, need_weights=False)
    assert calls == [1]
    # Two float32 computations of the same O(1) values from 7 keys of width 4.
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


# ---- training --------------------------------------------------------------------------------


def _mfa_sdpa(q, k, v):
    return mfa_torch.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _routed_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("route", ["mfa_native.torch", "routed F.sdpa"])
def test_a_model_trains_with_gradients_matching_the_reference(route, monkeypatch):
    calls = _count_calls(monkeypatch, "attention_backward")
    if route == "routed F.sdpa":
        with mfa_torch.routed():
            before, after = train_alongside_reference(_routed_sdpa)
    else:
        before, after = train_alongside_reference(_mfa_sdpa)
    assert len(calls) == 2 * 3, "mfa's backward ran once per layer and step"
    assert after < before


def test_explicit_attention_helper_matches_the_numpy_reference():
    """The torch float64 attention the model twin uses agrees with reference.py."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape) for shape in ((1, 4, 6, 5), (1, 2, 9, 5), (1, 2, 9, 3)))
    mask = visible(6, 9, causal=True, bottom_right=True, window=(2, -1))
    got = explicit_attention(*(torch.from_numpy(x) for x in (q, k, v)), mask)
    expected, _ = reference.attention_forward(q, k, v, causal=True, window=(2, -1))
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("module", ["mfa_native.torch", "mfa_native.flash_attn"])
def test_the_module_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted and not result.failed
