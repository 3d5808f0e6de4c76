"""Masks, softcap, ALiBi and sinks, forward and backward, on every backend, against the float64
reference: the pairwise cases of _cases.MODIFIER_CASES, the backends' own forward fed to their
backward, and central differences of their forward.

A backend without a feature a case needs (Context.capabilities, per direction) must raise
MFAError UNSUPPORTED naming it, which these tests check instead; so they pass feature by feature
as the backends land, and fail where a backend claims a feature and computes it wrongly. The
first run of each test is the reference behind the C ABI (_abi_reference), which has them all."""

import _cases
import mfa_native
import numpy as np
import pytest
import reference
from _backends import (
    DTYPES,
    FEATURE_BACKENDS,
    Case,
    backend_only_params,
    backward_with_features,
    check_backward,
    check_forward,
    feature_params,
    forward_with_features,
)


def forward_of_case(backend, case):
    """The case's q, k, v and modifiers, and the backend's (out, lse) of them, or None where it
    lacks a feature the case needs (checked to raise UNSUPPORTED)."""
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    result = forward_with_features(backend, case, modifiers, mfa_native.attention, q, k, v)
    return (q, k, v), modifiers, result


@pytest.mark.parametrize("backend, case", feature_params(_cases.MODIFIER_CASES))
def test_forward_with_modifiers_matches_reference(backend, case):
    (q, k, v), modifiers, result = forward_of_case(backend, case)
    if result is not None:
        out, lse = result
        assert out.dtype == q.dtype and lse.dtype == np.float32
        check_forward(case, out, lse, q, k, v, modifiers)


@pytest.mark.parametrize("backend, case", feature_params(_cases.MODIFIER_CASES))
def test_backward_with_modifiers_matches_reference(backend, case):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    dout = case.output_gradient(rng)
    # The forward results come from the reference, rounded as a backend would store them, so a
    # forward error cannot hide or cause a backward failure.
    exact_out, exact_lse = reference.attention_forward(q, k, v, **case.options, **modifiers)
    out, lse = exact_out.astype(q.dtype), exact_lse.astype(np.float32)
    gradients = backward_with_features(
        backend, case, modifiers, mfa_native.attention_backward, dout, q, k, v, out, lse
    )
    if gradients is not None:
        assert len(gradients) == (4 if case.sinks else 3)
        assert all(g.dtype == q.dtype for g in gradients[:3])
        check_backward(case, gradients, dout, q, k, v, out, modifiers)


# Each modifier, and all of them at once, through a backend's own forward and backward.
PIPELINE_CASES = [
    Case(33, 40, 24, 16, query_heads=4, kv_heads=2, causal=True, mask="bool", dtype="bf16"),
    Case(17, 33, 16, 16, query_heads=2, kv_heads=1, softcap=2.0, sinks=True, dtype="f16"),
    Case(40, 17, 8, 8, batch=2, query_heads=2, kv_heads=2, alibi="batch", window=(4, 1)),
    Case(
        33,
        64,
        32,
        24,
        batch=2,
        query_heads=6,
        kv_heads=2,
        causal=True,
        causal_alignment="top_left",
        mask="additive-f32",
        softcap=4.0,
        alibi="heads",
        sinks=True,
    ),
]


def forward_then_backward(backend, case, q, k, v, dout, modifiers):
    """(out, gradients) of a backend's own forward and backward, or None where it lacks a
    feature in one of them (checked to raise UNSUPPORTED)."""
    result = forward_with_features(backend, case, modifiers, mfa_native.attention, q, k, v)
    if result is None:
        return None
    out, lse = result
    gradients = backward_with_features(
        backend, case, modifiers, mfa_native.attention_backward, dout, q, k, v, out, lse
    )
    return None if gradients is None else (out, gradients)


@pytest.mark.parametrize("backend, case", feature_params(PIPELINE_CASES))
def test_backward_of_the_backends_own_forward_with_modifiers(backend, case):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    dout = case.output_gradient(rng)
    result = forward_then_backward(backend, case, q, k, v, dout, modifiers)
    if result is not None:
        out, gradients = result
        check_backward(case, gradients, dout, q, k, v, out, modifiers)


# Tiny float32 problems for central differences of a backend's forward, every modifier in
# play, sinks among the perturbed inputs.
DIFFERENCE_CASES = [
    Case(5, 9, 7, 3, query_heads=2, kv_heads=1, causal=True, softcap=1.5, sinks=True),
    Case(9, 5, 3, 6, window=(1, 2), causal_alignment="top_left", mask="additive", alibi="heads"),
    Case(6, 7, 9, 9, batch=2, query_heads=2, kv_heads=2, mask="bool-keys", sinks=True),
]


def _loss(case, context, modifiers, dout, q, k, v):
    out = mfa_native.attention(q, k, v, **case.options, **modifiers, backend=context)
    return np.sum(out.astype(np.float64) * dout)


@pytest.mark.parametrize("backend, case", feature_params(DIFFERENCE_CASES, DIFFERENCE_CASES))
def test_backward_with_modifiers_matches_central_differences(backend, case):
    """As test_attention_backward's central differences (the same step, directions and bound,
    justified there), with the sinks as a fourth input."""
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    dout = case.output_gradient(rng).astype(np.float64)
    result = forward_then_backward(backend, case, q, k, v, dout.astype(np.float32), modifiers)
    if result is None:
        return
    _, gradients = result
    context = backend.context()
    exact = reference.attention_backward(
        dout, q, k, v, **case.options, **modifiers, return_dsinks=case.sinks
    )
    step = 1e-2
    inputs = [q, k, v] + ([modifiers["sinks"]] if case.sinks else [])
    for index, (name, gradient) in enumerate(zip(("dq", "dk", "dv", "dsinks"), gradients)):
        direction = rng.standard_normal(exact[index].shape)
        direction += exact[index] / np.sqrt(np.mean(exact[index] ** 2))
        changed = []
        for sign in (1, -1):
            arrays = list(inputs)
            arrays[index] = (inputs[index] + sign * step * direction).astype(DTYPES["f32"])
            changed.append(arrays)
        actual_change = changed[0][index].astype(np.float64) - changed[1][index]
        predicted = np.sum(gradient.astype(np.float64) * actual_change)
        losses = []
        for arrays in changed:
            sinks = {"sinks": arrays[3]} if case.sinks else {}
            losses.append(_loss(case, context, {**modifiers, **sinks}, dout, *arrays[:3]))
        measured = losses[0] - losses[1]
        size = np.sqrt(np.sum(exact[index] ** 2) * np.sum(actual_change**2))
        assert abs(predicted - measured) <= 1e-3 * size, (
            f"{name}: directional derivative {predicted:.6g}, finite difference {measured:.6g}"
        )


@pytest.mark.parametrize("backend", backend_only_params(FEATURE_BACKENDS))
def test_a_row_without_keys_but_with_a_sink_gets_zeros_and_the_sink_logit(backend):
    # Bottom-right causal with Nq - Nk = 3: rows 0-2 see no key. lse there is t_h exactly, as
    # mfa.h states, and out exactly 0.
    case = Case(5, 2, 8, 8, query_heads=2, kv_heads=1, causal=True, sinks=True)
    (q, k, v), modifiers, result = forward_of_case(backend, case)
    if result is not None:
        out, lse = result
        np.testing.assert_array_equal(lse[0, :, :3], np.repeat(modifiers["sinks"][:, None], 3, 1))
        assert np.all(out[:, :, :3] == 0)
        check_forward(case, out, lse, q, k, v, modifiers)
