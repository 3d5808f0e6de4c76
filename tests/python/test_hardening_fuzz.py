"""Property-based fuzzing of the Python API (hypothesis), the counterpart of tests/fuzz:

- valid calls, drawn over shapes, dtypes, layouts, strided and negative-stride views, rank 3 and
  4, masks, windows, scales and GQA, on every available backend, match the float64 reference
  of reference.py, forward and backward, and write only the outputs they return;
- invalid calls, a valid call with one thing broken (forward and backward), raise TypeError,
  ValueError or mfa_native.MFAError with a message naming the culprit, and leave the given
  outputs and the inputs untouched.

Skipped when hypothesis is not installed. Examples per test: 40, or MFA_HYPOTHESIS_EXAMPLES
for long runs (docs/fuzzing.md). The search is derandomized, so a CI failure reproduces.
"""

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
import mfa_native  # noqa: E402
import reference  # noqa: E402
from _backends import DTYPES, UNIT_ROUNDOFF  # noqa: E402
from _errors import raises  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("MFA_HYPOTHESIS_EXAMPLES", "40"))
# Derandomized and without an example database: the same examples on every run, and no
# .hypothesis directory left in the checkout.
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BACKENDS = mfa_native.available_backends()


# ---- The float64 reference and the error bound ----------------------------------------------


def expected(q, k, v, dout, *, causal, alignment, window, scale):
    """{name: (value, magnitude)} for out, lse, dq, dk, dv in float64, from [B, H, N, D] arrays,
    the scale rounded to float32 as the API rounds it."""
    options = {
        "causal": causal,
        "causal_alignment": alignment,
        "window": window,
        "scale": None if scale is None else float(np.float32(scale)),
    }
    out, lse = reference.attention_forward(q, k, v, **options)
    out_magnitude, _ = reference.forward_magnitudes(q, k, v, **options)
    gradients = reference.attention_backward(dout, q, k, v, **options)
    magnitudes = reference.gradient_magnitudes(dout, q, k, v, **options)
    return {
        "out": (out, out_magnitude),
        "lse": (lse, 1 + np.abs(np.where(np.isfinite(lse), lse, 0))),
        **dict(zip(("dq", "dk", "dv"), zip(gradients, magnitudes))),
    }


def assert_close(name, got, want, dtype, magnitude, terms):
    """|got - want| within 4 u of the largest |want| (rounding to the storage dtype, once for
    the result and once for a probability or dS fed to a second product), plus fp32 sums of
    `terms` terms and one storage rounding of the given out (backward) relative to
    `magnitude`; non-finite entries (the -inf lse of empty rows) must match exactly."""
    got = np.asarray(got, np.float64)
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite]), f"{name}: non-finite entries differ"
    largest = np.max(np.abs(want[finite]), initial=0.0)
    per_magnitude = 16 * UNIT_ROUNDOFF["f32"] * np.sqrt(terms) + 2 * UNIT_ROUNDOFF[dtype]
    allowed = 4 * UNIT_ROUNDOFF[dtype] * largest + per_magnitude * magnitude
    excess = np.where(finite, np.abs(got - np.where(finite, want, 0)) - allowed, -np.inf)
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"{name}{worst}: got {got[worst]!r}, reference {want[worst]!r}, "
        f"allowed error {np.broadcast_to(allowed, want.shape)[worst]:.3g}"
    )


# ---- Drawing problems -----------------------------------------------------------------------


@st.composite
def problems(draw):
    heads_kv = draw(st.integers(1, 2))
    problem = {
        "backend": draw(st.sampled_from(BACKENDS)),
        "dtype": draw(st.sampled_from(sorted(DTYPES))),
        "batch": draw(st.integers(1, 2)),
        "heads_kv": heads_kv,
        "heads_q": heads_kv * draw(st.integers(1, 3)),
        "nq": draw(st.integers(1, 20)),
        "nk": draw(st.integers(1, 20)),
        "d": draw(st.integers(1, 16)),
        "dv": draw(st.integers(1, 16)),
        "layout": draw(st.sampled_from(["bhsd", "bshd"])),
        "rank3": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "alignment": draw(st.sampled_from(["bottom_right", "top_left"])),
        "window": draw(st.none() | st.tuples(st.integers(-1, 6), st.integers(-1, 6))),
        "scale": draw(st.none() | st.floats(-2, 2).filter(lambda x: abs(x) > 1e-3)),
        # Inputs as views: every other element of a padded buffer, possibly reversed.
        "step": draw(st.sampled_from([1, 2])),
        "reverse": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }
    if problem["rank3"]:
        problem["batch"] = 1
    return problem


