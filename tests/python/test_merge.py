"""Partial states and mask summaries on every backend: merge_attention_states against the float64
reference (1 to 8 parts, empty ones, mixed dtypes, in place, packed states), attention over key
blocks merged, or accumulated with accumulate=True, equal to one call over all keys, and
mask_summary's codes, and calls given them (block_mask) equal to calls without."""

import mfa_native
import ml_dtypes
import numpy as np
import pytest
import reference
from _backends import (
    BACKENDS,
    DTYPES,
    FEATURE_BACKENDS,
    UNIT_ROUNDOFF,
    Case,
    allowed_error,
    assert_close,
    backend_only_params,
    call_with_features,
    check_forward,
    feature_params,
    forward_with_features,
)

ROUNDOFF = {np.dtype(DTYPES[name]): u for name, u in UNIT_ROUNDOFF.items()}


def merge_parts(rng, count, dtypes, shape=(2, 3, 5, 4)):
    """count parts (outs in the given dtypes, float32 lses of O(1) spread); every third part
    and a few rows of the others saw no key (lse -inf, out NaN: never to be read)."""
    outs, lses = [], []
    for index in range(count):
        out = rng.standard_normal(shape).astype(DTYPES[dtypes[index % len(dtypes)]])
        lse = (3 * rng.standard_normal(shape[:-1])).astype(np.float32)
        empty = rng.random(shape[:-1]) < 0.2
        if index % 3 == 2:
            empty[...] = True
        lse[empty] = -np.inf
        out[empty] = np.nan
        outs.append(out)
        lses.append(lse)
    return outs, lses


def check_merge(out, lse, expected_out, expected_lse):
    """The library merges in double and stores once: out within 2 units of its dtype's
    roundoff of the exact value, lse within 2 of float32's (its log and sum are O(1) apart
    from it)."""
    u = ROUNDOFF[np.asarray(out).dtype]
    assert_close("out", out, expected_out, 2 * u * np.abs(expected_out) + 1e-30)
    if lse is not None:
        assert_close("lse", lse, expected_lse, 2 * 2.0**-24 * (1 + np.abs(expected_lse)))


@pytest.mark.parametrize("backend", backend_only_params())
@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtypes", [("f32",), ("bf16",), ("f16", "f32", "bf16")])
def test_merge_matches_reference(backend, count, dtypes, rng):
    outs, lses = merge_parts(rng, count, dtypes)
    out, lse = mfa_native.merge_attention_states(
        outs, lses, return_lse=True, backend=backend.context()
    )
    assert out.dtype == outs[0].dtype and lse.dtype == np.float32
    check_merge(out, lse, *reference.merge_states(outs, lses))
    # Rows that no part saw: out 0 and lse -inf exactly.
    unseen = np.all([np.isneginf(x) for x in lses], axis=0)
    assert np.all(out[unseen] == 0) and np.all(np.isneginf(lse[unseen]))


@pytest.mark.parametrize("backend", backend_only_params())
def test_merge_in_place_into_one_part_and_into_another_dtype(backend, rng):
    outs, lses = merge_parts(rng, 4, ("f32",))
    expected = reference.merge_states(outs, lses)
    target = np.full(outs[0].shape, 1234.5, ml_dtypes.bfloat16)
    merged = mfa_native.merge_attention_states(outs, lses, out=target, backend=backend.context())
    assert merged is target
    check_merge(target, None, *expected)
    first, first_lse = outs[0], lses[0]
    result = mfa_native.merge_attention_states(
        outs, lses, out=first, lse=first_lse, return_lse=True, backend=backend.context()
    )
    assert result[0] is first and result[1] is first_lse
    check_merge(first, first_lse, *expected)


@pytest.mark.parametrize("backend", backend_only_params())
def test_merge_of_packed_states_in_their_layout(backend, rng):
    # attention_varlen's out [total, H, Dv] and lse [H, total]: rank 3 in layout "bshd".
    outs, lses = merge_parts(rng, 3, ("f16",), shape=(1, 3, 7, 4))
    packed = [np.ascontiguousarray(np.swapaxes(x[0], 0, 1)) for x in outs]
    out, lse = mfa_native.merge_attention_states(
        packed, [x[0] for x in lses], layout="bshd", return_lse=True, backend=backend.context()
    )
    expected_out, expected_lse = reference.merge_states(outs, lses)
    check_merge(np.swapaxes(out, 0, 1)[None], lse[None], expected_out, expected_lse)


