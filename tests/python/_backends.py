"""Shared machinery of the numeric attention suite: which backends each test runs on, the cases
(shapes and options) they get, inputs generated in the storage dtype, and how a result is judged
against the float64 reference in reference.py."""

import dataclasses
import functools
import zlib

import _abi_reference
import mfa_native
import ml_dtypes
import numpy as np
import pytest
import reference
from _errors import raises
from mfa_native import MFAError
from mfa_native._library import ffi, lib

DTYPES = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}

# Unit roundoff 2^-p of a p-bit significand: f32 p = 24, f16 p = 11, bf16 p = 8.
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}


@dataclasses.dataclass(frozen=True)
class Backend:
    """One way of running the suite: a backend name plus, for metal-sim, the simulated GPU family
    and the seed that shuffles the order of simulated threads between barriers."""

    name: str
    gpu_family: str = None
    sim_seed: int = 0

    @property
    def id(self):
        parts = [self.name] + ([self.gpu_family] if self.gpu_family else [])
        parts += [f"seed{self.sim_seed}"] if self.sim_seed else []
        return "-".join(parts)

    @property
    def is_simulator(self):
        return self.name == "metal-sim"

    def context(self):
        # The reference behind the C ABI validates through a cpu context (_abi_reference).
        return _context(Backend("cpu") if self.name == REFERENCE else self)

    def features(self, direction):
        """The capability names of a direction ("forward" or "backward")."""
        if self.name == REFERENCE:
            capabilities = _abi_reference.CAPABILITIES
        else:
            capabilities = self.context().capabilities
        return set(capabilities["features" if direction == "forward" else "backward_features"])


@functools.cache
def _context(backend):
    # One context per backend for the whole session: creating one starts worker threads.
    return mfa_native.Context(
        backend.name, gpu_family=backend.gpu_family, sim_seed=backend.sim_seed
    )


def _available_backends():
    names = mfa_native.available_backends()
    runs = [Backend(name) for name in ("cpu", "metal") if name in names]
    if "metal-sim" in names:
        # apple7 and apple8 share MFA's block-size tables, apple9 has its own: apple8 plans
        # exactly as apple7 (the planner's unit test compares their plans), so a run as apple8
        # would repeat apple7's. The seeded run shuffles thread order to expose missing barriers.
        runs += [Backend("metal-sim", family) for family in ("apple7", "apple9")]
        runs.append(Backend("metal-sim", "apple9", sim_seed=20261129))
    return runs


BACKENDS = _available_backends()

# The float64 reference behind the C ABI (_abi_reference), which has every feature: a run of the
# 0.2 tests on it checks the Python layer and the tests themselves before any backend has a
# feature. conftest.py routes the calls of tests given it through the reference.
REFERENCE = "abi-reference"
FEATURE_BACKENDS = [Backend(REFERENCE), *BACKENDS]


def adapter_backends():
    """pytest params (backend,) of the adapter tests: the reference behind the C ABI, and the
    backend the adapters run by default ("auto")."""
    default = Backend(mfa_native.info()["default_backend"])
    return [
        pytest.param(Backend(REFERENCE), id=REFERENCE),
        pytest.param(default, id=f"auto-{default.id}"),
    ]


def skip_unless_default_has(features):
    """Skip a test of the adapters (which run the default backend) that needs features, forward
    and backward, the default backend lacks."""
    default = Backend(mfa_native.info()["default_backend"])
    missing = features - (default.features("forward") & default.features("backward"))
    if missing:
        pytest.skip(f"the default backend lacks {sorted(missing)}")


def run_or_skip(backend, direction, features, function):
    """function() where the backend has the features; else, having checked that the call
    raises UNSUPPORTED naming one of them (call_with_features), skip with that reason."""
    result = call_with_features(backend, direction, features, function)
    missing = sorted(set(features) - backend.features(direction))
    if missing:
        pytest.skip(
            f"the {backend.name} backend lacks {', '.join(missing)} in the {direction}: "
            "MFAError UNSUPPORTED (checked)"
        )
    return result


