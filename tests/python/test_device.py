"""Device buffers and command buffers from Python, on metal-sim: arrays of a DeviceBuffer at byte
offsets through attention and attention_backward, synchronously and encoded into a
CommandBuffer (nothing written before commit), against the float64 reference; out-of-range
views refused naming the operand with nothing written; the errors of a command buffer's
states; DLPack kDLMetal arrays read as a buffer and offset, and refused off the metal backend.
Skipped without metal-sim."""

import threading

import mfa_native
import numpy as np
import pytest
import reference
from _backends import Case, check_backward, check_forward
from mfa_native import _arrays, _attention

pytestmark = pytest.mark.skipif(
    "metal-sim" not in mfa_native.available_backends(), reason="no metal-sim backend"
)

CASES = [
    Case(9, 17, 16, 16, query_heads=2, kv_heads=2, batch=2, causal=True),
    Case(13, 11, 8, 8, query_heads=4, kv_heads=2, window=(3, 2), dtype="f16"),
    Case(7, 20, 16, 8, query_heads=2, causal=True, causal_alignment="top_left", dtype="bf16"),
]


@pytest.fixture(scope="module")
def context():
    with mfa_native.Context("metal-sim", num_threads=2) as ctx:
        yield ctx


class Arena:
    """Arrays placed one after another in one DeviceBuffer, each three elements past the last
    (byte offsets element-aligned, not 16-byte aligned)."""

    def __init__(self, context, arrays):
        self.length = sum(a.nbytes + 64 for a in arrays)
        self.buffer = mfa_native.DeviceBuffer(self.length, backend=context)
        self.used = 0

    def place(self, array):
        item = array.dtype.itemsize
        start = -(-self.used // item) * item + 3 * item
        contents = self.buffer.contents
        contents[start : start + array.nbytes] = np.ascontiguousarray(array).view(np.uint8).ravel()
        self.used = start + array.nbytes
        return self.buffer.array(array.dtype, array.shape, byte_offset=start)

    def empty(self, shape, dtype):
        return self.place(np.full(shape, np.nan, dtype))


def _problem(context, case):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    out_shape = (case.batch, case.query_heads, case.num_queries, case.value_dim)
    lse_shape = out_shape[:3]
    lse_like = np.empty(lse_shape, np.float32)
    arena = Arena(context, [q, k, v, dout, dout, lse_like, q, k, v])
    device = {name: arena.place(x) for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout))}
    device["out"] = arena.empty(out_shape, q.dtype)
    device["lse"] = arena.empty(lse_shape, np.float32)
    for name, like in (("dq", q), ("dk", k), ("dv", v)):
        device[name] = arena.empty(like.shape, q.dtype)
    return (q, k, v, dout), device, arena


def _run(case, device, context):
    out, lse = mfa_native.attention(
        device["q"],
        device["k"],
        device["v"],
        **case.options,
        return_lse=True,
        backend=context,
        out=device["out"],
        lse=device["lse"],
    )
    assert out is device["out"] and lse is device["lse"]
    grads = mfa_native.attention_backward(
        device["dout"],
        device["q"],
        device["k"],
        device["v"],
        device["out"],
        device["lse"],
        **case.options,
        backend=context,
        dq=device["dq"],
        dk=device["dk"],
        dv=device["dv"],
    )
    assert all(g is device[n] for g, n in zip(grads, ("dq", "dk", "dv")))


def _check(case, host, device):
    q, k, v, dout = host
    out = device["out"].numpy()
    check_forward(case, out, device["lse"].numpy(), q, k, v)
    gradients = tuple(device[n].numpy() for n in ("dq", "dk", "dv"))
    check_backward(case, gradients, dout, q, k, v, out)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_device_arrays_synchronously(context, case):
    host, device, arena = _problem(context, case)
    _run(case, device, context)
    _check(case, host, device)
    arena.buffer.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_encoded_into_a_command_buffer_runs_at_commit(context, case):
    host, device, arena = _problem(context, case)
    before = arena.buffer.contents.copy()
    with mfa_native.CommandBuffer(backend=context) as commands:
        with commands.encoding():
            _run(case, device, context)
        # Encoded, not run: every byte of the buffer as it was.
        np.testing.assert_array_equal(arena.buffer.contents, before)
        commands.commit()
        commands.wait()
    _check(case, host, device)
    arena.buffer.close()


def test_views_outside_their_buffer_are_refused_with_nothing_written(context):
    case = CASES[0]
    host, device, arena = _problem(context, case)
    before = arena.buffer.contents.copy()
    q = device["q"]
    item = q.dtype.itemsize
    nbytes = int(np.prod(q.shape)) * item
    for offset in (arena.length - nbytes + item, -item):
        device["q"] = arena.buffer.array(q.dtype, q.shape, byte_offset=offset)
        with pytest.raises(mfa_native.MFAError, match="q: the view reaches bytes"):
            _run(case, device, context)
        with mfa_native.CommandBuffer(backend=context) as commands:
            with commands.encoding(), pytest.raises(mfa_native.MFAError, match="q: the view"):
                _run(case, device, context)
            commands.commit()
            commands.wait()
    np.testing.assert_array_equal(arena.buffer.contents, before)
    device["q"] = q
    with pytest.raises(ValueError, match="pass every output"):
        mfa_native.attention(device["q"], device["k"], device["v"], backend=context)
    with pytest.raises(ValueError, match="pass every output"):
        mfa_native.attention_backward(
            device["dout"], device["q"], device["k"], device["v"], device["out"], device["lse"],
            backend=context, dq=device["dq"],
        )  # fmt: skip
    with pytest.raises(ValueError, match="share one"):
        mfa_native.attention(host[0], device["k"], device["v"], backend=context)
    arena.buffer.close()