# Key blocks of one problem: partial blocks, an empty block, sinks (in the first call only).
STATE_CASE = Case(33, 100, 16, 24, batch=2, query_heads=4, kv_heads=2, causal=True, sinks=True)
BLOCKS = [(0, 37), (37, 37), (37, 64), (64, 100)]


def _over_key_blocks(backend, q, k, v, modifiers, features=(), **keywords):
    """attention(**keywords) over each non-empty block of BLOCKS in turn, the sinks in the first
    call only: the results, or None where the backend lacks a feature a call needs (checked to
    raise UNSUPPORTED)."""
    results = []
    for index, (start, stop) in enumerate(BLOCKS):
        if start == stop:
            continue
        block = {"sinks": modifiers["sinks"]} if index == 0 else {}
        result = call_with_features(
            backend,
            "forward",
            set(features) | (set(block) & {"sinks"}),
            lambda block=block, start=start, stop=stop: mfa_native.attention(
                q,
                k[:, :, start:stop],
                v[:, :, start:stop],
                window=(None, 67 - start),
                causal_alignment="top_left",
                **block,
                **keywords,
                backend=backend.context(),
            ),
        )
        if result is None:
            return None
        results.append(result)
    return results


@pytest.mark.parametrize("backend", backend_only_params(FEATURE_BACKENDS))
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_attention_over_key_blocks_merged_equals_one_call(backend, dtype):
    """Bottom-right causal over all 100 keys is, for each block, the rule with the block's
    own aligned position: a top-left window (the queries' offset is Nk - Nq = 67)."""
    case = Case(**{**STATE_CASE.__dict__, "dtype": dtype})
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    results = _over_key_blocks(backend, q, k, v, modifiers, return_lse=True)
    if results is None:
        return
    outs, lses = [out for out, _ in results], [lse for _, lse in results]
    out, lse = mfa_native.merge_attention_states(
        outs, lses, return_lse=True, backend=backend.context()
    )
    # The parts' errors (as in check_forward) plus one more rounding of out.
    expected_out, _ = reference.attention_forward(q, k, v, **case.options, **modifiers)
    slack = ROUNDOFF[q.dtype] * np.max(np.abs(expected_out))
    _check_with_slack(case, out, lse, q, k, v, modifiers, slack)


def _check_with_slack(case, out, lse, q, k, v, modifiers, slack):
    """check_forward's bound on out widened by slack (the roundings of intermediate states)."""
    options = {**case.options, **modifiers}
    expected_out, expected_lse = reference.attention_forward(q, k, v, **options)
    magnitude, score_size = reference.forward_magnitudes(q, k, v, **options)
    reduction = case.head_dim + case.num_keys
    allowed = allowed_error(case.dtype, expected_out, magnitude, reduction, np.max(score_size))
    assert_close("out", out, expected_out, allowed + slack)
    lse_magnitude = score_size + np.abs(np.where(np.isfinite(expected_lse), expected_lse, 0))
    assert_close(
        "lse", lse, expected_lse, allowed_error("f32", expected_lse, lse_magnitude, reduction, 0)
    )


@pytest.mark.parametrize("backend", backend_only_params(FEATURE_BACKENDS))
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_accumulating_key_blocks_into_an_initial_state_equals_one_call(backend, dtype):
    case = Case(**{**STATE_CASE.__dict__, "dtype": dtype})
    rng = case.rng()
    q, k, v = case.inputs(rng)
    modifiers = case.modifiers(rng)
    out = np.full((case.batch, case.query_heads, case.num_queries, case.value_dim), np.nan, q.dtype)
    lse = np.full(out.shape[:3], -np.inf, np.float32)  # an empty state: out is never read
    results = _over_key_blocks(
        backend, q, k, v, modifiers, {"initial_state"}, out=out, lse=lse, accumulate=True
    )
    if results is None:
        return
    assert all(result is out for result in results)
    steps = len(results)
    # Each step stores the state in q's dtype once more.
    expected_out, _ = reference.attention_forward(q, k, v, **case.options, **modifiers)
    slack = steps * ROUNDOFF[q.dtype] * np.max(np.abs(expected_out))
    _check_with_slack(case, out, lse, q, k, v, modifiers, slack)


# ---- mask summaries --------------------------------------------------------------------------


