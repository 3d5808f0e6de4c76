"""The attention problems that test_attention_forward.py and test_attention_backward.py both run;
each of those adds its own cases to these lists.

The lists are pairwise-style rather than a cartesian product: every sequence length, head
dimension, mask kind, head grouping and dtype appears, each next to several of the others.
Lengths and head dimensions are chosen off every block size (1, 7, 33, 129, D = 3, 33, 80...)
so that partial blocks are exercised, and D up to 512 forces head-dimension blocking.
"""

from _backends import Case

CASES = [
    Case(1, 1, 1, 1),
    Case(1, 1000, 64, 64, query_heads=4, kv_heads=1, causal=True, dtype="f16"),
    # Bottom-right causal with Nq > Nk: all but the last 7 rows see no key, so they need zero
    # outputs and zero gradients.
    Case(1000, 7, 8, 3, query_heads=2, kv_heads=2, causal=True, dtype="bf16"),
    Case(7, 129, 3, 8, query_heads=2, kv_heads=1, causal=True, causal_alignment="top_left"),
    Case(129, 64, 33, 80, query_heads=4, kv_heads=2, window=(16, 0), dtype="f16"),
    Case(64, 129, 80, 33, batch=2, window=(3, 5), causal_alignment="top_left", dtype="bf16"),
    Case(2, 7, 96, 128, query_heads=3, kv_heads=1, window=(0, 0)),
    Case(129, 129, 128, 96, query_heads=2, kv_heads=1, causal=True, dtype="bf16"),
    # Top-left, keys only up to one step back: rows from 3 on see nothing.
    Case(
        7,
        2,
        192,
        256,
        query_heads=2,
        kv_heads=2,
        window=(1, None),
        causal_alignment="top_left",
        dtype="f16",
    ),
    Case(64, 7, 512, 512, causal=True, causal_alignment="top_left", dtype="bf16"),
    Case(2, 1, 33, 1, query_heads=2, kv_heads=1, scale=2.5),
    # A large scale makes the softmax peaky, so the running maximum matters.
    Case(129, 129, 64, 80, causal=True, window=(10, -1), scale=0.9, dtype="f16"),
    Case(1000, 64, 96, 80, window=(0, 2), causal_alignment="top_left", dtype="bf16"),
    Case(7, 7, 1, 3, batch=3, causal=True, scale=-0.5, dtype="f16"),
    Case(64, 1000, 192, 8, query_heads=4, kv_heads=2, window=(None, 10)),
    # Nearly one-hot rows: the running maximum changes late and exp underflows for most keys.
    Case(129, 1000, 64, 64, scale=3.0, dtype="bf16"),
    Case(
        1000,
        129,
        64,
        48,
        batch=2,
        query_heads=6,
        kv_heads=2,
        causal=True,
        causal_alignment="top_left",
    ),
    Case(17, 40, 40, 24, batch=5, query_heads=7, kv_heads=7, causal=True),
    Case(17, 40, 24, 40, batch=2, query_heads=16, kv_heads=1, window=(3, 3), dtype="f16"),
]

# The simulator's grid follows the planner's block tables (native/src/planner/tables.c): head
# dimensions fall into every row of each family and precision class (each test module lists
# the rows of its pass), lengths are off the 16 / 32 row blocks and 32 / 64 / 128 column
# blocks, with one exact multiple.
SIMULATOR_CASES = [
    Case(1, 1, 1, 1),
    Case(7, 33, 12, 8, query_heads=2, kv_heads=2, window=(2, 2)),
    Case(64, 64, 28, 12, causal=True),
    Case(33, 129, 33, 80, window=(16, 0)),
    Case(129, 129, 128, 128, causal=True, window=(40, -1), scale=0.3),
    Case(33, 33, 256, 200, window=(None, 0)),
    Case(2, 64, 512, 512, query_heads=2, kv_heads=1),
    Case(33, 7, 3, 1, query_heads=3, kv_heads=1, scale=2.0, dtype="f16"),
    Case(7, 129, 33, 80, query_heads=2, kv_heads=1, causal=True, dtype="f16"),
    Case(33, 64, 128, 128, causal=True, causal_alignment="top_left", dtype="f16"),
    Case(2, 7, 192, 256, window=(1, 1), causal_alignment="top_left", dtype="f16"),
    Case(
        129,
        33,
        8,
        3,
        query_heads=4,
        kv_heads=2,
        causal=True,
        causal_alignment="top_left",
        dtype="bf16",
    ),
    Case(1, 129, 256, 64, query_heads=4, kv_heads=1, dtype="bf16"),
    Case(7, 2, 512, 96, causal=True, dtype="bf16"),
    # Long sequences: decoding against many keys, and many queries of which most see nothing.
    Case(1, 1000, 64, 64, query_heads=4, kv_heads=1, causal=True, dtype="f16"),
    Case(1000, 7, 8, 3, query_heads=2, kv_heads=2, causal=True, dtype="bf16"),
]


def at_the_largest_head_dim(context):
    """The case both passes run at the context's advertised maximum head dimension D, with
    Dv = D - 24."""
    head_dim = context.capabilities["max_head_dim"]
    return Case(9, 17, head_dim, head_dim - 24, causal=True, dtype="bf16")
