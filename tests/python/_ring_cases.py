"""The cases of the ring attention tests (test_ring.py on torch.distributed, test_ring_mlx.py on
mx.distributed) and how a ring's result, put back together from its ranks, is judged against
the float64 reference of the whole sequence in one process."""

import numpy as np
import reference
from _backends import UNIT_ROUNDOFF, Case, allowed_error, assert_close

# (case, layout, split). Global lengths are multiples of 2 * 4 so that both world sizes split
# them; chunks of 3 to 14 rows are off every block size. Causal needs the zig-zag split; the
# non-causal ring takes any split, and the contiguous one is tested too.
RING_CASES = [
    (Case(56, 56, 16, 16, query_heads=4, kv_heads=2, causal=True, causal_alignment="top_left"),
     "bhsd", "zigzag"),
    (Case(40, 40, 8, 12, query_heads=2, kv_heads=2, batch=2, scale=0.3), "bhsd", "contiguous"),
    (Case(24, 24, 16, 8, query_heads=2, kv_heads=1, causal=True, causal_alignment="top_left"),
     "bshd", "zigzag"),
    (Case(56, 56, 16, 16, query_heads=4, kv_heads=1, causal=True, causal_alignment="top_left",
          dtype="bf16"), "bhsd", "zigzag"),
    (Case(40, 40, 16, 16, query_heads=2, kv_heads=1, dtype="bf16"), "bhsd", "zigzag"),
]  # fmt: skip


def case_id(ring_case):
    case, layout, split = ring_case
    return f"{case.id}-{layout}-{split}"


def seq_axis(layout):
    return 2 if layout == "bhsd" else 1


def case_inputs(case):
    """q, k, v and dout in the storage dtype as numpy [B, H, N, D] (what the reference reads)."""
    rng = case.rng()
    q, k, v = case.inputs(rng)
    return q, k, v, case.output_gradient(rng)


def check_ring_result(case, world, out, lse, dq, dk, dv):
    """The ring's global out, lse, dq, dk and dv ([B, H, N, D] numpy) against the reference."""
    q, k, v, dout = case_inputs(case)
    options = case.options
    unit = UNIT_ROUNDOFF[case.dtype]

    # Forward: check_forward's error model over the global problem, plus the ring's own
    # rounding: each step's partial out, a convex combination of rows of v, is stored in the
    # dtype once before the float32 merge (at most u max|v|: the merge's weights sum to 1).
    expected_out, expected_lse = reference.attention_forward(q, k, v, **options)
    magnitude, score_size = reference.forward_magnitudes(q, k, v, **options)
    reduction = case.head_dim + case.num_keys
    largest_score = np.max(score_size)
    allowed = allowed_error(case.dtype, expected_out, magnitude, reduction, largest_score)
    assert_close("out", out, expected_out, allowed + unit * np.max(np.abs(v.astype(np.float64))))
    # lse: float32 whatever the dtype; the merge adds a few float32 roundings of |lse|.
    lse_magnitude = score_size + np.abs(expected_lse)
    assert_close(
        "lse", lse, expected_lse, allowed_error("f32", expected_lse, lse_magnitude, reduction, 0)
    )

    # Backward around the ring's out (delta is computed from it), as check_backward does, plus
    # the ring's rounding: each of the (at most `world`) blocks' contributions to dq, dk and dv
    # is stored in the dtype before the float32 sum, each at most u times the gradient's
    # magnitude (the same sums over absolute values, which bound every partial sum).
    expected = reference.attention_backward(dout, q, k, v, out=out, **options)
    magnitudes = reference.gradient_magnitudes(dout, q, k, v, out=out, **options)
    group = case.query_heads // case.kv_heads
    reduction = case.head_dim + case.value_dim + case.num_keys + case.num_queries * group
    for name, actual, wanted, size in zip(("dq", "dk", "dv"), (dq, dk, dv), expected, magnitudes):
        allowed = allowed_error(case.dtype, wanted, size, reduction, largest_score)
        assert_close(name, actual, wanted, allowed + world * unit * size)
