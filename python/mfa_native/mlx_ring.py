"""Ring attention (context parallelism) over MLX's ``mx.distributed``, computed by mfa.

The MLX port of :mod:`mfa_native.ring`, with the same algorithm, schedule and zig-zag split
(both run the step loops of ``mfa_native._ring``; docs/ring-attention.md describes them): each
rank of an ``mx.distributed`` group holds a slice of the sequence; the key/value blocks travel
around the ring (rank r sends to r + 1 and receives from r - 1) while every rank attends its
queries to the block in hand, and the partial results merge through their lse into a float32
state. :func:`ring_attention` is an ``mx.custom_function`` whose VJP runs mfa's backward around
the same ring, given the global out and lse: ``mx.grad`` of a loss over the ring's output gives
every rank the dq, dk and dv of its own positions.

The transfers are ``mx.distributed.send`` and ``recv_like``, the sends on one CPU stream of
their own and the receipts on another: a send of MLX's ring backend waits for its receipt, so
with the send and the receipt of an exchange on one stream two neighbours would each wait in
their send. The forward starts them with ``mx.async_eval``, so that the next block travels
while mfa computes the block in hand (eagerly, outside MLX's graph). Inside the VJP every array
MLX makes is a tracer, which ``mx.async_eval`` refuses: there each exchange is evaluated when
it is posted, and the backward's transfers do not overlap its compute. Messages between two
ranks are matched in the order they are posted, which the step loops keep.

What ran: the ``ring`` backend (TCP; a hostfile in ``MLX_HOSTFILE``, the rank in ``MLX_RANK``,
as ``mlx.launch --backend ring`` sets them) with 2 and 4 processes on one Linux machine, MLX's
CPU device (``mlx[cpu]``), forward and ``mx.grad``, against the float64 reference of the whole
sequence. Not run: MLX on an Apple GPU (arrays in Metal buffers go to mfa's metal backend, whose
device-buffer path awaits a Mac; the transfers stay on CPU streams, where MLX's ring backend
runs them), and the ``mpi``, ``jaccl`` and ``nccl`` backends. Like :mod:`mfa_native.mlx` the
computation is eager: not inside ``mx.compile`` or ``mx.vmap``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast, overload

import mlx.core as mx

from . import _attention, _ring
from ._ring import Layout, Options, Shapes

if TYPE_CHECKING:
    from typing_extensions import Unpack

    class _RingKw(TypedDict, total=False):
        """ring_attention's keyword arguments but return_lse, for its typed signatures."""

        causal: bool
        scale: float | None
        layout: Layout
        group: mx.distributed.Group | None
        backend: str | None


__all__ = ["ring_attention", "zigzag_indices", "zigzag_shard", "zigzag_unshard"]

# A transfer: the send, and the array it receives.
_Transfer = tuple[mx.array, mx.array]


# ---- the zig-zag split ----------------------------------------------------------------------


def _concatenate(parts: list[mx.array], axis: int) -> mx.array:
    return mx.concatenate(parts, axis=axis)


def zigzag_indices(seq_len: int, rank: int, world_size: int) -> mx.array:
    """The global positions of the rows that ``rank`` holds in the zig-zag split: of
    ``2 * world_size`` equal chunks, chunk ``rank`` followed by chunk
    ``2 * world_size - 1 - rank``; an int32 array of ``seq_len // world_size`` positions
    (``mx.take(x, zigzag_indices(x.shape[d], rank, world_size), axis=d)`` equals
    ``zigzag_shard(x, rank, world_size, dim=d)``)."""
    early, late = _ring.zigzag_chunks(seq_len, rank, world_size)
    return mx.concatenate([mx.arange(early.start, early.stop), mx.arange(late.start, late.stop)])


def zigzag_shard(x: mx.array, rank: int, world_size: int, *, dim: int = 2) -> mx.array:
    """Rank ``rank``'s part of a global sequence ``x`` along axis ``dim`` (2: the sequence of
    ``[B, H, N, D]`` arrays and of lse ``[B, H, N]``; 1 for ``[B, N, H, D]``): chunks ``rank``
    and ``2 * world_size - 1 - rank`` of ``2 * world_size``, concatenated."""
    return cast(mx.array, _ring.zigzag_shard(x, rank, world_size, dim, _concatenate))