def make_array(rng, problem, heads, length, dim):
    """A [B, H, N, D] array in the problem's dtype, returned as the view the API gets: in its
    layout and rank, every `step`-th sequence position of a larger buffer, maybe reversed."""
    base = rng.uniform(-1, 1, (problem["batch"], heads, length * problem["step"], dim))
    logical = base.astype(DTYPES[problem["dtype"]])[:, :, :: problem["step"]]
    if problem["reverse"]:
        logical = logical[:, :, ::-1]
    return logical, to_api(logical, problem)


def to_api(logical, problem):
    view = logical.transpose(0, 2, 1, 3) if problem["layout"] == "bshd" else logical
    return view[0] if problem["rank3"] else view


def from_api(array, problem):
    """The [B, H, N, D] view of an array in the problem's layout and rank."""
    if problem["rank3"]:
        array = array[None]
    return array.transpose(0, 2, 1, 3) if problem["layout"] == "bshd" else array


def options(problem):
    return {
        "causal": problem["causal"],
        "causal_alignment": problem["alignment"],
        "window": problem["window"],
        "scale": problem["scale"],
        "layout": problem["layout"],
        "backend": problem["backend"],
    }


def inputs(problem):
    rng = np.random.default_rng(problem["seed"])
    q = make_array(rng, problem, problem["heads_q"], problem["nq"], problem["d"])
    k = make_array(rng, problem, problem["heads_kv"], problem["nk"], problem["d"])
    v = make_array(rng, problem, problem["heads_kv"], problem["nk"], problem["dv"])
    dout = make_array(rng, problem, problem["heads_q"], problem["nq"], problem["dv"])
    return q, k, v, dout


# ---- Valid calls ----------------------------------------------------------------------------


@pytest.mark.skipif(not BACKENDS, reason="no backend available")
@SETTINGS
@given(problems())
def test_valid_calls_match_the_reference(problem):
    (q, q_api), (k, k_api), (v, v_api), (dout, dout_api) = inputs(problem)
    before = [x.copy() for x in (q_api, k_api, v_api, dout_api)]
    out, lse = mfa_native.attention(q_api, k_api, v_api, return_lse=True, **options(problem))
    dq, dk, dv = mfa_native.attention_backward(
        dout_api, q_api, k_api, v_api, out, lse, **options(problem)
    )
    for given_array, copy in zip((q_api, k_api, v_api, dout_api), before):
        assert np.array_equal(given_array.view(np.uint8), copy.view(np.uint8)), "an input changed"

    want = expected(
        q,
        k,
        v,
        dout,
        causal=problem["causal"],
        alignment=problem["alignment"],
        window=problem["window"],
        scale=problem["scale"],
    )
    terms = problem["nk"] + problem["d"] + problem["dv"] + problem["nq"] * 3
    lse4 = lse[None] if problem["rank3"] else lse
    got = {
        "out": from_api(out, problem),
        "lse": lse4,
        "dq": from_api(dq, problem),
        "dk": from_api(dk, problem),
        "dv": from_api(dv, problem),
    }
    for name, (value, magnitude) in want.items():
        assert_close(
            name, got[name], value, "f32" if name == "lse" else problem["dtype"], magnitude, terms
        )


# ---- Invalid calls --------------------------------------------------------------------------


def breakages(problem, q, k, v):
    """(description, keyword changes to attention(), exception types, text the message names)."""
    other = {"f32": np.float16, "f16": np.float32, "bf16": np.float32}[problem["dtype"]]
    wrong_rank = q[None] if q.ndim == 3 else q[0]
    seq_axis = {"bhsd": 2, "bshd": 1}[problem["layout"]] - (1 if problem["rank3"] else 0)
    return [
        ("k of another dtype", {"k": k.astype(other)}, (TypeError,), "k"),
        ("v not an array", {"v": v.tolist()}, (TypeError,), "v"),
        ("q of the wrong rank", {"q": wrong_rank}, (ValueError,), "rank"),
        ("v with one key fewer than k", {"v": np.delete(v, 0, axis=seq_axis)}, (ValueError,), "v"),
        ("layout unknown", {"layout": "sbhd"}, (ValueError,), "layout"),
        ("window with -2", {"window": (-2, 0)}, (ValueError,), "window"),
        ("window not a pair", {"window": (1, 2, 3)}, (ValueError,), "window"),
        ("scale NaN", {"scale": float("nan")}, (ValueError,), "scale"),
        ("scale infinite", {"scale": float("inf")}, (ValueError,), "scale"),
        ("causal not a bool", {"causal": 1}, (TypeError,), "causal"),
        ("alignment unknown", {"causal_alignment": "center"}, (ValueError,), "causal_alignment"),
        ("backend unknown", {"backend": "tpu"}, (ValueError,), "backend"),
    ]


