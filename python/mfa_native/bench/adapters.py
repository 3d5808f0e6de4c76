"""The adapters study (``--grid adapters``): what each front end of mfa_native adds to a call
over the raw numpy call, at the small shapes where it shows: B 1, H 8, D 64, float32, N 128
causal, and decoding (Nq 1 against Nk 128). Target: under 20 us per call.

The front ends ("paths"), each where its library is installed:

================  ==========================================================================
numpy             ``mfa_native.attention`` on numpy arrays: the baseline
torch tensors     ``mfa_native.attention`` on torch tensors
torch op          ``mfa_native.torch.attention`` (its operator, with no autograd to record)
torch autograd    the same on q, k, v that require grad (computed from leaf tensors, as a
                  model's projections make them): autograd records the call
torch SDPA        ``mfa_native.torch.scaled_dot_product_attention``
flash_attn_func   ``mfa_native.flash_attn.flash_attn_func`` (on [B, N, H, D] views; its result,
                  [B, N, H, D] too, is transposed for the comparison, outside the timing)
MLX arrays        ``mfa_native.attention`` on ``mx.array`` s
MLX SDPA          ``mfa_native.mlx.scaled_dot_product_attention`` (an ``mx.custom_function``)
================  ==========================================================================

The MLX SDPA's result is lazy, as every MLX operation's is: ``mx.custom_function`` hands its
values (computed and written during the call) to the caller through a primitive that shares
their buffer, evaluated with whatever the caller evaluates next; in a model that is the round
trip to MLX's stream thread that the next ``mx.eval`` makes anyway, so it is not timed here.

How. The overhead is Python work, a few microseconds beside a kernel that takes tens at these
shapes and varies by more than that on a shared machine; so it is measured with libmfa's entry
points replaced by no-ops (``Context._call``, for the measurement only): everything a path does
runs (argument checks, views, result allocation, autograd's graph, MLX's custom function) but
the kernel. Each trial is ``calls`` calls of one path in a row, timed in CPU time of the calling
thread (``time.thread_time``: what other processes run on a shared machine is not counted, nor
what other threads of this one do, and no path hands work to one: the kernel is skipped, MLX's
results are lazy); each round runs one trial of every path in an order that
rotates by one each round, and a path's overhead is the median over the rounds of its per-call
time minus the numpy call's in the same round. The whole calls (the kernel running) are timed
too, in wall time ("ms" of the report), and their results compared with the numpy call's.
"""

import contextlib
import importlib
import time

import numpy as np

import mfa_native
from mfa_native.bench.cases import Case
from mfa_native.bench.features import agreement, result_row
from mfa_native.bench.peers import inputs

__all__ = ["run", "timed_rounds", "paired_difference", "TARGET_US"]

TARGET_US = 20.0
# Calls per trial, and rounds per --repeats (the default 5 gives 200 rounds: some 10 s).
_CALLS = 20
_ROUNDS_PER_REPEAT = 40