def zigzag_unshard(shards: Sequence[mx.array], *, dim: int = 2) -> mx.array:
    """The global sequence from every rank's part (``shards[r]`` from rank r): the inverse of
    :func:`zigzag_shard`."""
    return cast(mx.array, _ring.zigzag_unshard(shards, dim, _concatenate))


# ---- the ring -------------------------------------------------------------------------------


@functools.cache
def _streams() -> tuple[mx.Stream, mx.Stream]:
    """The CPU streams of the sends and of the receipts, made once per process."""
    return mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)


_UNSIGNED = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


def _index(axis: int, start: int, stop: int) -> tuple[slice, ...]:
    return (slice(None),) * axis + (slice(start, stop),)


class _MlxRing:
    """This rank's neighbours in an mx.distributed group, the transfers between them, and the
    array operations of the ring's step loops (mfa_native._ring.Engine)."""

    def __init__(self, group: mx.distributed.Group | None, overlap: bool) -> None:
        self.group = mx.distributed.init() if group is None else group
        self.rank = self.group.rank()
        self.size = self.group.size()
        self.next = (self.rank + 1) % self.size
        self.previous = (self.rank - 1) % self.size
        self.overlap = overlap

    def shift(self, outgoing: mx.array) -> _Transfer:
        send_stream, receive_stream = _streams()
        sent = mx.distributed.send(outgoing, self.next, group=self.group, stream=send_stream)
        received = mx.distributed.recv_like(
            outgoing, self.previous, group=self.group, stream=receive_stream
        )
        if self.overlap:
            mx.async_eval(sent, received)  # type: ignore[no-untyped-call]
        else:
            mx.eval(sent, received)
        return sent, received

    @staticmethod
    def wait(transfer: _Transfer) -> mx.array:
        mx.eval(*transfer)
        return transfer[1]

    @staticmethod
    def zeros(shape: tuple[int, ...]) -> mx.array:
        return mx.zeros(shape, dtype=mx.float32)

    @staticmethod
    def empty_lse(shape: tuple[int, ...]) -> mx.array:
        return mx.full(shape, -math.inf, dtype=mx.float32)

    @staticmethod
    def pack(first: mx.array, second: mx.array) -> mx.array:
        """An evaluated array that no graph transformation traces, as mx.async_eval refuses
        arrays computed from a transformation's inputs (mx.vjp's primals): a copy through
        the buffer protocol (which has no bfloat16, so of the bits)."""
        packed = mx.concatenate([first.reshape(-1), second.reshape(-1)])
        bits = _UNSIGNED[packed.itemsize]
        memory = memoryview(cast(Any, packed.view(bits)))  # MLX's stubs omit the protocol
        return mx.array(cast(Any, memory)).view(packed.dtype)

    @staticmethod
    def unpack(
        buffer: mx.array, first: Sequence[int], second: Sequence[int]
    ) -> tuple[mx.array, mx.array]:
        split = math.prod(first)
        return buffer[:split].reshape(*first), buffer[split:].reshape(*second)

    @staticmethod
    def merge_rows(
        state: tuple[mx.array, mx.array], start: int, part: tuple[mx.array, mx.array],
        options: Options,
    ) -> tuple[mx.array, mx.array]:  # fmt: skip
        """MLX arrays are values: the merged rows replace the state's (slice updates)."""
        out, lse = state
        axis = _ring.seq_axis(options.layout)
        rows, rows_lse = _index(axis, start, out.shape[axis]), _index(2, start, lse.shape[2])
        merged, merged_lse = _attention.merge_attention_states(
            [out[rows], part[0]],
            [lse[rows_lse], part[1]],
            layout=options.layout,
            backend=options.backend,
            return_lse=True,
        )
        out[rows] = merged
        lse[rows_lse] = merged_lse
        return out, lse

    @staticmethod
    def add_rows(total: mx.array, axis: int, start: int, stop: int, part: mx.array) -> mx.array:
        return total.at[_index(axis, start, stop)].add(part)

    def add_to_block(
        self, block: mx.array, shapes: Shapes, axis: int, stop: int, parts: Any
    ) -> mx.array:
        first, second = (
            self.add_rows(array, axis, 0, stop, part)
            for array, part in zip(self.unpack(block, *shapes), parts)
        )
        return self.pack(first, second)

    @staticmethod
    def cast(array: mx.array, like: mx.array) -> mx.array:
        return array.astype(like.dtype)


