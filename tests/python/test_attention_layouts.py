"""Memory layouts on every available backend: [B, N, H, D] arrays, sliced and reversed views,
zero strides and outputs written into views must give the numbers of the plain [B, H, N, D]
problem (checked against the reference, forward and backward, in every dtype).

Inputs live inside NaN-filled buffers and outputs inside sentinel-filled ones, so a kernel that
ignores a stride reads NaN (caught as non-finite output) or writes outside its view (caught by
the sentinel check)."""

import dataclasses

import mfa_native
import numpy as np
import pytest
from _backends import BACKENDS, DTYPES, Case, check_backward, check_forward


@dataclasses.dataclass(frozen=True)
class Arrangement:
    """How arrays sit in memory: the layout, and for each memory axis the step between
    consecutive elements of the view inside its buffer (negative: reversed), for the inputs and
    for the outputs (None: let mfa allocate them)."""

    layout: str
    input_steps: tuple = (1, 1, 1, 1)
    output_steps: tuple = None
    broadcast_kv_over_batch: bool = False


ARRANGEMENTS = {
    "bshd": Arrangement("bshd"),
    # Heads of one token interleaved with other data, as in a fused qkv projection.
    "bshd-interleaved-heads": Arrangement("bshd", (1, 1, 2, 1), (1, 1, 3, 1)),
    "bhsd-reversed-and-sliced": Arrangement("bhsd", (-1, 1, 2, -1), (1, -1, 1, 2)),
    "bshd-reversed-and-sliced": Arrangement("bshd", (1, -2, -1, 1), (-1, 2, 1, -1)),
    "bhsd-kv-broadcast-over-batch": Arrangement("bhsd", broadcast_kv_over_batch=True),
}

# GQA, Dv != D, lengths off every block size, a mask that changes per row; small enough for
# metal-sim, so every run gets the same problems.
CASE_OPTIONS = {
    "f32": {"causal": True},
    "f16": {"window": (5, 3), "causal_alignment": "top_left"},
    "bf16": {"causal": True, "window": (9, None)},
}


def embed(array, steps, fill):
    """(buffer, index): a buffer filled with `fill` whose view buffer[index] equals `array`,
    with consecutive elements `steps[axis]` apart (negative: in reverse order) and an offset."""
    buffer_shape = tuple(length * abs(step) + 1 for length, step in zip(array.shape, steps))
    buffer = np.full(buffer_shape, fill, dtype=array.dtype)
    index = tuple(slice(1, None, step) if step > 0 else slice(None, 0, step) for step in steps)
    buffer[index] = array
    return buffer, index


def to_layout(array, layout):
    """[B, H, N, D] -> the axis order of `layout` (a view)."""
    return array if layout == "bhsd" else np.swapaxes(array, 1, 2)


def place_input(array, arrangement):
    buffer, index = embed(to_layout(array, arrangement.layout), arrangement.input_steps, np.nan)
    return buffer[index]


OUTPUT_SENTINEL = 7.0


def output_slot(shape, dtype, arrangement):
    """(view, buffer, index) for an output of bhsd shape `shape`, or Nones when mfa allocates."""
    if arrangement.output_steps is None:
        return None, None, None
    template = to_layout(np.zeros(shape, dtype=dtype), arrangement.layout)
    buffer, index = embed(template, arrangement.output_steps, OUTPUT_SENTINEL)
    return buffer[index], buffer, index


def assert_only_view_written(buffer, index):
    outside = buffer.astype(np.float64)
    outside[index] = OUTPUT_SENTINEL
    assert np.all(outside == OUTPUT_SENTINEL), "an output was written outside its view"


PARAMS = [
    pytest.param(backend, name, dtype, id=f"{backend.id}-{name}-{dtype}")
    for backend in BACKENDS
    for name in ARRANGEMENTS
    for dtype in DTYPES
]


@pytest.mark.parametrize("backend, arrangement_name, dtype", PARAMS)
def test_layout_forward_and_backward(backend, arrangement_name, dtype):
    arrangement = ARRANGEMENTS[arrangement_name]
    case = Case(
        33, 40, 33, 8, query_heads=4, kv_heads=2, batch=2, dtype=dtype, **CASE_OPTIONS[dtype]
    )
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    context = backend.context()
    layout = arrangement.layout

    inputs = [place_input(x, arrangement) for x in (q, k, v)]
    if arrangement.broadcast_kv_over_batch:
        # Zero batch stride: every batch entry reads the keys and values of the first.
        k, v = (np.broadcast_to(x[:1], x.shape) for x in (k, v))
        inputs[1:] = k, v
    out_view, out_buffer, out_index = output_slot(dout.shape, q.dtype, arrangement)
    out, lse = mfa_native.attention(
        *inputs, **case.options, layout=layout, return_lse=True, out=out_view, backend=context
    )
    if out_view is not None:
        assert out is out_view
        assert_only_view_written(out_buffer, out_index)
    out_bhsd = to_layout(out, layout)
    check_forward(case, out_bhsd, lse, q, k, v)

    gradient_slots = [output_slot(x.shape, q.dtype, arrangement) for x in (q, k, v)]
    gradients = mfa_native.attention_backward(
        place_input(dout, arrangement),
        *inputs,
        out,
        lse,
        **case.options,
        layout=layout,
        dq=gradient_slots[0][0],
        dk=gradient_slots[1][0],
        dv=gradient_slots[2][0],
        backend=context,
    )
    for gradient, (view, buffer, index) in zip(gradients, gradient_slots):
        if view is not None:
            assert gradient is view
            assert_only_view_written(buffer, index)
    check_backward(case, [to_layout(g, layout) for g in gradients], dout, q, k, v, out_bhsd)


def one_element_in(array):
    """A view equal to array whose rows start one element into a buffer: 16-bit rows 2 bytes
    past a 4-byte boundary, as numpy slices such as x[..., 1:] are."""
    buffer = np.full((*array.shape[:-1], array.shape[-1] + 1), np.nan, dtype=array.dtype)
    buffer[..., 1:] = array
    return buffer[..., 1:]


@pytest.mark.parametrize(
    "backend, dtype",
    [
        pytest.param(backend, dtype, id=f"{backend.id}-{dtype}")
        for backend in BACKENDS
        for dtype in ("f16", "bf16")
    ],
)
@pytest.mark.parametrize("num_queries", [40, 2], ids=["prefill", "decode"])
def test_rows_one_element_into_their_buffer(backend, dtype, num_queries):
    """Rows that start at an odd element, with a head dimension wide enough (64) for the
    kernels' vector and pair paths: those paths may assume the itemsize's alignment, no more.
    Two queries of a grouped-query case are a decoding step on the cpu backend."""
    case = Case(num_queries, 70, 64, 64, query_heads=8, kv_heads=2, dtype=dtype, causal=True)
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    inputs = [one_element_in(x) for x in (q, k, v)]
    assert all(x.ctypes.data % 4 == 2 for x in inputs)
    context = backend.context()
    out, lse = mfa_native.attention(*inputs, **case.options, return_lse=True, backend=context)
    check_forward(case, out, lse, q, k, v)
    gradients = mfa_native.attention_backward(
        one_element_in(dout), *inputs, one_element_in(out), lse, **case.options, backend=context
    )
    check_backward(case, gradients, dout, q, k, v, out)