def summary_masks(rng):
    """(name, mask, seq_q, seq_k): every mask dtype, broadcast forms, partial blocks."""
    causal = reference.visible_keys(130, 200, causal=True, causal_alignment="top_left")
    documents = np.zeros((200, 200), bool)
    for start, stop in [(0, 70), (70, 71), (71, 200)]:
        documents[start:stop, start:stop] = True
    additive = np.where(causal, 0.0, -np.inf)
    additive[5, 3] = 0.5  # one added value makes its block mixed
    per_batch = rng.random((3, 1, 65, 129)) < 0.5
    per_batch[1] = True
    per_batch[2] = False
    return [
        ("causal bool", causal, 130, 200),
        ("documents bool, stride 0 over batch and heads",
         np.broadcast_to(documents, (2, 4, 200, 200)), 200, 200),
        ("additive float32", additive.astype(np.float32), 130, 200),
        ("additive float16", additive.astype(np.float16), 130, 200),
        ("additive bfloat16 with NaN", np.where(causal, np.nan, 0).astype(ml_dtypes.bfloat16),
         130, 200),
        ("per batch, one row for every query", per_batch[:, :, :1], 65, 129),
        ("per batch", per_batch, 65, 129),
    ]  # fmt: skip


@pytest.mark.parametrize("backend", backend_only_params())
@pytest.mark.parametrize("index", range(7))
def test_mask_summary_matches_reference(backend, index, rng):
    name, mask, seq_q, seq_k = summary_masks(rng)[index]
    summary = mfa_native.mask_summary(mask, seq_q, seq_k, backend=backend.context())
    expected = reference.mask_summary(mask, seq_q, seq_k)
    assert summary.dtype == np.uint8 and summary.shape == expected.shape, name
    np.testing.assert_array_equal(summary, expected, err_msg=name)


def test_mask_summary_of_a_torch_mask_is_a_torch_tensor():
    torch = pytest.importorskip("torch")
    mask = torch.from_numpy(reference.visible_keys(70, 70, causal=True))
    summary = mfa_native.mask_summary(mask, 70, 70, backend=BACKENDS[0].context())
    assert isinstance(summary, torch.Tensor) and summary.dtype == torch.uint8
    np.testing.assert_array_equal(summary.numpy(), reference.mask_summary(mask.numpy(), 70, 70))


def _documents(num_queries, num_keys):
    """Two documents of a packed training batch, causal within each, hidden across."""
    keep = np.zeros((num_queries, num_keys), bool)
    for start, stop in [(0, 64), (64, 200)]:
        keep[start:stop, start:stop] = reference.visible_keys(
            stop - start, stop - start, causal=True
        )
    return keep


def _banded(num_queries, num_keys):
    """An additive sliding window of 150 keys (0 inside, -inf outside) with a bias on a few keys
    near the diagonal."""
    values = np.where(reference.visible_keys(num_queries, num_keys, window=(150, 0)), 0.0, -np.inf)
    values[100:110, 160:165] = 0.75
    return values.astype(np.float32)


# (case, its mask): whole tiles hidden, whole tiles plain and mixed ones, for both mask kinds.
BLOCK_MASK_CASES = [
    (Case(200, 200, 32, 32, query_heads=4, kv_heads=2, mask="bool"), _documents),
    (Case(130, 200, 16, 16, batch=2, query_heads=2, kv_heads=1, mask="additive-f32",
          dtype="bf16"), _banded),
]  # fmt: skip


@pytest.mark.parametrize("backend, case", feature_params([case for case, _ in BLOCK_MASK_CASES]))
def test_a_block_mask_gives_what_its_mask_gives(backend, case):
    rng = case.rng()
    q, k, v = case.inputs(rng)
    masks = {case.mask: make for case, make in BLOCK_MASK_CASES}
    modifiers = {"mask": masks[case.mask](case.num_queries, case.num_keys)}
    summary = mfa_native.mask_summary(modifiers["mask"], case.num_queries, case.num_keys)
    assert set(np.unique(summary)) == {0, 1, 2}  # tiles to skip, to read plainly, to mask
    result = forward_with_features(
        backend,
        case,
        modifiers,
        mfa_native.attention,
        q,
        k,
        v,
        features=case.features | {"block_mask"},
        block_mask=summary,
    )
    if result is not None:
        check_forward(case, *result, q, k, v, modifiers)