@mx.custom_function
def _ring_attention(
    q: mx.array, k: mx.array, v: mx.array, *, options: Options, group: Any
) -> tuple[mx.array, mx.array]:
    ring = _MlxRing(group, overlap=True)
    return cast("tuple[mx.array, mx.array]", _ring.forward(ring, q, k, v, options))


@_ring_attention.vjp
def _ring_attention_vjp(
    primals: Any, cotangents: Any, outputs: Any, *, options: Options, group: Any
) -> tuple[mx.array, mx.array, mx.array]:
    """The backward around the ring; lse is returned through mx.stop_gradient, so only dout
    counts."""
    q, k, v = primals
    out, lse = outputs
    ring = _MlxRing(group, overlap=False)  # module docstring: no async_eval in a VJP
    gradients = _ring.backward(ring, cotangents[0], q, k, v, out, lse, options)
    return cast("tuple[mx.array, mx.array, mx.array]", gradients)


@overload
def ring_attention(
    q: mx.array, k: mx.array, v: mx.array, *, return_lse: Literal[False] = ...,
    **options: Unpack[_RingKw],
) -> mx.array: ...  # fmt: skip


@overload
def ring_attention(
    q: mx.array, k: mx.array, v: mx.array, *, return_lse: Literal[True],
    **options: Unpack[_RingKw],
) -> tuple[mx.array, mx.array]: ...  # fmt: skip


def ring_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    causal: bool = False,
    scale: float | None = None,
    layout: Layout = "bhsd",
    return_lse: bool = False,
    group: mx.distributed.Group | None = None,
    backend: str | None = None,
) -> mx.array | tuple[mx.array, mx.array]:
    """Attention over a sequence split across the ranks of an ``mx.distributed`` group,
    differentiable with ``mx.grad`` / ``mx.vjp`` through the same ring.

    Every rank of ``group`` calls it with its own slice: q ``[B, Hq, N, D]``, k ``[B, Hkv, N,
    D]`` and v ``[B, Hkv, N, Dv]`` (``[B, N, H, D]`` with ``layout="bshd"``), the same shapes on
    every rank, Hq a multiple of Hkv, one dtype. The result is this rank's rows of the attention
    of the whole sequence: out ``[B, Hq, N, Dv]`` in q's dtype and, with ``return_lse=True``,
    its float32 log-sum-exp ``[B, Hq, N]`` (through ``mx.stop_gradient``). The gradients of a
    loss over every rank's out reach each rank as the dq, dk and dv of its own q, k and v
    (every rank evaluates the gradient, as every rank runs the forward).

    ``causal`` (which needs the zig-zag split, :func:`zigzag_shard`), ``scale`` and ``backend``
    are those of :func:`mfa_native.ring.ring_attention`; ``group`` is an
    ``mx.distributed.Group`` (None: ``mx.distributed.init()``, the global group), whose rank
    order is the ring's order (MLX's ring backend cannot split groups: there it is the global
    group).

    Raises
    ------
    TypeError, ValueError
        For arguments the ring cannot take (rank other than 4, lengths of q and k that differ,
        an odd length with ``causal``), before any transfer starts; and what
        :func:`mfa_native.attention` rejects, from the first block (with its transfer posted).
        A rank that stops inside the ring leaves the others waiting in a receipt.
    """
    for name, array in (("q", q), ("k", k), ("v", v)):
        if not isinstance(array, mx.array):
            raise TypeError(f"{name} must be an mx.array, got {type(array).__name__}")
    if group is not None and not isinstance(group, mx.distributed.Group):
        raise TypeError(f"group must be an mx.distributed.Group, got {type(group).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    _ring.check_inputs(q, k, v, causal, scale, layout)
    options = Options(causal, None if scale is None else float(scale), layout, backend)
    result = _ring_attention(q, k, v, options=options, group=group)
    out, lse = cast("tuple[mx.array, mx.array]", result)
    return (out, mx.stop_gradient(lse)) if return_lse else out
