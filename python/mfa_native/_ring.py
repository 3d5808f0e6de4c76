"""Ring attention's engine-independent part: the zig-zag split, the schedule of the ring (which
of a rank's queries meet which keys of the block in hand at each step), and the step loops of
the forward and the backward, written against :class:`Engine`: the few array operations and
point-to-point transfers that differ between distributed engines. :mod:`mfa_native.ring`
implements it with ``torch.distributed``, :mod:`mfa_native.mlx_ring` with ``mx.distributed``.
The attention of each block and the merge of the partial results through their lse are mfa's
own (:func:`mfa_native.attention`, :func:`mfa_native.attention_backward`,
:func:`mfa_native.merge_attention_states`), which take either engine's arrays.

Every transfer is a shift (send to the next rank, receive from the previous one, at once), so
that the ring cannot deadlock even where a send waits for its receipt (MLX's ring backend), and
every rank posts its shifts in one order: at each step the key/value block's, then in the
backward the dk/dv accumulator's. Messages between two neighbours are matched in the order they
are posted, by every engine here (gloo, NCCL, MLX's ring backend), so the two never mix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from . import _attention

Layout = Literal["bhsd", "bshd"]
Array = Any  # a torch.Tensor or an mx.array, as the engine has them
Shapes = tuple[Sequence[int], Sequence[int]]  # of the two arrays packed into one message


# ---- the zig-zag split ----------------------------------------------------------------------


def zigzag_chunks(seq_len: int, rank: int, world_size: int) -> tuple[range, range]:
    """The two chunks of global positions that ``rank`` holds in the zig-zag split: of
    ``2 * world_size`` equal chunks, chunk ``rank`` and chunk ``2 * world_size - 1 - rank``."""
    for name, value in (("seq_len", seq_len), ("rank", rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if seq_len < 0 or seq_len % (2 * world_size):
        raise ValueError(
            f"the sequence length must be a multiple of 2 * world_size = {2 * world_size} "
            f"(two chunks per rank), got {seq_len}"
        )
    chunk = seq_len // (2 * world_size)
    late = 2 * world_size - 1 - rank
    return range(rank * chunk, (rank + 1) * chunk), range(late * chunk, (late + 1) * chunk)


Concatenate = Callable[[list[Array], int], Array]


def rows(array: Array, axis: int, start: int, stop: int) -> Array:
    """array[..., start:stop, ...] along axis (a view for torch, a lazy slice for MLX)."""
    return array[(slice(None),) * axis + (slice(start, stop),)]


def zigzag_shard(x: Array, rank: int, world_size: int, dim: int, concatenate: Concatenate) -> Array:
    """Rank ``rank``'s part of the global sequence x along dim: its two chunks, concatenated."""
    early, late = zigzag_chunks(x.shape[dim], rank, world_size)
    return concatenate(
        [rows(x, dim, early.start, early.stop), rows(x, dim, late.start, late.stop)], dim
    )


def zigzag_unshard(shards: Sequence[Array], dim: int, concatenate: Concatenate) -> Array:
    """The global sequence from every rank's part (shards[r] from rank r)."""
    if not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError("shards must be a non-empty list or tuple of arrays, one per rank")
    local = shards[0].shape[dim]
    if local % 2 or any(shard.shape[dim] != local for shard in shards):
        raise ValueError(
            f"every shard must have the same even length along dim {dim}, got "
            f"{[shard.shape[dim] for shard in shards]}"
        )
    chunk = local // 2
    early = [rows(shard, dim, 0, chunk) for shard in shards]
    late = [rows(shard, dim, chunk, local) for shard in reversed(shards)]
    return concatenate(early + late, dim)


# ---- the arguments --------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    causal: bool
    scale: float | None
    layout: Layout
    backend: str | None


def seq_axis(layout: Layout) -> int:
    return 2 if layout == "bhsd" else 1


def check_inputs(
    q: Array, k: Array, v: Array, causal: bool, scale: float | None, layout: Layout
) -> None:
    """What the ring needs beyond what mfa checks, before any transfer starts (the engine has
    checked that q, k and v are its arrays, in memory mfa reads)."""
    for name, array in (("q", q), ("k", k), ("v", v)):
        if array.ndim != 4:
            raise ValueError(f"{name} must have rank 4, got shape {tuple(array.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k and v must have one dtype (k and v travel packed together), got {q.dtype}, "
            f"{k.dtype} and {v.dtype}"
        )
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
        raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
    axis = seq_axis(layout)
    if k.shape[axis] != q.shape[axis]:
        raise ValueError(
            f"k must hold the keys of q's positions: {q.shape[axis]} rows in q, "
            f"{k.shape[axis]} in k (every rank holds the same number of positions)"
        )
    if causal and q.shape[axis] % 2:
        raise ValueError(
            f"causal ring attention needs the zig-zag split, two equal chunks per rank: the "
            f"local sequence length must be even, got {q.shape[axis]}"
        )


# ---- the schedule ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """What one step of the ring computes: the query rows [query_start, end) of this rank
    against key rows [0, key_stop) of the block in hand, under the causal mask or not."""

    query_start: int
    key_stop: int
    causal: bool


def block(causal: bool, rank: int, size: int, step: int, length: int) -> Block:
    """The step's part of the local queries x the block in hand, which came from rank
    (rank - step) mod size; with causal, under the zig-zag split every step costs half a
    block: the own block under the mask, all queries x the early keys of an earlier rank's
    block, or the late queries x all keys of a later rank's block."""
    if not causal:
        return Block(0, length, False)
    if step == 0:  # this rank's own block: the causal mask over the zig-zag order
        return Block(0, length, True)
    source = (rank - step) % size
    half = length // 2
    if source < rank:  # both chunks of the queries see its early chunk, none its late one
        return Block(0, half, False)
    return Block(half, length, False)  # only the queries' late chunk sees it, whole