def call_with_features(backend, direction, features, function):
    """function() if the backend has every feature the call needs in that direction; else
    check that it raises MFAError UNSUPPORTED naming one of the missing ones (before writing
    anything, as every error), and return None."""
    missing = sorted(set(features) - backend.features(direction))
    if not missing:
        return function()
    with raises(MFAError, status="UNSUPPORTED") as caught:
        function()
    message = caught.value.message
    assert any(f"MFA_FEATURE_{name.upper()}" in message for name in missing), message
    assert message.endswith(f"in the {direction}"), message
    return None


def forward_with_features(backend, case, modifiers, function, *arrays, features=None, **keywords):
    """function(*arrays, **keywords) -- a forward entry point -- with the case's options and
    modifiers, on the backend's context, returning lse: (out, lse), or None where the backend
    lacks one of `features` (default: the case's) in the forward (call_with_features)."""
    return call_with_features(
        backend,
        "forward",
        case.features if features is None else features,
        lambda: function(
            *arrays,
            **case.options,
            **modifiers,
            **keywords,
            return_lse=True,
            backend=backend.context(),
        ),
    )


def backward_with_features(backend, case, modifiers, function, *arrays, features=None):
    """function(*arrays) -- a backward entry point -- with the case's options and modifiers, and
    dsinks where the case has sinks, on the backend's context: the gradients, or None where the
    backend lacks one of `features` (default: the case's) in the backward (call_with_features)."""
    return call_with_features(
        backend,
        "backward",
        case.features if features is None else features,
        lambda: function(
            *arrays,
            **case.options,
            **modifiers,
            return_dsinks=case.sinks,
            backend=backend.context(),
        ),
    )


# The arrays of each direction's mfa_attention_args, in mfa_attention_forward's and
# mfa_attention_backward's order.
_ROLES = {
    lib.MFA_FORWARD: ("q", "k", "v", "out", "lse"),
    lib.MFA_BACKWARD: ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv"),
}


def record_addresses(monkeypatch):
    """A list that receives, for every mfa_attention_compute call from now on, the first-element
    address of each of its arrays in that order (None where absent)."""
    calls = []
    original = mfa_native.Context._call

    def recording_call(self, function, direction, params, args):
        arrays = [getattr(args, role) for role in _ROLES[direction]]
        calls.append(
            [None if a == ffi.NULL else int(ffi.cast("uintptr_t", a.data)) for a in arrays]
        )
        return original(self, function, direction, params, args)

    monkeypatch.setattr(mfa_native.Context, "_call", recording_call)
    return calls


# Score-matrix entries (B * Hq * Nq * Nk) above which a case is too slow for metal-sim, which
# executes every simulated GPU thread on the CPU.
SIMULATOR_MAX_SCORES = 150_000


# The schedule-shuffled run takes the cases of at most this many score entries and this head
# dimension. A missing barrier shows in any kernel with several SIMD groups, and the race
# detector, on in every metal-sim run, names one at any size; the largest cases (long sequences,
# head dimensions up to 512) were half of the shuffled run's time.
SHUFFLED_MAX_SCORES = 20_000
SHUFFLED_MAX_HEAD_DIM = 128


# The runs that take problems beyond those limits (the largest advertised head dimension).
UNSHUFFLED_BACKENDS = [backend for backend in BACKENDS if not backend.sim_seed]


def _largest_head_dim(case):
    """The larger of D and Dv of a Case, or of the Case a packed or paged case wraps."""
    shape = getattr(case, "case", case)
    return max(shape.head_dim, shape.value_dim)


def _is_small(case):
    return case.scores <= SHUFFLED_MAX_SCORES and _largest_head_dim(case) <= SHUFFLED_MAX_HEAD_DIM


def _family_of(case):
    """The one unshuffled family that runs a larger case, picked by a hash of its id: the
    families differ in their block-size tables, which the small cases, run on both, and the
    planner's unit tests cover; the larger cases are most of the simulator's time."""
    return ("apple7", "apple9")[zlib.crc32(case.id.encode()) % 2]


def _cases_on(backend, cases, on_simulator):
    if not backend.is_simulator:
        return cases
    if backend.sim_seed:
        return [case for case in on_simulator if _is_small(case)]
    return [
        case for case in on_simulator if _is_small(case) or _family_of(case) == backend.gpu_family
    ]


