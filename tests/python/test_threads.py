"""Many Python threads in libmfa at once (cffi releases the GIL for every call): results must be
identical across threads and rounds, and correct against the float64 reference."""

import threading

import mfa_native
import numpy as np
import pytest
import reference
from _errors import raises
from mfa_native import _context

THREADS = 8
ROUNDS = 3
# float32 against float64: every output is a sum over at most Nk = 47 softmax-weighted terms after
# dot products of length 16 (and the backward's sums over Nq = 33 rows), so rounding stays within
# about (47 + 16) * 2^-24 ~ 4e-6 of the O(1) magnitudes of these random inputs; 2e-5 leaves a
# margin while a wrong mask, head mapping or a race corrupting a tile is off by O(0.1).
TOLERANCE = 2e-5

# (name, layout, rank, options): each thread runs one of these, several threads per problem.
PROBLEMS = [
    ("causal-gqa", "bhsd", 4, dict(causal=True)),
    ("window-bshd", "bshd", 4, dict(window=(5, 3))),
    ("top-left-rank3", "bhsd", 3, dict(causal=True, causal_alignment="top_left", scale=0.3)),
    ("plain-bshd-rank3", "bshd", 3, dict()),
]


def _backends():
    names = ["cpu"] + [
        name for name in ("metal-sim", "metal") if name in mfa_native.available_backends()
    ]
    return names


def _problem_inputs(index, layout, rank):
    rng = np.random.default_rng(1000 + index)
    batch, heads_q, heads_kv, seq_q, seq_k, dim, dim_v = 2, 4, 2, 33, 47, 16, 8

    def make(heads, seq, width):
        shape = (batch, heads, seq, width) if layout == "bhsd" else (batch, seq, heads, width)
        array = rng.standard_normal(shape).astype(np.float32)
        return array[0] if rank == 3 else array

    q, k, v = make(heads_q, seq_q, dim), make(heads_kv, seq_k, dim), make(heads_kv, seq_k, dim_v)
    dout = make(heads_q, seq_q, dim_v)
    return q, k, v, dout


def _to_bhsd(array, layout, rank):
    array = array if layout == "bhsd" else np.swapaxes(array, -3, -2)
    return array[None] if rank == 3 else array


def _from_bhsd(array, layout, rank):
    array = array[0] if rank == 3 else array
    return array if layout == "bhsd" else np.swapaxes(array, -3, -2)


def _run(problem_index, backend):
    """Forward (with lse) and backward of one problem: [out, lse, dq, dk, dv]."""
    _, layout, rank, options = PROBLEMS[problem_index]
    q, k, v, dout = _problem_inputs(problem_index, layout, rank)
    out, lse = mfa_native.attention(
        q, k, v, layout=layout, return_lse=True, backend=backend, **options
    )
    grads = mfa_native.attention_backward(
        dout, q, k, v, out, lse, layout=layout, backend=backend, **options
    )
    return [out, lse, *grads]


def _check_against_reference(problem_index, results):
    _, layout, rank, options = PROBLEMS[problem_index]
    q, k, v, dout = _problem_inputs(problem_index, layout, rank)
    bhsd = [_to_bhsd(array, layout, rank) for array in (q, k, v, dout)]
    out, lse = reference.attention_forward(*bhsd[:3], **options)
    grads = reference.attention_backward(
        bhsd[3], *bhsd[:3], out=_to_bhsd(results[0], layout, rank), **options
    )
    expected = [_from_bhsd(out, layout, rank), lse[0] if rank == 3 else lse]
    expected += [_from_bhsd(grad, layout, rank) for grad in grads]
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), results, expected):
        np.testing.assert_allclose(
            got,
            want,
            rtol=TOLERANCE,
            atol=TOLERANCE,
            err_msg=f"{PROBLEMS[problem_index][0]}: {name}",
        )


def _in_threads(work, count=THREADS):
    """Run work(thread_index) on `count` threads released together; re-raise the first error."""
    start = threading.Barrier(count)
    results, errors = [None] * count, []

    def body(index):
        try:
            start.wait()
            results[index] = work(index)
        except BaseException as error:  # reported to the test below
            errors.append(error)

    threads = [threading.Thread(target=body, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _check_all(per_thread):
    """per_thread[t] is a list of ROUNDS results of problem t % len(PROBLEMS)."""
    for problem_index in range(len(PROBLEMS)):
        runs = [
            run
            for thread, rounds in enumerate(per_thread)
            if thread % len(PROBLEMS) == problem_index
            for run in rounds
        ]
        assert len(runs) >= 2
        _check_against_reference(problem_index, runs[0])
        for run in runs[1:]:
            for got, first in zip(run, runs[0]):
                np.testing.assert_array_equal(got, first)


@pytest.mark.parametrize("backend", _backends())
def test_threads_sharing_one_context(backend):
    with mfa_native.Context(backend) as context:
        per_thread = _in_threads(
            lambda thread: [_run(thread % len(PROBLEMS), context) for _ in range(ROUNDS)]
        )
    _check_all(per_thread)


@pytest.mark.parametrize("backend", _backends())
def test_threads_with_their_own_contexts(backend):
    def work(thread):
        with mfa_native.Context(backend, num_threads=1 + thread % 2) as context:
            return [_run(thread % len(PROBLEMS), context) for _ in range(ROUNDS)]

    _check_all(_in_threads(work))


def test_threads_naming_a_backend_share_one_lazily_created_context(monkeypatch):
    monkeypatch.setattr(_context, "_shared_contexts", {})
    per_thread = _in_threads(
        lambda thread: [_run(thread % len(PROBLEMS), "cpu") for _ in range(ROUNDS)]
    )
    _check_all(per_thread)
    assert list(_context._shared_contexts) == ["cpu"]
    contexts = _in_threads(lambda thread: _context.resolve_context("cpu"))
    assert all(context is contexts[0] for context in contexts)


def test_each_thread_gets_its_own_error_message():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)
    with mfa_native.Context("cpu") as context:
        too_wide = context.capabilities["max_head_dim"] + 1
    wide = np.zeros((1, 1, 1, too_wide), np.float32)

    def work(thread):
        messages = set()
        for _ in range(50):
            if thread % 2:
                with raises(
                    mfa_native.MFAError, "out overlaps q", status="INVALID_ARGUMENT"
                ) as caught:
                    mfa_native.attention(q, q, q, out=q, backend="cpu")
            else:
                with raises(
                    mfa_native.MFAError, "q.shape[3] (head dim)", status="UNSUPPORTED"
                ) as caught:
                    mfa_native.attention(wide, wide, wide, backend="cpu")
            messages.add(caught.value.message)
        return messages

    for thread, messages in enumerate(_in_threads(work)):
        expected = "overlaps" if thread % 2 else "exceeds"
        assert len(messages) == 1 and expected in messages.pop()


def test_close_waits_for_calls_in_flight_and_later_calls_fail():
    context = mfa_native.Context("cpu")
    first_call_done = threading.Barrier(THREADS + 1)

    def work(thread):
        completed = []
        try:
            while True:
                completed.append(_run(thread % len(PROBLEMS), context))
                if len(completed) == 1:
                    first_call_done.wait()
        except ValueError as error:
            assert "closed" in str(error)
        return completed

    closer = threading.Thread(target=lambda: (first_call_done.wait(), context.close()))
    closer.start()
    per_thread = _in_threads(work)
    closer.join()
    assert context.closed
    _check_all(per_thread)
