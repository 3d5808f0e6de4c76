#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/fuzz_attention.c into tests/fuzz/corpus/.

Each seed is one named call in the input format of docs/fuzzing.md: valid problems of every
dtype, layout and mask, then one hostile change at a time, so that the fuzzer starts from inputs
that already reach every validation rule and the reference check. Re-run after changing the
format, and commit the result:  python3 tests/fuzz/make_corpus.py
The inputs that long fuzz runs found, beside the seeds in tests/fuzz/found/, are pick_found.py's.
"""

import pathlib
import re
import struct

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
DECODER = pathlib.Path(__file__).resolve().parent / "fuzz_attention.c"
_C_CONSTANTS = {
    "INT64_MAX": 2**63 - 1,
    "INT64_MIN": -(2**63),
    "INT32_MAX": 2**31 - 1,
    "INT32_MIN": -(2**31),
}


def c_table(name):
    """The values of the decoder's integer table `name` (a static const array of
    fuzz_attention.c), so that the seeds pick from the table the decoder has: its entries are
    integer expressions of literals, shifts, INT64_MAX/MIN and INT32_MAX/MIN."""
    body = re.search(rf"\b{name}\[\] = \{{(.*?)\}};", DECODER.read_text(), re.S).group(1)
    values = []
    for entry in filter(None, (e.strip() for e in body.split(","))):
        expression = re.sub(r"\((u?int(32|64)_t)\)", "", entry).replace("/", "//")
        values.append(eval(expression, {"__builtins__": {}}, _C_CONSTANTS))
    return tuple(values)


FORWARD, BACKWARD, CONTEXT, COMPUTE_FORWARD, COMPUTE_BACKWARD, MERGE, SUMMARY, FEATURES = range(8)
ROLES = ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv")
# Indices into the decoder's tables (fuzz_attention.c).
MUTATIONS = (
    "null_tensor",
    "null_data",
    "dtype",
    "shape",
    "shape_nudge",
    "stride",
    "misalign",
    "alias",
    "wild_pointer",
)
HOSTILE = c_table("hostile_values")
SCALES = ("default", 0.125, 0.5, 1.0, 2.0, -0.75, 1e-3, 1e-30, "nan", "inf", "-inf")
STRUCT_SIZES = ("sizeof", 0, 8, "sizeof-8", "sizeof+8", 2**40)
WINDOWS = (-1, -1, 0, 1, 3, 17, -2, -(2**63), 2**63 - 1, 2**63 - 2, 2**40)


def hostile(value):
    """The bytes selecting value: its table index, or the raw-value escape and 8 bytes."""
    if value in HOSTILE:
        return bytes([HOSTILE.index(value)])
    return bytes([len(HOSTILE)]) + struct.pack("<q", value)


def attention(
    op,
    *,
    context=0,
    dtype=0,
    batch=1,
    heads_kv=1,
    group=1,
    seq_q=5,
    seq_k=7,
    head_dim=8,
    head_dim_v=8,
    layouts=None,
    null_params=False,
    struct_size="sizeof",
    scale="default",
    causal=0,
    alignment=0,
    window=(-1, -1),
    mutations=(),
):
    data = bytes([op, context]) + struct.pack("<Q", 0x5EED0000 + seq_q * 131 + seq_k)
    data += bytes([dtype]) if dtype in (0, 1, 2) else bytes([3, dtype & 0xFF])
    data += bytes(
        [batch - 1, heads_kv - 1, group - 1, seq_q - 1, seq_k - 1, head_dim - 1, head_dim_v - 1]
    )
    layouts = layouts or {}
    for role in ROLES:
        order, padding, negative = layouts.get(role, (0, 0, 0))
        data += bytes([order, padding, negative])
    size_index = STRUCT_SIZES.index(struct_size)
    flags = 0 if null_params else (1 | (5 << 3 if size_index else 0))
    data += bytes([flags]) + (bytes([size_index]) if size_index else b"")
    data += bytes(
        [
            SCALES.index(scale),
            causal if causal in (0, 1) else causal & 0xFF,
            alignment if alignment in (0, 1) else alignment & 0xFF,
            WINDOWS.index(window[0]),
            WINDOWS.index(window[1]),
        ]
    )
    data += bytes([len(mutations)])
    for kind, role, other, dim, value in mutations:
        data += bytes([MUTATIONS.index(kind), ROLES.index(role), ROLES.index(other), dim])
        data += bytes([value > 0]) if kind == "shape_nudge" else hostile(value)
    return data


SOFTCAPS = (0.0, 0.0, 0.0, 1.5, 50.0, -1.0, "nan", "inf", "-0")
# Appended to MUTATIONS for the arrays of merges and mask summaries.
ARRAY_MUTATIONS = MUTATIONS + ("same_view", "shifted_view")


def compute(
    op,
    *,
    args=0,
    direction=0,
    softcap=0.0,
    initial_state=0,
    offset=None,
    buffer=None,
    buffer_only=False,
    **problem,
):
    """A forward or backward call through mfa_attention_compute: the attention() bytes, then
    args.struct_size (0 sizeof, 1 sizeof + 8, 2 8, 3 0, 4 NULL args), direction (0 the call's,
    240-243 invalid values, 244+ through mfa_attention_encode), softcap, initial state, an
    array whose byte_offset moves its data back by a hostile value, and one given a device
    buffer."""
    data = attention(op, **problem)
    data += bytes([0 if args == 0 else args + 3, direction, SOFTCAPS.index(softcap)])
    data += bytes([initial_state + 2 if initial_state else 0])
    data += bytes([len(ROLES)]) if offset is None else bytes([ROLES.index(offset[0])])
    if offset is not None:
        data += hostile(offset[1])
    if buffer is None:
        data += bytes([2 * len(ROLES)])
    else:
        data += bytes([ROLES.index(buffer) + (len(ROLES) if buffer_only else 0)])
    return data


def array_mutations(mutations):
    data = bytes([len(mutations)])
    for kind, role, other, dim, value in mutations:
        data += bytes([ARRAY_MUTATIONS.index(kind), role, other if isinstance(other, int) else 0])
        data += bytes([dim])
        data += bytes([value > 0]) if kind == "shape_nudge" else hostile(value)
    return data


def merge(*, count=3, b=2, h=1, n=5, dv=7, lse=True, dtypes=(0, 1, 2, 0, 0), mutations=()):
    """Parts' outs are arrays 0-3, their lses 4-7, out 8, lse 9."""
    pick = {0: 6, -1: 7}.get(count, count - 1)
    data = bytes([MERGE, 0]) + struct.pack("<Q", 0x3E46E + count)
    data += bytes([pick, b - 1, h - 1, n - 1, dv - 1, 1 if lse else 0])
    for i in range(10):
        if not (4 <= i < 8 or i == 9):  # lses are f32: no dtype byte
            data += bytes([dtypes[i if i < 4 else 4]])
        data += bytes([i * 37 % 256, 0, i % 16])
    return data + array_mutations(mutations)


