"""mfa_native.attention_backward against the float64 reference and against finite differences of
mfa's own forward pass, on every available backend."""

import _cases
import mfa_native
import numpy as np
import pytest
import reference
from _backends import (
    DTYPES,
    UNSHUFFLED_BACKENDS,
    Case,
    backend_only_params,
    backend_params,
    check_backward,
)

CASES = _cases.CASES + [
    Case(1000, 1000, 64, 32, causal=True),
    Case(129, 1000, 256, 192, window=(100, 100)),
    # bf16 key blocks that several blocks of queries see: all of them, and under a causal band.
    Case(600, 257, 64, 48, dtype="bf16"),
    Case(700, 640, 64, 64, causal=True, dtype="bf16"),
]

# With the case added here, the simulator's head dimensions fall into every row of the planner's
# backward tables (f32: <= 16, 24, 32, 56, 64, 128, 192, 384 and beyond; 16-bit: <= 16, 32,
# 56, 80, 144, 192, 384 and beyond).
SIMULATOR_CASES = _cases.SIMULATOR_CASES + [
    Case(64, 33, 80, 64, query_heads=4, kv_heads=2, window=(8, 8), dtype="f16"),
]


@pytest.mark.parametrize("backend, case", backend_params(CASES, SIMULATOR_CASES))
def test_backward_matches_reference(backend, case):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    # The forward results come from the reference, rounded as a backend would store them, so a
    # forward error cannot hide or cause a backward failure.
    exact_out, exact_lse = reference.attention_forward(q, k, v, **case.options)
    out = exact_out.astype(q.dtype)
    lse = exact_lse.astype(np.float32)
    gradients = mfa_native.attention_backward(
        dout, q, k, v, out, lse, **case.options, backend=backend.context()
    )
    assert all(gradient.dtype == q.dtype for gradient in gradients)
    check_backward(case, gradients, dout, q, k, v, out)


PIPELINE_CASES = [
    Case(33, 129, 80, 64, query_heads=4, kv_heads=2, causal=True, dtype="bf16"),
    Case(129, 7, 33, 8, window=(2, 3), causal_alignment="top_left", dtype="f16"),
]


def check_forward_then_backward(case, context):
    """The backend's own forward results fed to its backward, judged by the reference."""
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng)
    out, lse = mfa_native.attention(q, k, v, **case.options, return_lse=True, backend=context)
    gradients = mfa_native.attention_backward(
        dout, q, k, v, out, lse, **case.options, backend=context
    )
    check_backward(case, gradients, dout, q, k, v, out)


@pytest.mark.parametrize("backend, case", backend_params(PIPELINE_CASES, PIPELINE_CASES))
def test_backward_of_the_backends_own_forward(backend, case):
    check_forward_then_backward(case, backend.context())


@pytest.mark.parametrize("backend", backend_only_params(UNSHUFFLED_BACKENDS))
def test_backward_at_the_largest_advertised_head_dim(backend):
    context = backend.context()
    check_forward_then_backward(_cases.at_the_largest_head_dim(context), context)


# Tiny f32 problems for finite differences: mixed masks, GQA, Dv != D, and a row without keys.
DIFFERENCE_CASES = [
    Case(5, 9, 7, 3, query_heads=2, kv_heads=1, causal=True, scale=0.8),
    Case(9, 5, 3, 6, window=(1, 2), causal_alignment="top_left"),
    Case(6, 4, 9, 9, query_heads=3, kv_heads=3, causal=True, window=(1, -1)),
]


def loss(q, k, v, dout, case, context):
    """<out, dout> in float64 from the backend's float32 forward."""
    out = mfa_native.attention(q, k, v, **case.options, backend=context)
    return np.sum(out.astype(np.float64) * dout)


@pytest.mark.parametrize("backend", backend_only_params())
@pytest.mark.parametrize("case", DIFFERENCE_CASES, ids=[case.id for case in DIFFERENCE_CASES])
def test_backward_matches_central_differences(backend, case):
    """The gradient of <out, dout> along a direction delta, compared with
    (loss(x + h delta) - loss(x - h delta)) / 2h, for x = q, k and v in turn.

    delta mixes random noise with the direction of the exact gradient: a random direction alone
    projects the gradient to ~1/sqrt(size), hiding a wrong scale, while the noise keeps errors
    orthogonal to the gradient visible. The step is the difference of the two perturbed float32
    arrays actually evaluated, so rounding the perturbation changes nothing. With delta ~ 1 per
    element and h = 1e-2 the truncation error is O(h^2) ~ 1e-4 relative and float32 forward noise
    over 2h ~ 1e-5 (measured: <= 3e-5 on these cases); 1e-3 keeps a margin while a wrong gradient
    (a missing term, a wrong sign or scale, a mask mismatch) is off by far more.
    """
    rng = case.rng()
    q, k, v = case.inputs(rng)
    dout = case.output_gradient(rng).astype(np.float64)
    context = backend.context()
    out, lse = mfa_native.attention(q, k, v, **case.options, return_lse=True, backend=context)
    gradients = mfa_native.attention_backward(
        dout.astype(np.float32), q, k, v, out, lse, **case.options, backend=context
    )
    exact_gradients = reference.attention_backward(dout, q, k, v, **case.options)
    step = 1e-2
    for index, (name, gradient) in enumerate(zip(("dq", "dk", "dv"), gradients)):
        inputs = [q, k, v]
        exact = exact_gradients[index]
        direction = rng.standard_normal(exact.shape) + exact / np.sqrt(np.mean(exact**2))
        plus, minus = list(inputs), list(inputs)
        plus[index] = (inputs[index] + step * direction).astype(DTYPES["f32"])
        minus[index] = (inputs[index] - step * direction).astype(DTYPES["f32"])
        actual_change = plus[index].astype(np.float64) - minus[index]
        predicted = np.sum(gradient.astype(np.float64) * actual_change)
        measured = loss(*plus, dout, case, context) - loss(*minus, dout, case, context)
        # Relative to |exact gradient| |change|, the bound of an exact directional derivative.
        size = np.sqrt(np.sum(exact**2) * np.sum(actual_change**2))
        assert abs(predicted - measured) <= 1e-3 * size, (
            f"{name}: directional derivative {predicted:.6g}, finite difference {measured:.6g}"
        )