def test_command_buffer_states(context):
    case = CASES[0]
    host, device, arena = _problem(context, case)
    commands = mfa_native.CommandBuffer(backend=context)
    with pytest.raises(mfa_native.MFAError, match="never committed"):
        commands.wait()
    commands.commit()
    with pytest.raises(mfa_native.MFAError, match="already committed"):
        commands.commit()
    before = arena.buffer.contents.copy()
    with commands.encoding(), pytest.raises(mfa_native.MFAError, match="already committed"):
        _run(case, device, context)
    np.testing.assert_array_equal(arena.buffer.contents, before)
    commands.close()
    # Work never committed is dropped with its command buffer.
    with mfa_native.CommandBuffer(backend=context) as dropped:
        with dropped.encoding():
            _run(case, device, context)
    np.testing.assert_array_equal(arena.buffer.contents, before)
    with mfa_native.Context("metal-sim") as other:
        with mfa_native.CommandBuffer(backend=other) as foreign:
            with foreign.encoding(), pytest.raises(ValueError, match="another context"):
                _run(case, device, context)
    arena.buffer.close()


def test_device_buffers_need_a_backend_that_has_them():
    with mfa_native.Context("cpu") as cpu:
        with pytest.raises(mfa_native.MFAError, match="MFA_FEATURE_DEVICE_BUFFERS"):
            mfa_native.DeviceBuffer(64, backend=cpu)
        with pytest.raises(mfa_native.MFAError, match="MFA_FEATURE_ENCODE"):
            mfa_native.CommandBuffer(backend=cpu)


class MetalProducer:
    """A DLPack producer claiming kDLMetal memory (as an MPS tensor or an MLX GPU array does),
    its data pointer standing for the id<MTLBuffer>."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (_arrays.METAL, 0)

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)


def test_metal_memory_is_read_as_a_buffer_and_offset_and_refused_off_metal(context):
    q, k, v = CASES[0].inputs(CASES[0].rng())
    view = _arrays.read_array("q", MetalProducer(q[:, :, 1:]))
    # DLPack's data is the buffer, byte_offset the view's start in it (numpy folds the slice
    # into data, so 0 here); both reach mfa_array as buffer + byte_offset, data NULL.
    assert view.device == _arrays.METAL and view.byte_offset == 0
    data, buffer, byte_offset = _attention._memory_fields(view)
    assert data == 0 and byte_offset == view.byte_offset
    assert buffer == q[:, :, 1:].ctypes.data
    before = q.copy()
    with pytest.raises(NotImplementedError, match="only the metal backend reads, not 'metal-sim'"):
        mfa_native.attention(*(MetalProducer(x) for x in (q, k, v)), backend=context)
    np.testing.assert_array_equal(q, before)


def test_threads_encode_into_their_own_command_buffers(context):
    """One context, three threads, each encoding into its own command buffer (the encoding
    target is per thread) while the others run: every result matches the reference."""
    problems = [_problem(context, case) for case in CASES]
    errors = []

    def work(case, device):
        try:
            with mfa_native.CommandBuffer(backend=context) as commands:
                with commands.encoding():
                    _run(case, device, context)
                commands.commit()
                commands.wait()
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [
        threading.Thread(target=work, args=(case, device))
        for case, (_, device, _) in zip(CASES, problems)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for case, (host, device, arena) in zip(CASES, problems):
        _check(case, host, device)
        arena.buffer.close()


def test_packed_sequences_read_their_offsets_from_the_buffer(context):
    """attention_varlen encoded with every array, the int32 offsets included, in one buffer
    (the library reads the offsets through the buffer's contents while encoding), against the
    float64 reference sequence by sequence. f32 storage, D = 16, at most 9 keys a row: fp32
    rounding of sums of a few dozen terms of size ~1 stays below 1e-5, which a wrong
    sequence's keys or offsets exceed by orders of magnitude."""
    rng = np.random.default_rng(11)
    cu_q, cu_k = np.array([0, 3, 3, 10], np.int32), np.array([0, 5, 14, 14], np.int32)
    heads_q, heads_kv, dim = 2, 1, 16
    q = rng.standard_normal((10, heads_q, dim)).astype(np.float32)
    k = rng.standard_normal((14, heads_kv, dim)).astype(np.float32)
    v = rng.standard_normal((14, heads_kv, dim)).astype(np.float32)
    out_like = np.empty((10, heads_q, dim), np.float32)
    lse_like = np.empty((heads_q, 10), np.float32)
    arena = Arena(context, [q, k, v, cu_q, cu_k, out_like, lse_like])
    device = [arena.place(x) for x in (q, k, v, cu_q, cu_k)]
    out, lse = arena.empty(out_like.shape, np.float32), arena.empty(lse_like.shape, np.float32)
    with mfa_native.CommandBuffer(backend=context) as commands:
        with commands.encoding():
            mfa_native.attention_varlen(
                *device, 7, 9, causal=True, return_lse=True, backend=context, out=out, lse=lse
            )
        assert np.isnan(out.numpy()).all()
        commands.commit()
        commands.wait()

    def bhsd(x):
        return np.swapaxes(x, 0, 1)[None].astype(np.float64)

    want_out, want_lse = reference.varlen_attention_forward(
        bhsd(q), bhsd(k), bhsd(v), cu_q, cu_k, causal=True
    )
    np.testing.assert_allclose(bhsd(out.numpy()), want_out, rtol=0, atol=1e-5)
    np.testing.assert_allclose(lse.numpy()[None], want_lse, rtol=0, atol=1e-5)
    arena.buffer.close()