def backend_params(cases, simulator_cases):
    """pytest params (backend, case): `cases` on the native backends; on metal-sim,
    `simulator_cases` (chosen for its kernels) and the affordable ones among `cases`: the
    smaller of those on every run (both families, and the schedule-shuffled run), each larger
    one on one family (_family_of)."""
    affordable = [case for case in cases if case.scores <= SIMULATOR_MAX_SCORES]
    on_simulator = list(dict.fromkeys(simulator_cases + affordable))
    return [
        pytest.param(backend, case, id=f"{backend.id}-{case.id}")
        for backend in BACKENDS
        for case in _cases_on(backend, cases, on_simulator)
    ]


def backend_only_params(backends=BACKENDS):
    """pytest params (backend,) for tests whose problem does not depend on the backend."""
    return [pytest.param(backend, id=backend.id) for backend in backends]


def feature_params(cases, simulator_cases=()):
    """pytest params (backend, case) of the 0.2 tests: the reference behind the C ABI and every
    backend (on metal-sim the affordable cases and simulator_cases, as backend_params)."""
    reference_run = [pytest.param(FEATURE_BACKENDS[0], case, id=f"{REFERENCE}-{case.id}")
                     for case in cases]  # fmt: skip
    return reference_run + backend_params(cases, list(simulator_cases))


def _bool_mask(case, rng):
    """[B, Hq, Nq, Nk], 70 % of the pairs kept: some rows of small Nk keep none."""
    return rng.random((case.batch, case.query_heads, case.num_queries, case.num_keys)) < 0.7


def _bool_keys_mask(case, rng):
    """A key-padding mask: [B, 1, 1, Nk] in memory, passed as a [B, Hq, Nq, Nk] view with
    stride 0 over heads and queries."""
    keep = rng.random((case.batch, 1, 1, case.num_keys)) < 0.8
    return np.broadcast_to(keep, (case.batch, case.query_heads, case.num_queries, case.num_keys))


def _additive(case, rng, shape, dtype):
    """Additive values of the scores' size with 15 % -inf, rounded to dtype."""
    values = 2.0 * rng.standard_normal(shape)
    values[rng.random(shape) < 0.15] = -np.inf
    return values.astype(dtype)