@pytest.mark.skipif(not BACKENDS, reason="no backend available")
@SETTINGS
@given(problems(), st.data())
def test_invalid_calls_raise_and_write_nothing(problem, data):
    (_, q), (_, k), (_, v), _ = inputs(problem)
    reference_out = mfa_native.attention(q, k, v, **options(problem))
    description, change, errors, names = data.draw(st.sampled_from(breakages(problem, q, k, v)))
    out = np.full_like(reference_out, 7)
    arguments = {"q": q, "k": k, "v": v, **options(problem), "out": out}
    arguments.update(change)
    with raises(errors) as raised:
        mfa_native.attention(
            arguments.pop("q"), arguments.pop("k"), arguments.pop("v"), **arguments
        )
    message = str(raised.value)
    assert message, f"{description}: empty message"
    assert names in message, f"{description}: message {message!r} does not name {names!r}"
    assert np.all(out == 7), f"{description}: out was written"


@pytest.mark.skipif(not BACKENDS, reason="no backend available")
@SETTINGS
@given(problems(), st.sampled_from(["q", "k", "v"]))
def test_out_overlapping_an_input_is_refused(problem, victim):
    (_, q), (_, k), (_, v), _ = inputs(problem)
    shape = mfa_native.attention(q, k, v, **options(problem)).shape
    arrays = {"q": q, "k": k, "v": v}
    # out carved from the same memory as the input: a flat buffer holding both.
    needed = int(np.prod(shape)) + arrays[victim].size
    buffer = np.zeros(needed, DTYPES[problem["dtype"]])
    shared = buffer[: arrays[victim].size].reshape(arrays[victim].shape)
    shared[...] = arrays[victim]
    arrays[victim] = shared
    out = buffer[: int(np.prod(shape))].reshape(shape)
    snapshot = buffer.copy()
    with raises((ValueError, mfa_native.MFAError)) as raised:
        mfa_native.attention(arrays["q"], arrays["k"], arrays["v"], out=out, **options(problem))
    assert "overlap" in str(raised.value), str(raised.value)
    assert np.array_equal(buffer.view(np.uint8), snapshot.view(np.uint8)), "memory was written"


def backward_breakages(problem, dout, lse, dq, dk, dv, v):
    """(description, keyword changes to attention_backward(), exception types, named text)."""
    other = {"f32": np.float16, "f16": np.float32, "bf16": np.float32}[problem["dtype"]]
    read_only = dk.copy()
    read_only.flags.writeable = False
    return [
        ("lse in float64", {"lse": lse.astype(np.float64)}, (TypeError,), "lse"),
        ("lse one row short", {"lse": lse[..., :-1]}, (ValueError,), "lse"),
        ("dout of another dtype", {"dout": dout.astype(other)}, (TypeError,), "dout"),
        (
            "dq shaped like dk",
            {"dq": np.zeros_like(dk)}
            if dk.shape != dq.shape
            else {"dq": np.zeros(dq.shape[:-1] + (dq.shape[-1] + 1,), dq.dtype)},
            (ValueError,),
            "dq",
        ),
        ("dk read-only", {"dk": read_only}, (ValueError,), "dk"),
        ("dv is v", {"dv": v}, (ValueError, mfa_native.MFAError), "overlap"),
    ]


@pytest.mark.skipif(not BACKENDS, reason="no backend available")
@SETTINGS
@given(problems(), st.data())
def test_invalid_backward_calls_raise_and_write_nothing(problem, data):
    (_, q), (_, k), (_, v), (_, dout) = inputs(problem)
    out, lse = mfa_native.attention(q, k, v, return_lse=True, **options(problem))
    dq, dk, dv = (np.full_like(x, 7) for x in (q, k, v))
    v_before = v.copy()
    description, change, errors, names = data.draw(
        st.sampled_from(backward_breakages(problem, dout, lse, dq, dk, dv, v))
    )
    arguments = {
        "dout": dout,
        "q": q,
        "k": k,
        "v": v,
        "out": out,
        "lse": lse,
        "dq": dq,
        "dk": dk,
        "dv": dv,
        **options(problem),
    }
    arguments.update(change)
    positional = [arguments.pop(name) for name in ("dout", "q", "k", "v", "out", "lse")]
    with raises(errors) as raised:
        mfa_native.attention_backward(*positional, **arguments)
    message = str(raised.value)
    assert names in message, f"{description}: message {message!r} does not name {names!r}"
    for name, given_array in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.all(given_array == 7), f"{description}: {name} was written"
    assert np.array_equal(v.view(np.uint8), v_before.view(np.uint8)), f"{description}: v changed"
