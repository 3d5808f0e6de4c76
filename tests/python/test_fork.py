"""fork() while other threads are inside mfa calls, as multiprocessing's fork start method does
it: the children must compute correct results on the shared per-backend contexts they inherit,
and never hang. A child that hangs fails the test after a timeout (a quarter of
MFA_TEST_TIMEOUT, default 900 s per test) instead of stopping the suite."""

import multiprocessing
import os
import signal
import threading
import time

import mfa_native
import numpy as np
import pytest
import reference

pytestmark = [
    pytest.mark.skipif(
        "fork" not in multiprocessing.get_all_start_methods(), reason="no fork() on this platform"
    ),
    # Python 3.12+ warns about fork() in a process with threads: that is the case under test.
    pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning"),
]

CHILD_TIMEOUT = max(20, int(os.environ.get("MFA_TEST_TIMEOUT", "900")) // 4)
# float32 against float64 on O(1) inputs: sums of at most Nk = 40 weighted terms after dot
# products of length 16 round within ~(40 + 16) * 2^-24 ~ 3e-6; a hang or a corrupted pool
# would show as a timeout or an O(1) error, not as a near miss.
TOLERANCE = 2e-5
ROUNDS = 10


def _backends():
    return [name for name in ("cpu", "metal-sim") if name in mfa_native.available_backends()]


def _inputs(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 2, 24, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 40, 16)).astype(np.float32)
    v = rng.standard_normal((1, 1, 40, 16)).astype(np.float32)
    dout = rng.standard_normal((1, 2, 24, 16)).astype(np.float32)
    return q, k, v, dout


def _forward_and_backward(backend, seed):
    q, k, v, dout = _inputs(seed)
    out, lse = mfa_native.attention(q, k, v, causal=True, backend=backend, return_lse=True)
    gradients = mfa_native.attention_backward(dout, q, k, v, out, lse, causal=True, backend=backend)
    return out, gradients


def _child(arguments):
    return _forward_and_backward(*arguments)


def _check(seed, out, gradients):
    q, k, v, dout = _inputs(seed)
    want_out, _ = reference.attention_forward(q, k, v, causal=True)
    want = reference.attention_backward(dout, q, k, v, out=out, causal=True)
    np.testing.assert_allclose(out, want_out, atol=TOLERANCE, rtol=0)
    for got, expected in zip(gradients, want):
        np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("backend", _backends())
def test_fork_children_while_threads_are_inside_calls(backend):
    # Everything imported and every shared context created before the threads start: Python's
    # own import locks, held by a thread that is importing when the process forks, stay held in
    # the child (a CPython limitation, not the one under test).
    _check(0, *_forward_and_backward(backend, 0))
    stop = threading.Event()
    running = threading.Barrier(4)
    failures = []

    def busy(thread):
        try:
            _forward_and_backward(backend, 100 + thread)
            running.wait()
            while not stop.is_set():
                _forward_and_backward(backend, 100 + thread)
        except Exception as error:  # reported by the test, not lost in the thread
            failures.append(error)
            running.abort()

    threads = [threading.Thread(target=busy, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    try:
        running.wait()
        forking = multiprocessing.get_context("fork")
        for round_ in range(ROUNDS):
            seeds = [2 * round_, 2 * round_ + 1]
            # Leaving the block terminates the workers, hung ones included.
            with forking.Pool(2) as pool:
                pending = pool.map_async(_child, [(backend, seed) for seed in seeds])
                try:
                    results = pending.get(timeout=CHILD_TIMEOUT)
                except multiprocessing.TimeoutError:
                    pytest.fail(f"round {round_}: a forked child hung for {CHILD_TIMEOUT} s")
            for seed, (out, gradients) in zip(seeds, results):
                _check(seed, out, gradients)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures, failures


def _wait_for_child(pid, timeout):
    """The child's exit status, or None after killing it when it runs past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_forked_child_can_use_and_close_a_context_whose_lock_another_thread_held():
    """The moment the test above can only hit by chance, made certain: another thread holds the
    Context's lock, with a call in flight, when the process forks."""
    context = mfa_native.Context("cpu")
    q, k, v, _ = _inputs(7)
    holding, release = threading.Event(), threading.Event()

    def hold():
        context._acquire()  # a call in flight ...
        with context._state:  # ... and the lock held, as between two bytecodes of _acquire
            holding.set()
            release.wait()
        context._release()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                out = mfa_native.attention(q, k, v, causal=True, backend=context)
                context.close()
                want, _ = reference.attention_forward(q, k, v, causal=True)
                code = 0 if np.allclose(out, want, atol=TOLERANCE, rtol=0) else 2
            finally:
                os._exit(code)
        status = _wait_for_child(pid, CHILD_TIMEOUT)
    finally:
        release.set()
        holder.join()
        context.close()
    assert status is not None, f"the child hung for {CHILD_TIMEOUT} s"
    assert status == 0, f"the child failed with status {status}"