# name -> function(case, rng) giving the mask of Case.mask == name.
MASKS = {
    "bool": _bool_mask,
    "bool-keys": _bool_keys_mask,
    # Additive in q's dtype, the same for every batch and head: rank 2, [Nq, Nk].
    "additive": lambda case, rng: _additive(
        case, rng, (case.num_queries, case.num_keys), DTYPES[case.dtype]
    ),
    # Additive float32 per head, [1, Hq, Nq, Nk]: broadcast over the batch by size 1.
    "additive-f32": lambda case, rng: _additive(
        case, rng, (1, case.query_heads, case.num_queries, case.num_keys), np.float32
    ),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention problem: shapes, mask options and storage dtype."""

    num_queries: int
    num_keys: int
    head_dim: int
    value_dim: int
    query_heads: int = 1
    kv_heads: int = 1
    batch: int = 1
    causal: bool = False
    causal_alignment: str = "bottom_right"
    window: tuple = None
    scale: float = None
    dtype: str = "f32"
    # Score modifiers (see modifiers()): a mask kind of MASKS, a softcap, ALiBi slopes per
    # "heads" or per "batch" and head, sinks.
    mask: str = None
    softcap: float = None
    alibi: str = None
    sinks: bool = False

    @property
    def id(self):
        text = (
            f"{self.dtype}-b{self.batch}h{self.query_heads}/{self.kv_heads}"
            f"-n{self.num_queries}x{self.num_keys}-d{self.head_dim}x{self.value_dim}"
        )
        if self.causal:
            text += "-causal"
        if self.causal or self.window is not None:
            text += "-br" if self.causal_alignment == "bottom_right" else "-tl"
        if self.window is not None:
            text += f"-w{self.window[0]},{self.window[1]}"
        if self.scale is not None:
            text += f"-s{self.scale}"
        if self.mask is not None:
            text += f"-mask:{self.mask}"
        if self.softcap is not None:
            text += f"-cap{self.softcap}"
        if self.alibi is not None:
            text += f"-alibi:{self.alibi}"
        if self.sinks:
            text += "-sinks"
        return text

    @property
    def scores(self):
        """Entries of the score matrix: the work of the problem."""
        return self.batch * self.query_heads * self.num_queries * self.num_keys

    @property
    def features(self):
        """The capability names (Context.capabilities) that the case's modifiers need."""
        wanted = {"mask": self.mask, "softcap": self.softcap, "alibi": self.alibi}
        return {name for name, value in wanted.items() if value is not None} | (
            {"sinks"} if self.sinks else set()
        )

    def modifiers(self, rng):
        """The keyword arguments of the case's score modifiers, arrays drawn from rng (after
        inputs()), shared by the library call and the reference."""
        modifiers = {}
        if self.mask is not None:
            modifiers["mask"] = MASKS[self.mask](self, rng)
        if self.softcap is not None:
            modifiers["softcap"] = self.softcap
        if self.alibi is not None:
            shape = (self.query_heads,) if self.alibi == "heads" else (self.batch, self.query_heads)
            # Slopes of real models' size: a key 100 positions away loses 1 to 30 in its score.
            modifiers["alibi_slopes"] = rng.uniform(0.01, 0.3, shape).astype(np.float32)
        if self.sinks:
            # Logits of a row's size (its lse is about log Nk), so that the sink takes a share.
            centre = np.log(max(self.num_keys, 1))
            modifiers["sinks"] = rng.normal(centre, 1.5, self.query_heads).astype(np.float32)
        return modifiers

    @property
    def options(self):
        """Keyword arguments shared by mfa_native.attention and the reference."""
        return {
            "causal": self.causal,
            "causal_alignment": self.causal_alignment,
            "window": self.window,
            "scale": self.scale,
        }

    def rng(self):
        # Seeded by the case so that a failure reproduces alone and in any test order.
        return np.random.default_rng(zlib.crc32(self.id.encode()))

    def array(self, rng, heads, length, dim):
        """Standard normal values rounded to the storage dtype, so that the same numbers,
        upcast exactly, are what the reference sees."""
        shape = (self.batch, heads, length, dim)
        return rng.standard_normal(shape).astype(DTYPES[self.dtype])

    def inputs(self, rng):
        q = self.array(rng, self.query_heads, self.num_queries, self.head_dim)
        k = self.array(rng, self.kv_heads, self.num_keys, self.head_dim)
        v = self.array(rng, self.kv_heads, self.num_keys, self.value_dim)
        return q, k, v

    def output_gradient(self, rng):
        """dout for a backward pass, shaped like the output."""
        return self.array(rng, self.query_heads, self.num_queries, self.value_dim)


def allowed_error(dtype, expected, magnitude, reduction_length, score_size):
    """Largest |actual - expected| accepted, element-wise, by a simple rounding-error model.

    Inputs are exact in the reference (generated in the storage dtype), so errors come from:
      - rounding to the storage dtype: the result once and, on matrix hardware, the
        probabilities or score gradients fed to a second product; each is at most one unit
        roundoff u of the dtype relative to the result, together within 4 u * max|expected|;
      - fp32 arithmetic, relative to `magnitude`, the same sums taken over absolute values
        (so that exact cancellations, like dP - delta on a row with one key, are covered):
        sums of n = `reduction_length` terms whose rounding errors add like a random walk,
        taken generously as 8 u32 sqrt(n), and the scores' own error of that size times
        `score_size` (the size of their terms), which P passes on relatively to everything.
    """
    finite = np.isfinite(expected)
    largest = np.max(np.abs(expected[finite]), initial=0.0)
    accumulation = 8 * UNIT_ROUNDOFF["f32"] * np.sqrt(reduction_length) * (1 + score_size)
    return 4 * UNIT_ROUNDOFF[dtype] * largest + accumulation * magnitude


def assert_close(name, actual, expected, allowed):
    """Assert |actual - expected| <= allowed element-wise, with no NaN or inf where expected is
    finite and exact equality where it is not (the -inf lse of rows that see no key)."""
    actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    finite = np.isfinite(expected)
    broken = finite & ~np.isfinite(actual)
    assert not broken.any(), (
        f"{name}: {broken.sum()} non-finite values where the reference is "
        f"finite, first at {tuple(np.argwhere(broken)[0])}"
    )
    assert np.array_equal(actual[~finite], expected[~finite]), (
        f"{name}: {np.sum(actual[~finite] != expected[~finite])} values differ where the "
        f"reference is infinite"
    )
    error = np.abs(np.subtract(actual, expected, out=np.zeros_like(actual), where=finite))
    excess = np.where(finite, error - allowed, -np.inf)
    if excess.size == 0:  # an empty sequence's queries or keys
        return
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"{name}: got {actual[worst]!r} at {worst}, expected {expected[worst]!r} within "
        f"{np.broadcast_to(allowed, excess.shape)[worst]:.3g}; {np.sum(excess > 0)} of "
        f"{excess.size} elements are off"
    )


