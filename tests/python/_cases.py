"""The attention problems of the numeric suite, shared by its modules so that every backend runs
the same ones: CASES and SIMULATOR_CASES (test_attention_forward.py and
test_attention_backward.py, each adding its own), and the 0.2 features' MODIFIER_CASES
(test_modifiers.py), PACKED_CASES (test_varlen.py) and PAGED_CASES (test_paged.py).

The lists are pairwise-style rather than a cartesian product: every sequence length, head
dimension, mask kind, head grouping and dtype appears, each next to several of the others.
Lengths and head dimensions are chosen off every block size (1, 7, 33, 129, D = 3, 33, 80...)
so that partial blocks are exercised, and D up to 512 forces head-dimension blocking.
"""

import dataclasses

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


# ---- the 0.2 features ------------------------------------------------------------------------


def pairwise(factors):
    """Rows of levels, one per factor, such that every pair of levels of any two factors
    appears together in some row (a covering array of strength 2), built greedily and
    deterministically: each row starts from the first pair not covered yet and takes, factor
    by factor, the level that covers the most pairs still missing (the first on ties)."""
    names = list(factors)
    missing = {
        (a, i, b, j)
        for x, a in enumerate(names)
        for b in names[x + 1 :]
        for i in range(len(factors[a]))
        for j in range(len(factors[b]))
    }

    def pair(a, i, b, j):
        return (a, i, b, j) if names.index(a) < names.index(b) else (b, j, a, i)

    rows = []
    while missing:
        a, i, b, j = min(missing, key=lambda p: (names.index(p[0]), p[1], names.index(p[2]), p[3]))
        row = {a: i, b: j}
        for name in names:
            if name not in row:
                row[name] = max(
                    range(len(factors[name])),
                    key=lambda level: (
                        sum(pair(name, level, o, row[o]) in missing for o in row),
                        -level,
                    ),
                )
        missing -= {pair(x, row[x], y, row[y]) for x in row for y in row if x != y}
        rows.append({name: factors[name][row[name]] for name in names})
    return rows


# The levels of each 0.2 modifier and of what they combine with. Shapes (Nq, Nk, D, Dv, B)
# are off the block sizes, with Nq > Nk (rows without keys under bottom-right causal) and
# Nq = 1 (decoding); all fit metal-sim's budget.
MODIFIER_FACTORS = {
    "mask": [None, "bool", "bool-keys", "additive", "additive-f32"],
    "shape": [(33, 7, 8, 24, 2), (1, 129, 64, 32, 2), (64, 33, 33, 80, 1), (17, 40, 24, 40, 2)],
    "band": ["none", "causal", "window", "causal+window"],
    "heads": [(2, 2), (4, 1), (6, 2)],
    "softcap": [None, 1.0, 5.0],
    "alibi": [None, "heads", "batch"],
    "sinks": [False, True],
    "dtype": ["f32", "f16", "bf16"],
    "alignment": ["bottom_right", "top_left"],
}


def _modifier_case(row):
    num_queries, num_keys, head_dim, value_dim, batch = row["shape"]
    query_heads, kv_heads = row["heads"]
    band = row["band"]
    return Case(
        num_queries,
        num_keys,
        head_dim,
        value_dim,
        query_heads=query_heads,
        kv_heads=kv_heads,
        batch=batch,
        causal=band.startswith("causal"),
        causal_alignment=row["alignment"],
        window=(5, 3) if band.endswith("window") else None,
        dtype=row["dtype"],
        mask=row["mask"],
        softcap=row["softcap"],
        alibi=row["alibi"],
        sinks=row["sinks"],
    )


# Every pair of levels of MODIFIER_FACTORS, forward and backward; each case has at least one
# modifier.
MODIFIER_CASES = [case for case in map(_modifier_case, pairwise(MODIFIER_FACTORS)) if case.features]