def summary(*, dtype=0, seq_q=100, seq_k=130, dims=0b00011, mutations=()):
    """dtype: 0 bool, 1 f32, 2 f16, 3 bf16; dims bits: batch 2, heads 2, broadcast queries,
    broadcast keys, batch through stride 0; seq 0 is the hostile table's 0."""
    length = lambda n: 248 if n == 0 else n - 1  # noqa: E731
    data = bytes([SUMMARY, 0]) + struct.pack("<Q", 0x5A11 + seq_q)
    data += bytes([dtype, length(seq_q), length(seq_k), dims, 3, 0, 0, 0, 0, 0])
    return data + array_mutations(mutations)


def context(
    *,
    backend=1,
    null_options=False,
    null_out=False,
    struct_size=0,
    threads=1,
    family=0,
    seed=None,
    caps_size=0,
):
    flags = (1 if null_options else 0) | (6 if null_out else 0)
    data = bytes([CONTEXT, flags, backend, struct_size, threads, family])
    data += bytes([1]) + struct.pack("<Q", seed) if seed is not None else bytes([0])
    return data + bytes([caps_size])


# The arrays of the 0.2 calls (run_features), and their extra mutation kinds.
FEATURE_ARRAYS = ROLES + (
    "mask",
    "block_mask",
    "alibi",
    "sinks",
    "dsinks",
    "cu_q",
    "cu_k",
    "table",
    "lengths",
    "k_new",
    "v_new",
)
FEATURE_MUTATIONS = ARRAY_MUTATIONS + ("value", "max_seqlen")
HOSTILE_I32 = c_table("hostile_i32")
FEATURE_SOFTCAPS = (0.0, 0.0, 0.0, 0.0, 0.5, 2.5, 30.0, "-0", 1e-30, -1.0, "nan", "inf")
FEATURE_WINDOWS = (-1, -1, -1, 0, 1, 3)
BLOCK_SIZES = (8, 16, 8, 24, 32, 8, 12, 264)
MASKS = {None: 0, "bool": 2, "f32": 3, "dtype": 4}