# ---- the step loops -------------------------------------------------------------------------


class Engine(Protocol):
    """A ring of ranks on one distributed engine, and the array operations the loops need."""

    rank: int
    size: int

    def zeros(self, shape: tuple[int, ...]) -> Array:
        """A float32 array of zeros."""

    def empty_lse(self, shape: tuple[int, ...]) -> Array:
        """A float32 array of -inf: the lse of rows that have seen no key yet."""

    def pack(self, first: Array, second: Array) -> Array:
        """One flat array holding both (of one dtype), so that a block travels as one
        message."""

    def unpack(self, buffer: Array, first: Sequence[int], second: Sequence[int]) -> Any:
        """pack's two arrays back, of the two shapes: a pair."""

    def shift(self, outgoing: Array) -> Any:
        """Start sending outgoing to the next rank and receiving an array like it from the
        previous one; a transfer for wait."""

    def wait(self, transfer: Any) -> Array:
        """Wait for a transfer to complete (outgoing stays alive until then); the array it
        received."""

    def merge_rows(
        self, state: tuple[Array, Array], start: int, part: tuple[Array, Array], options: Options
    ) -> tuple[Array, Array]:
        """The float32 (out, lse) state with its rows [start, end) merged with the part's
        (out, lse) of those rows, by merge_attention_states."""

    def add_rows(self, total: Array, axis: int, start: int, stop: int, part: Array) -> Array:
        """total with part added to its rows [start, stop) along axis."""

    def add_to_block(self, block: Array, shapes: Shapes, axis: int, stop: int, parts: Any) -> Array:
        """block, pack's buffer of two arrays of the shapes, with parts (a pair) added to
        their rows [0, stop) along axis."""

    def cast(self, array: Array, like: Array) -> Array:
        """array in like's dtype."""


def forward(engine: Engine, q: Array, k: Array, v: Array, options: Options) -> tuple[Any, Any]:
    """This rank's rows of the global out (q's dtype) and lse (float32)."""
    axis = seq_axis(options.layout)
    length = q.shape[axis]
    heads = q.shape[1] if options.layout == "bhsd" else q.shape[2]
    out_shape = (*q.shape[:-1], v.shape[-1])
    state = engine.zeros(out_shape), engine.empty_lse((q.shape[0], heads, length))
    keys = engine.pack(k, v)
    for step in range(engine.size):
        incoming = engine.shift(keys) if step + 1 < engine.size else None
        block_k, block_v = engine.unpack(keys, k.shape, v.shape)
        part = block(options.causal, engine.rank, engine.size, step, length)
        part_state = _attention.attention(
            rows(q, axis, part.query_start, length),
            rows(block_k, axis, 0, part.key_stop),
            rows(block_v, axis, 0, part.key_stop),
            causal=part.causal,
            scale=options.scale,
            layout=options.layout,
            return_lse=True,
            backend=options.backend,
        )
        state = engine.merge_rows(state, part.query_start, part_state, options)
        if incoming is not None:
            keys = engine.wait(incoming)
    out, lse = state
    return engine.cast(out, q), lse


def backward(
    engine: Engine, dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array,
    options: Options,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """dq, dk and dv of this rank's positions, from the global out and lse of its queries:
    each block's dk and dv accumulate, in float32, on the way around the ring and arrive at
    their owner after one more hop."""
    axis = seq_axis(options.layout)
    length = q.shape[axis]
    dq = engine.zeros(q.shape)
    keys = engine.pack(k, v)
    gradients = engine.zeros(keys.shape)  # dk, dv of the block in hand
    passing = None  # the accumulator on its way to the next rank, and the next one coming
    for step in range(engine.size):
        incoming = engine.shift(keys) if step + 1 < engine.size else None
        block_k, block_v = engine.unpack(keys, k.shape, v.shape)
        part = block(options.causal, engine.rank, engine.size, step, length)
        queries = part.query_start, length
        part_dq, part_dk, part_dv = _attention.attention_backward(
            rows(dout, axis, *queries),
            rows(q, axis, *queries),
            rows(block_k, axis, 0, part.key_stop),
            rows(block_v, axis, 0, part.key_stop),
            rows(out, axis, *queries),
            rows(lse, 2, *queries),
            causal=part.causal,
            scale=options.scale,
            layout=options.layout,
            backend=options.backend,
        )
        dq = engine.add_rows(dq, axis, *queries, part_dq)
        if passing is not None:  # the block's accumulator, from the rank that held it last
            gradients = engine.wait(passing)
        gradients = engine.add_to_block(
            gradients, (k.shape, v.shape), axis, part.key_stop, (part_dk, part_dv)
        )
        # On with the block; after the last step, home to the block's owner (the next rank).
        passing = engine.shift(gradients) if engine.size > 1 else None
        if incoming is not None:
            keys = engine.wait(incoming)
    if passing is not None:
        gradients = engine.wait(passing)
    dk, dv = engine.unpack(gradients, k.shape, v.shape)
    return engine.cast(dq, q), engine.cast(dk, k), engine.cast(dv, v)