def check_forward(case, out, lse, q, k, v, modifiers=None):
    """Compare (out, lse) of a backend with the reference for inputs q, k, v ([B, H, N, D]),
    with the case's options and the given modifiers (Case.modifiers)."""
    options = {**case.options, **(modifiers or {})}
    expected_out, expected_lse = reference.attention_forward(q, k, v, **options)
    out_magnitude, score_size = reference.forward_magnitudes(q, k, v, **options)
    # Scores sum over the head dimension, out over the visible keys.
    reduction_length = case.head_dim + case.num_keys
    largest_score = np.max(score_size, initial=0.0)
    assert_close(
        "out",
        out,
        expected_out,
        allowed_error(case.dtype, expected_out, out_magnitude, reduction_length, largest_score),
    )
    # lse is fp32 whatever the dtype: score errors plus the rounding of lse itself.
    lse_magnitude = score_size + np.abs(np.where(np.isfinite(expected_lse), expected_lse, 0))
    assert_close(
        "lse",
        lse,
        expected_lse,
        allowed_error("f32", expected_lse, lse_magnitude, reduction_length, 0.0),
    )
    empty_rows = ~reference.visible_pairs(q, k, **options).any(axis=-1)
    assert np.all(out[empty_rows] == 0), "rows that see no key must be exactly 0"


def check_backward(case, gradients, dout, q, k, v, out, modifiers=None):
    """Compare (dq, dk, dv), and dsinks when gradients has a fourth entry, of a backend with
    the reference taken around the given out."""
    options = {**case.options, **(modifiers or {})}
    with_dsinks = len(gradients) == 4
    expected = reference.attention_backward(
        dout, q, k, v, out=out, return_dsinks=with_dsinks, **options
    )
    magnitudes = reference.gradient_magnitudes(
        dout, q, k, v, out=out, return_dsinks=with_dsinks, **options
    )
    _, score_size = reference.forward_magnitudes(q, k, v, **options)
    largest_score = np.max(score_size, initial=0.0)
    # dq sums over keys, dk and dv over queries and the query heads of a group; dP, delta and
    # the scores over a head dimension.
    group = case.query_heads // case.kv_heads
    reduction_length = case.head_dim + case.value_dim + case.num_keys + case.num_queries * group
    for name, actual, wanted, magnitude in zip(("dq", "dk", "dv"), gradients, expected, magnitudes):
        assert_close(
            name,
            actual,
            wanted,
            allowed_error(case.dtype, wanted, magnitude, reduction_length, largest_score),
        )
    if with_dsinks:
        # A float32 sum over every batch and row of p_sink delta, delta over Dv products of
        # exact inputs; p_sink = exp(t - lse) is as good as the scores and the given lse.
        _, expected_lse = reference.attention_forward(q, k, v, **options)
        size = largest_score + np.max(np.abs(expected_lse[np.isfinite(expected_lse)]), initial=0)
        assert_close(
            "dsinks",
            gradients[3],
            expected[3],
            allowed_error(
                "f32", expected[3], magnitudes[3], case.batch * case.num_queries + case.value_dim,
                size,
            ),
        )  # fmt: skip
    # Exact zeros: queries that see no key (the contract), keys that no query sees (no terms).
    visible = reference.visible_pairs(q, k, **options)
    dq, dk, dv = gradients[:3]
    assert np.all(dq[~visible.any(axis=-1)] == 0), "queries without keys need dq = 0"
    shape = (case.batch, case.kv_heads, group, case.num_queries, case.num_keys)
    unseen_keys = ~visible.reshape(shape).any(axis=(2, 3))
    assert np.all(dk[unseen_keys] == 0) and np.all(dv[unseen_keys] == 0), (
        "keys that no query sees need dk = dv = 0"
    )