def features(
    layout="dense",
    *,
    context=0,
    backward=False,
    dtype=0,
    heads_kv=1,
    group=2,
    head_dim=8,
    head_dim_v=6,
    causal=0,
    alignment=0,
    window=(-1, -1),
    softcap=0.0,
    initial_state=False,
    lse=True,
    batch=2,
    seq_q=5,
    seq_k=7,
    lengths=((3, 4), (0, 2)),
    slack=0,
    block_size=8,
    max_blocks=2,
    spare_block=1,
    new_keys=2,
    cached=(5, 9),
    mask=None,
    mask_dims=0,
    block_mask=False,
    alibi=None,
    sinks=False,
    dsinks=False,
    mutations=(),
):
    """A call of run_features: layout dense, packed (lengths: (queries, keys) per sequence) or
    paged (cached: keys in each sequence's cache); mask None, "bool", "f32" or "dtype" (q's),
    mask_dims bits broadcasting batch, heads, queries, keys and (16) the batch by stride 0;
    alibi None, "head" or "batch"; mutations of FEATURE_MUTATIONS over FEATURE_ARRAYS, where
    "value" takes (element index, index into HOSTILE_I32) and "max_seqlen" dim 0 or 1."""
    kind = ("dense", "packed", "paged").index(layout)
    flags = (0 if backward else 1) | causal << 2 | alignment << 3
    flags |= (0 if initial_state else 1) << 4 | (1 if lse else 0) << 6
    data = bytes([FEATURES, context]) + struct.pack("<Q", 0xFEA7 + kind * 97 + batch)
    data += bytes([kind, flags, dtype, heads_kv - 1, group - 1, head_dim - 1, head_dim_v - 1])
    data += bytes([FEATURE_WINDOWS.index(window[0]), FEATURE_WINDOWS.index(window[1])])
    data += bytes([FEATURE_SOFTCAPS.index(softcap), batch - 1])
    if layout == "packed":
        for q, k in lengths[:batch]:
            data += bytes([q, k])
        data += bytes([slack])
    elif layout == "paged":
        data += bytes([seq_q - 1, BLOCK_SIZES.index(block_size), max_blocks - 1, spare_block])
        data += bytes([new_keys])
        # The table's shuffle: each byte picks the block itself, so the table is in order.
        data += bytes(range(batch * max_blocks + spare_block - 1, 0, -1))
        for n in cached[:batch]:
            data += struct.pack("<H", n)
    else:
        data += bytes([seq_q - 1, seq_k - 1])
    data += bytes([MASKS[mask] | (0 if block_mask else 0x10), mask_dims])
    data += bytes([{None: 0, "head": 1, "batch": 2}[alibi] | sinks << 2 | dsinks << 3])
    for i in range(len(FEATURE_ARRAYS)):
        data += bytes([i * 29 % 256, i % 3, i % 5 == 0])
    data += bytes([len(mutations)])
    for kind_name, role, other, dim, value in mutations:
        data += bytes([FEATURE_MUTATIONS.index(kind_name), FEATURE_ARRAYS.index(role) - 9])
        data += bytes([FEATURE_ARRAYS.index(other), dim])
        if kind_name == "shape_nudge":
            data += bytes([value > 0])
        elif kind_name == "value":
            data += struct.pack("<H", value[0] << 4 | HOSTILE_I32.index(value[1]))
        else:
            data += hostile(value)
    return data


def mutation(kind, role, value=0, dim=0, other="q"):
    return (kind, role, other, dim, value)


