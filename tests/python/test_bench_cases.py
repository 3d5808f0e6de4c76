"""The benchmark's cases and grids (mfa_native.bench.cases) and its naive numpy attention
(mfa_native.bench.naive, shared with the demo), the latter against the float64 reference."""

import math

import numpy as np
import pytest
import reference
from mfa_native.bench import cli, naive
from mfa_native.bench.cases import AXES, GRIDS, Case, cases


def _cpu_axis_defaults():
    arguments = cli._parser().parse_args([])
    cli._apply_defaults(arguments, "cpu")
    return cli._axis_defaults(arguments)


# Every axis's values where a block names none, as the command line gives them on cpu.
_DEFAULTS = _cpu_axis_defaults()


def _shape(case):
    return (case.batch, case.heads, case.kv_heads, case.seq, case.seq_k, case.dim)


def test_defaults_name_every_axis():
    assert set(_DEFAULTS) == set(AXES)
    assert _DEFAULTS["seq"] == (1024, 2048, 4096) and _DEFAULTS["windows"] == ((256, 0),)


def test_decode_is_the_issue_grid_forward_only():
    decode = GRIDS["decode"]
    selected = cases(decode, _DEFAULTS)
    assert decode.passes == ("fwd",)
    assert len(selected) == 2 * 16  # per dtype: Nq 2 x Nk 2 x Hkv 2 x B 2
    assert {_shape(case) for case in selected} == {
        (batch, 32, kv_heads, seq_q, seq_k, 128)
        for batch in (1, 8)
        for kv_heads in (8, 32)
        for seq_q in (1, 4)
        for seq_k in (4096, 32768)
    }
    assert not any(case.causal or case.window for case in selected)
    assert Case(1, 32, 1, 128, "f32", kv_heads=8, seq_k=4096).label() == (
        "f32 B1 H32/8 Nq1 Nk4096 D128 full"
    )


def test_shapes_hold_the_cpu_targets():
    shapes = {_shape(case) for case in cases(GRIDS["shapes"], _DEFAULTS)}
    for dim in (80, 96, 256):
        assert (1, 8, 8, 2048, 2048, dim) in shapes
    assert (1, 32, 8, 2048, 2048, 128) in shapes  # GQA prefill
    for seq in (128, 256):
        assert (8, 8, 8, seq, seq, 64) in shapes
    assert (4, 8, 8, 2048, 2048, 64) in shapes
    assert not any(case.window for case in cases(GRIDS["shapes"], _DEFAULTS))


def test_readme_takes_the_backend_defaults_in_report_order():
    selected = cases(GRIDS["readme"], _DEFAULTS)
    assert len(selected) == 2 * 2 * 3 * 3  # dtype x D x N x (full, causal, window)
    assert [case.label() for case in selected[:3]] == [
        "f32 B1 H8 N1024 D64 full",
        "f32 B1 H8 N1024 D64 causal",
        "f32 B1 H8 N1024 D64 full window256,0",
    ]


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_quick_is_a_nonempty_part_of_each_grid(name):
    full = set(cases(GRIDS[name], _DEFAULTS))
    quick = set(cases(GRIDS[name], _DEFAULTS, quick=True))
    assert quick and quick < full


def test_options_replace_every_blocks_values():
    overrides = {"dtype": ("f32",), "seq": (512,), "windows": ()}
    selected = cases(GRIDS["shapes"], _DEFAULTS, overrides)
    assert {case.seq for case in selected} == {512} and {case.dtype for case in selected} == {"f32"}
    assert {case.batch for case in selected} == {1, 8, 4}  # what the blocks name stays


def test_kv_heads_must_divide_heads_and_sizes_be_positive():
    with pytest.raises(ValueError, match="kv_heads 3 does not divide heads 8"):
        cases(GRIDS["readme"], _DEFAULTS, {"kv_heads": (3,)})
    with pytest.raises(ValueError, match="sizes must be >= 1: seq 0, seq_k 0"):
        cases(GRIDS["readme"], _DEFAULTS, {"seq": (0,)})
    with pytest.raises(ValueError, match="kv_heads 0"):
        Case(1, 8, 16, 8, "f32", kv_heads=0)


@pytest.mark.parametrize(
    "causal, window, pairs",
    [
        (False, None, 10),  # 2 rows x 5 keys
        (True, None, 3),  # top-left: row 0 sees key 0, row 1 keys 0-1
        (False, (0, 1), 4),  # row 0: keys 0-1, row 1: keys 1-2
    ],
)
def test_pairs_of_fewer_queries_than_keys_align_top_left(causal, window, pairs):
    assert Case(1, 1, 2, 8, "f32", causal, window, seq_k=5).visible_pairs() == pairs


def test_compulsory_bytes_of_decoding_are_mostly_the_cache():
    case = Case(2, 32, 1, 128, "bf16", kv_heads=8, seq_k=4096)
    q = 2 * 32 * 1 * 128 * 2
    kv = 2 * 8 * 4096 * 128 * 2
    assert case.bytes("fwd") == 2 * q + 2 * kv
    lse = 2 * 32 * 1 * 4
    assert case.bytes("fwd+bwd") == 6 * q + 6 * kv + 2 * lse
    assert case.flops("fwd") == 4 * 2 * 32 * 4096 * 128


# ---- The naive attention --------------------------------------------------------------------

# Float32 throughout: a few roundings (2^-24) per product and sums of at most 64 terms, far
# below this bound relative to each output's largest magnitude.
_NAIVE_TOLERANCE = 1e-5


@pytest.mark.parametrize(
    "heads, kv_heads, seq_q, seq_k, causal, window, alignment",
    [
        (4, 4, 16, 16, True, None, "bottom_right"),
        (4, 2, 8, 24, True, None, "bottom_right"),
        (6, 2, 24, 8, True, None, "bottom_right"),  # rows 0-15 see no key
        (4, 1, 16, 32, False, (3, 2), "top_left"),
        (2, 2, 16, 16, True, (4, -1), "top_left"),
    ],
)
def test_naive_attention_matches_the_float64_reference(
    rng, heads, kv_heads, seq_q, seq_k, causal, window, alignment
):
    dim = 16

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    q, dout = normal(2, heads, seq_q, dim), normal(2, heads, seq_q, dim)
    k, v = normal(2, kv_heads, seq_k, dim), normal(2, kv_heads, seq_k, dim)
    scale = 1 / math.sqrt(dim)
    mask = dict(causal=causal, window=window)
    out, lse = naive.attention(q, k, v, scale, alignment=alignment, **mask)
    grads = naive.attention_backward(dout, q, k, v, out, lse, scale, alignment=alignment, **mask)

    expected_out, expected_lse = reference.attention_forward(
        q, k, v, causal_alignment=alignment, scale=scale, **mask
    )
    expected_grads = reference.attention_backward(
        dout, q, k, v, causal_alignment=alignment, scale=scale, **mask
    )
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    seen = np.isfinite(expected_lse)
    np.testing.assert_allclose(lse[seen], expected_lse[seen], atol=_NAIVE_TOLERANCE * 10)
    for got, expected in zip((out, *grads), (expected_out, *expected_grads)):
        assert got.shape == expected.shape and np.all(np.isfinite(got))
        bound = _NAIVE_TOLERANCE * max(float(np.max(np.abs(expected))), 1.0)
        np.testing.assert_allclose(got, expected, rtol=0, atol=bound)
    if not seen.all():  # rows that see no key: zero output and zero query gradient
        assert not out[~seen].any() and not grads[0][~seen].any()