@dataclasses.dataclass(frozen=True)
class PackedCase:
    """Packed sequences (attention_varlen): the offsets, and a Case giving heads, head
    dimensions, dtype, options and modifiers, whose batch is the number of sequences and whose
    lengths are the bounds max_seqlen_q and max_seqlen_k (the sizes its mask covers)."""

    cu_seqlens_q: tuple
    cu_seqlens_k: tuple
    case: Case

    @property
    def id(self):
        lengths = ",".join(
            f"{q1 - q0}x{k1 - k0}"
            for q0, q1, k0, k1 in zip(
                self.cu_seqlens_q, self.cu_seqlens_q[1:], self.cu_seqlens_k, self.cu_seqlens_k[1:]
            )
        )
        return f"seqs{lengths}-{self.case.id}"

    @property
    def scores(self):
        pairs = zip(
            self.cu_seqlens_q, self.cu_seqlens_q[1:], self.cu_seqlens_k, self.cu_seqlens_k[1:]
        )
        return sum(self.case.query_heads * (q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in pairs)

    @property
    def features(self):
        return self.case.features | {"varlen"}


def _packed(cu_q, cu_k, head_dim, value_dim, bound=0, **options):
    """A PackedCase whose bounds are the longest sequences plus bound."""
    lengths_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lengths_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    case = Case(
        max(lengths_q) + bound, max(lengths_k) + bound, head_dim, value_dim,
        batch=len(lengths_q), **options,
    )  # fmt: skip
    return PackedCase(tuple(cu_q), tuple(cu_k), case)


# Sequences of lengths 0 and 1 among longer ones (queries without keys, keys without queries),
# each modifier, both alignments, GQA, every dtype; one with bounds beyond the longest.
PACKED_CASES = [
    _packed((0, 3, 3, 4, 9), (0, 5, 7, 7, 13), 16, 8, query_heads=4, kv_heads=2, causal=True,
            sinks=True),
    _packed((0, 1, 6), (0, 6, 8), 8, 8, query_heads=2, kv_heads=1, window=(2, 1),
            causal_alignment="top_left", mask="bool", alibi="batch", dtype="f16"),
    _packed((0, 0, 2), (0, 4, 4), 24, 16, query_heads=2, kv_heads=2, causal=True,
            causal_alignment="top_left", softcap=2.0, mask="additive-f32", dtype="bf16"),
    _packed((0, 33, 40, 105), (0, 17, 80, 81), 32, 24, query_heads=6, kv_heads=2, causal=True,
            window=(8, 0), alibi="heads", mask="additive", bound=3),
    _packed((0, 5, 12), (0, 9, 9), 16, 16, query_heads=2, kv_heads=1, causal=True, dtype="f16"),
    _packed((0, 1, 2, 3, 4), (0, 50, 51, 100, 129), 64, 64, query_heads=8, kv_heads=1,
            softcap=5.0, sinks=True, dtype="bf16"),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PagedCase:
    """A paged KV cache (attention_with_kvcache): each sequence's cached keys, the new keys
    appended to every one, the block size and count, the layout, and a Case giving Nq, heads,
    head dimensions, dtype, options and modifiers, whose batch is the number of sequences and
    whose num_keys is max_blocks * block_size (the keys its mask covers)."""

    cached: tuple
    new: int
    block_size: int
    num_blocks: int
    layout: str
    case: Case

    @property
    def id(self):
        lengths = ",".join(map(str, self.cached))
        return (
            f"cached{lengths}+{self.new}-block{self.block_size}of{self.num_blocks}-"
            f"{self.layout}-{self.case.id}"
        )

    @property
    def max_blocks(self):
        return self.case.num_keys // self.block_size

    @property
    def scores(self):
        keys = sum(n + self.new for n in self.cached)
        return self.case.query_heads * self.case.num_queries * keys

    @property
    def features(self):
        return self.case.features | {"paged_kv"}


def _paged(cached, new, block_size, num_queries, head_dim, value_dim, layout="bhsd", **options):
    """A PagedCase with the fewest table columns that hold the longest sequence, and two
    blocks more than the sequences need (never read)."""
    blocks = [-(-(n + new) // block_size) for n in cached]
    case = Case(
        num_queries, max(max(blocks), 1) * block_size, head_dim, value_dim, batch=len(cached),
        **options,
    )  # fmt: skip
    return PagedCase(tuple(cached), new, block_size, sum(blocks) + 2, layout, case)


# Decoding and chunked prefill; partial last blocks, an empty cache, one-key sequences; appends;
# each modifier; both layouts; every dtype.
PAGED_CASES = [
    _paged((5, 8, 0, 1), 0, 8, 1, 16, 8, query_heads=4, kv_heads=2, causal=True, sinks=True),
    _paged((3, 17, 30), 3, 16, 3, 16, 16, query_heads=4, kv_heads=1, causal=True,
           alibi="heads", mask="bool-keys", dtype="f16"),
    _paged((3, 17, 30), 3, 16, 3, 16, 16, "bshd", query_heads=4, kv_heads=1, causal=True,
           alibi="heads", mask="bool-keys", dtype="f16"),
    _paged((40, 0), 1, 8, 1, 32, 32, query_heads=8, kv_heads=1, causal=True, window=(16, 0),
           softcap=5.0, dtype="bf16"),
    _paged((100, 57, 129), 0, 32, 4, 24, 40, query_heads=2, kv_heads=2, causal=True,
           causal_alignment="top_left", mask="additive-f32"),
    _paged((9, 24), 2, 8, 2, 8, 8, "bshd", query_heads=2, kv_heads=1, dtype="f16"),
]  # fmt: skip