def seeds():
    yield "fwd-f32", attention(FORWARD)
    yield "fwd-f16-gqa-causal", attention(FORWARD, dtype=1, heads_kv=2, group=3, causal=1)
    yield (
        "fwd-bf16-window-topleft",
        attention(FORWARD, dtype=2, alignment=1, window=(3, 1), seq_q=20, seq_k=9),
    )
    yield (
        "fwd-bshd-negative-padded",
        attention(FORWARD, layouts={role: (7, 0x55, 0b0101) for role in ROLES}, batch=2),
    )
    yield (
        "fwd-null-params-no-lse",
        attention(FORWARD, null_params=True, mutations=[mutation("null_tensor", "lse")]),
    )
    yield "fwd-tile-edges", attention(FORWARD, seq_q=48, seq_k=47, head_dim=24, head_dim_v=17)
    yield "fwd-masked-rows", attention(FORWARD, seq_q=12, seq_k=4, causal=1)
    yield "bwd-f32", attention(BACKWARD)
    yield "bwd-f16-mqa", attention(BACKWARD, dtype=1, heads_kv=1, group=3, seq_q=9, seq_k=30)
    yield (
        "bwd-bf16-causal-window",
        attention(BACKWARD, dtype=2, causal=1, window=(17, -1), layouts={"dq": (5, 0xFF, 0b1000)}),
    )
    # Context 2 and 3 are metal-sim (two GPU families) where it is built, else cpu again.
    yield (
        "sim-fwd-f16-window",
        attention(
            FORWARD,
            context=2,
            dtype=1,
            window=(3, 1),
            seq_q=33,
            seq_k=40,
            head_dim=16,
            head_dim_v=24,
        ),
    )
    yield (
        "sim-bwd-bf16-gqa",
        attention(BACKWARD, context=3, dtype=2, heads_kv=2, group=2, causal=1, alignment=1),
    )
    yield (
        "sim-bwd-f32-strided",
        attention(BACKWARD, context=2, layouts={role: (11, 0xAA, 0b0110) for role in ROLES}),
    )
    yield "bad-dtype", attention(FORWARD, dtype=7)
    yield "bad-params-struct-size", attention(FORWARD, struct_size="sizeof+8")
    yield "bad-params-scale-nan", attention(FORWARD, scale="nan")
    yield "bad-params-causal", attention(FORWARD, causal=-3)
    yield "bad-params-alignment", attention(FORWARD, alignment=-10)
    yield "bad-params-window", attention(BACKWARD, window=(-2, 2**63 - 1))
    yield "huge-window", attention(FORWARD, window=(2**63 - 1, 2**63 - 1), seq_q=9, seq_k=3)
    yield "null-q", attention(FORWARD, mutations=[mutation("null_tensor", "q")])
    yield "null-lse-backward", attention(BACKWARD, mutations=[mutation("null_tensor", "lse")])
    yield "null-data-dk", attention(BACKWARD, mutations=[mutation("null_data", "dk")])
    yield "dtype-v-f16", attention(FORWARD, mutations=[mutation("dtype", "v", 1)])
    yield "dtype-lse-unknown", attention(FORWARD, mutations=[mutation("dtype", "lse", -1)])
    yield "shape-zero", attention(FORWARD, mutations=[mutation("shape", "k", 0, dim=2)])
    yield "shape-negative", attention(FORWARD, mutations=[mutation("shape", "out", -1, dim=3)])
    yield "shape-mismatch", attention(BACKWARD, mutations=[mutation("shape_nudge", "dv", 1, 1)])
    yield (
        "heads-not-divisible",
        attention(
            FORWARD,
            heads_kv=2,
            mutations=[mutation("shape", "k", 3, dim=1), mutation("shape", "v", 3, dim=1)],
        ),
    )
    yield (
        "head-dim-too-large",
        attention(
            FORWARD,
            mutations=[mutation("shape", r, 2**31, dim=3) for r in ("q", "k")]
            + [mutation("stride", r, 0, dim=3) for r in ("q", "k")],
        ),
    )
    yield (
        "element-count-overflow",
        attention(
            FORWARD,
            mutations=[
                mutation("shape", "q", 2**40, dim=0),
                mutation("stride", "q", 0, dim=0),
                mutation("shape", "q", 2**40, dim=2),
            ],
        ),
    )
    yield (
        "offset-overflow",
        attention(
            FORWARD, mutations=[mutation("stride", "k", 2**62, 0), mutation("shape", "k", 3, dim=0)]
        ),
    )
    yield "byte-count-overflow", attention(FORWARD, mutations=[mutation("stride", "v", 2**62, 2)])
    yield (
        "negative-address",
        attention(FORWARD, mutations=[mutation("stride", "q", -(2**62), dim=2)]),
    )
    yield "broadcast-input", attention(FORWARD, mutations=[mutation("stride", "k", 0, dim=2)])
    yield "broadcast-output", attention(FORWARD, mutations=[mutation("stride", "out", 0, dim=2)])
    yield "broadcast-dq", attention(BACKWARD, mutations=[mutation("stride", "dq", 0, dim=1)])
    yield "self-overlap-out", attention(FORWARD, mutations=[mutation("stride", "out", 3, dim=2)])
    yield "misaligned-q", attention(FORWARD, mutations=[mutation("misalign", "q")])
    yield "misaligned-lse", attention(FORWARD, mutations=[mutation("misalign", "lse")])
    yield "alias-out-q", attention(FORWARD, mutations=[mutation("alias", "out", other="q")])
    yield "alias-dk-dv", attention(BACKWARD, mutations=[mutation("alias", "dv", other="dk")])
    yield (
        "alias-k-q",
        attention(FORWARD, seq_q=7, seq_k=5, mutations=[mutation("alias", "k", other="q")]),
    )
    yield "alias-dout-out", attention(BACKWARD, mutations=[mutation("alias", "dout", other="out")])
    yield "wild-pointer-top", attention(FORWARD, mutations=[mutation("wild_pointer", "v", 3)])
    yield "compute-fwd-f32", compute(COMPUTE_FORWARD)
    yield "compute-bwd-f16-gqa", compute(COMPUTE_BACKWARD, dtype=1, heads_kv=2, group=2, causal=1)
    yield "compute-sim-fwd-bf16", compute(COMPUTE_FORWARD, context=2, dtype=2, seq_q=17)
    yield "compute-args-larger", compute(COMPUTE_FORWARD, args=1)
    yield "compute-args-null", compute(COMPUTE_BACKWARD, args=4)
    yield "compute-direction", compute(COMPUTE_FORWARD, direction=240)
    yield "compute-encode", compute(COMPUTE_FORWARD, direction=250)
    yield "compute-softcap", compute(COMPUTE_FORWARD, softcap=1.5)
    yield "compute-softcap-nan", compute(COMPUTE_BACKWARD, softcap="nan")
    yield "compute-initial-state", compute(COMPUTE_FORWARD, initial_state=1)
    yield "compute-byte-offset", compute(COMPUTE_FORWARD, offset=("k", 64))
    yield "compute-byte-offset-extreme", compute(COMPUTE_FORWARD, offset=("out", -(2**63)))
    yield "compute-byte-offset-wraps", compute(COMPUTE_FORWARD, offset=("q", 2**62))
    yield "compute-buffer", compute(COMPUTE_FORWARD, buffer="v", buffer_only=True)
    yield "compute-data-and-buffer", compute(COMPUTE_BACKWARD, buffer="dq")
    yield "merge-3-parts", merge()
    yield "merge-1-part", merge(count=1, lse=False)
    yield "merge-in-place", merge(mutations=[mutation("same_view", 8, other=1)])
    yield "merge-lse-in-place", merge(mutations=[mutation("same_view", 9, other=6)])
    yield "merge-shifted-onto-part", merge(mutations=[mutation("shifted_view", 8, other=0)])
    yield "merge-count-zero", merge(count=0)
    yield "merge-part-shape", merge(mutations=[mutation("shape_nudge", 2, 1, dim=2)])
    yield "summary-bool", summary()
    yield "summary-f16-broadcast", summary(dtype=2, dims=0b01101)
    yield "summary-f32-batch-stride-0", summary(dtype=1, dims=0b10001)
    yield "summary-bf16-exact-blocks", summary(dtype=3, seq_q=128, seq_k=64, dims=0)
    yield "summary-seq-zero", summary(seq_q=0)
    yield "summary-overlaps-mask", summary(mutations=[mutation("alias", 1, other=0)])
    yield (
        "feat-dense-fwd-modifiers",
        features(mask="bool", block_mask=True, alibi="batch", sinks=True, softcap=2.5, causal=1),
    )
    yield (
        "feat-dense-bwd-dsinks",
        features(backward=True, dtype=1, mask="f32", mask_dims=0b10010, sinks=True, dsinks=True),
    )
    yield "feat-dense-bwd-softcap-alibi", features(backward=True, softcap=0.5, alibi="head")
    yield "feat-dense-initial-state", features(initial_state=True, mask="dtype", dtype=2)
    yield "feat-packed-fwd", features("packed", mask="bool", mask_dims=0b1000, sinks=True, slack=5)
    yield "feat-packed-bwd", features("packed", backward=True, alibi="batch", softcap=30.0)
    yield "feat-paged-append", features("paged", mask="f32", mask_dims=0b0100, alibi="head")
    yield "feat-paged-read-only", features("paged", new_keys=0, block_size=16, cached=(20, 3))
    yield "feat-sim-dense-fwd", features(context=2, mask="bool", dtype=1)
    yield "feat-sim-dense-bwd", features(context=3, backward=True, dtype=2)
    yield "feat-softcap-nan", features(softcap="nan")
    yield "feat-paged-block-size-12", features("paged", block_size=12)
    yield (
        "feat-paged-block-out-of-range",
        features("paged", mutations=[mutation("value", "table", (0, 64))]),
    )
    yield (
        "feat-paged-block-written-twice",
        features("paged", cached=(6, 6), mutations=[mutation("value", "table", (2, 0))]),
    )
    yield (
        "feat-paged-length-beyond-cache",
        features("paged", mutations=[mutation("value", "lengths", (0, 2**31 - 1))]),
    )
    yield (
        "feat-packed-not-monotone",
        features("packed", mutations=[mutation("value", "cu_q", (1, -1))]),
    )
    yield (
        "feat-packed-offsets-length",
        features("packed", mutations=[mutation("shape_nudge", "cu_k", 1, dim=3)]),
    )
    yield (
        "feat-packed-max-seqlen-zero",
        features("packed", mutations=[mutation("max_seqlen", "mask", 0, dim=0)]),
    )
    yield (
        "feat-mask-aliases-out",
        features(mask="f32", mutations=[mutation("alias", "mask", other="out")]),
    )
    yield (
        "feat-dsinks-aliases-dq",
        features(
            backward=True,
            sinks=True,
            dsinks=True,
            mutations=[mutation("alias", "dsinks", other="dq")],
        ),
    )
    yield (
        "feat-k-new-aliases-cache",
        features("paged", mutations=[mutation("alias", "k_new", other="k")]),
    )
    yield (
        "feat-mask-stride-overflow",
        features(mask="bool", mutations=[mutation("stride", "mask", 2**63 - 1, dim=2)]),
    )
    yield "feat-mask-dtype-i32", features(mask="bool", mutations=[mutation("dtype", "mask", 4)])
    yield "feat-sinks-shape", features(sinks=True, mutations=[mutation("shape", "sinks", 3, 1)])
    # 2^40 sinks in 4 bytes: a zero stride, which must not make the fuzzer fill 2^40 elements.
    yield (
        "feat-sinks-zero-stride",
        features(
            sinks=True,
            mutations=[mutation("stride", "sinks", 0, dim=3), mutation("shape", "sinks", 2**40, 3)],
        ),
    )
    yield (
        "feat-block-mask-code",
        features(mask="bool", block_mask=True, mutations=[mutation("value", "block_mask", (0, 3))]),
    )
    yield "context-cpu", context()
    yield "context-auto-null-options", context(backend=0, null_options=True, caps_size=4)
    yield "context-metal", context(backend=2, caps_size=7)
    yield "context-metal-sim-family", context(backend=3, family=1, seed=7, caps_size=3)
    yield "context-bad-backend", context(backend=6)
    yield "context-bad-threads", context(threads=4)
    yield "context-family-on-cpu", context(family=2)
    yield "context-null-out", context(null_out=True)
    yield "context-options-size", context(struct_size=2)


def main():
    corpus = dict(seeds())  # all of them first: a bad seed leaves the old corpus in place
    CORPUS.mkdir(exist_ok=True)
    for old in CORPUS.iterdir():
        old.unlink()
    for name, data in corpus.items():
        (CORPUS / name).write_bytes(data)
    print(f"wrote {len(list(CORPUS.iterdir()))} seeds to {CORPUS}")


if __name__ == "__main__":
    main()