def _optional(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _paths(case, missing):
    """{path: function of no arguments} on the case's inputs, numpy first; the libraries not
    installed are named in missing."""
    q, k, v, _ = inputs(case, backward=False)
    causal = case.causal
    paths = {"numpy": lambda: mfa_native.attention(q, k, v, causal=causal)}
    torch = _optional("torch")
    if torch is None:
        missing["torch paths"] = "torch is not installed"
    else:
        import mfa_native.flash_attn
        import mfa_native.torch

        tq, tk, tv = (torch.from_numpy(array) for array in (q, k, v))
        # Computed from tensors that require grad, as a model's projections make them (leaf
        # tensors would add autograd's accumulator nodes, made anew for every call).
        gq, gk, gv = (tensor.clone().requires_grad_() * 1.0 for tensor in (tq, tk, tv))
        bq, bk, bv = (tensor.transpose(1, 2) for tensor in (tq, tk, tv))
        op = mfa_native.torch
        paths.update(
            {
                "torch tensors": lambda: mfa_native.attention(tq, tk, tv, causal=causal),
                "torch op": lambda: op.attention(tq, tk, tv, causal=causal),
                "torch autograd": lambda: op.attention(gq, gk, gv, causal=causal),
                "torch SDPA": lambda: op.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
                "flash_attn_func": lambda: mfa_native.flash_attn.flash_attn_func(
                    bq, bk, bv, causal=causal
                ),
            }
        )
    mx = _optional("mlx.core")
    if mx is None:
        missing["MLX paths"] = "mlx is not installed"
    else:
        import mfa_native.mlx

        mq, mk, mv = (mx.array(array) for array in (q, k, v))
        mx.eval(mq, mk, mv)
        scale = case.dim**-0.5
        mask = "causal" if causal else None
        paths["MLX arrays"] = lambda: mfa_native.attention(mq, mk, mv, causal=causal)
        paths["MLX SDPA"] = lambda: mfa_native.mlx.scaled_dot_product_attention(
            mq, mk, mv, scale=scale, mask=mask
        )
    return paths


# Paths whose results are [B, N, H, D] (flash-attn's layout): compared with the numpy call's
# [B, H, N, D] once transposed, outside the timed calls.
_BSHD_PATHS = frozenset({"flash_attn_func"})


def _as_numpy(result, name):
    detach = getattr(result, "detach", None)
    values = np.asarray(detach() if detach is not None else result, np.float32)
    return values.swapaxes(1, 2) if name in _BSHD_PATHS else values


@contextlib.contextmanager
def _kernels_skipped():
    """Every libmfa entry point called through a Context returns at once, as if it had run
    (its outputs keep what their allocation left in them), until the block ends."""
    call = mfa_native.Context._call
    mfa_native.Context._call = lambda self, function, *args: None
    try:
        yield
    finally:
        mfa_native.Context._call = call


def timed_rounds(functions, rounds, calls, clock, warmups=1):
    """{name: [seconds per call by clock (a nanosecond counter), one entry per round]}: after
    ``warmups`` untimed trials, each round times ``calls`` calls in a row of every function, in
    an order rotating by one each round."""
    names = list(functions)
    for name in names:
        for _ in range(max(warmups, 1) * calls):
            functions[name]()
    seconds = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            function = functions[name]
            start = clock()
            for _ in range(calls):
                function()
            seconds[name].append((clock() - start) * 1e-9 / calls)
    return seconds


def paired_difference(seconds, name, baseline):
    """Median over the rounds of name's time minus baseline's in the same round."""
    return float(np.median([a - b for a, b in zip(seconds[name], seconds[baseline])]))


def _case_row(setup, case):
    missing = {}
    paths = _paths(case, missing)
    rounds = max(_ROUNDS_PER_REPEAT * setup.repeats // setup.shrink, 1)
    expected = _as_numpy(paths["numpy"](), "numpy")
    # One library computes every path's result from the same inputs.
    agreements = [
        agreement(case.dtype, _as_numpy(path(), name), expected) for name, path in paths.items()
    ]
    wall = timed_rounds(paths, rounds, 1, time.perf_counter_ns, setup.warmups)
    with _kernels_skipped():
        python = timed_rounds(paths, rounds, _CALLS, time.thread_time_ns, setup.warmups)
    numpy_us = float(np.median(python["numpy"])) * 1e6
    measures = {"numpy call, Python us": (numpy_us, "", None)}
    for name in paths:
        if name != "numpy":
            overhead = paired_difference(python, name, "numpy") * 1e6
            measures[f"{name} overhead us"] = (overhead, f"< {TARGET_US:g}", overhead < TARGET_US)
    measures["every path = numpy"] = max(agreements)
    label = case.label() + (" (decoding)" if case.seq == 1 else "")
    row = result_row("adapters", label, wall, measures)
    row["errors"] = missing
    return row


def run(setup):
    """One row per shape: the paths' whole calls (ms), their overhead over the numpy call."""
    shapes = (
        Case(1, 8, 128, 64, "f32", causal=True),
        Case(1, 8, 1, 64, "f32", seq_k=128),
    )
    return [_case_row(setup, case) for case in shapes]
