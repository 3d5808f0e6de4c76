"""Ring attention (context parallelism) over ``torch.distributed``, computed by mfa.

Each rank of a process group holds a slice of the sequence: its queries and the keys/values of
the same positions. The key/value blocks travel around the ring (rank r sends to r + 1 and
receives from r - 1) while every rank attends its queries to the block in hand; the transfer
of the next block is posted before the current block is computed, so it overlaps the compute.
The partial results of the blocks are folded together through their log-sum-exps by
:func:`mfa_native.merge_attention_states` into a float32 state, which is rounded to the
inputs' dtype once at the end.

The backward runs the same ring: each rank computes, with mfa's backward given the global out
and lse of its queries, the contribution of the block in hand to dq (kept) and to that block's
dk and dv, which travel, as float32 accumulators, with the block around the ring and arrive at
their owner after the last step.

With ``causal=True`` the ranks must hold the sequence in the zig-zag order, which balances the
causal work: of 2W equal chunks of the global sequence (W ranks), rank r holds chunk r followed
by chunk 2W - 1 - r (:func:`zigzag_shard`, :func:`zigzag_unshard`, :func:`zigzag_indices`).
Then every step of the ring costs every rank the same, half a block: at the first step its
own block under the causal mask; later, for a block from an earlier rank, all its queries
against the first half of the keys, and for a block from a later rank, the second half of its
queries against all the keys. Without ``causal`` the order of the positions does not matter:
any split works.

Everything here runs in eager mode on CPU tensors (mfa's CPU backend). The communication is
plain ``torch.distributed`` point-to-point (``batch_isend_irecv``); it has run on gloo (NCCL
carries CUDA tensors, which mfa does not compute on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast, overload

import torch
import torch.distributed as dist
from torch import Tensor

if TYPE_CHECKING:  # torch builds without distributed support have no ProcessGroup
    from torch.distributed import ProcessGroup
    from typing_extensions import Unpack

    class _RingKw(TypedDict, total=False):
        """ring_attention's keyword arguments but return_lse, for its typed signatures."""

        causal: bool
        scale: float | None
        layout: Layout
        group: ProcessGroup | None
        backend: str | None


from . import _attention

__all__ = ["ring_attention", "zigzag_indices", "zigzag_shard", "zigzag_unshard"]

Layout = Literal["bhsd", "bshd"]
# Tags of the two kinds of messages, so that a key/value block and a gradient accumulator
# travelling between the same pair of ranks are never matched with each other (gloo matches
# by tag; NCCL matches in order, which both sides keep).
_KEYS_TAG = 0
_GRADIENTS_TAG = 1


# ---- the zig-zag split ----------------------------------------------------------------------


def _check_split(seq_len: int, rank: int, world_size: int) -> int:
    """The chunk length of a zig-zag split, after checking its arguments."""
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
    return seq_len // (2 * world_size)


def zigzag_indices(seq_len: int, rank: int, world_size: int) -> Tensor:
    """The global positions of the rows that ``rank`` holds in the zig-zag split: of
    ``2 * world_size`` equal chunks, chunk ``rank`` followed by chunk
    ``2 * world_size - 1 - rank``. An int64 tensor of ``seq_len // world_size`` positions, e.g.
    for rotary embeddings; ``zigzag_shard(x, rank, world_size, dim=d)`` equals
    ``x.index_select(d, zigzag_indices(x.shape[d], rank, world_size))``.
    """
    chunk = _check_split(seq_len, rank, world_size)
    late = 2 * world_size - 1 - rank
    return torch.cat(
        [
            torch.arange(rank * chunk, (rank + 1) * chunk),
            torch.arange(late * chunk, (late + 1) * chunk),
        ]
    )


def zigzag_shard(x: Tensor, rank: int, world_size: int, *, dim: int = 2) -> Tensor:
    """Rank ``rank``'s part of a global sequence ``x`` along axis ``dim`` (2: the sequence of
    ``[B, H, N, D]`` tensors and of lse ``[B, H, N]``; 1 for ``[B, N, H, D]``): chunks ``rank``
    and ``2 * world_size - 1 - rank`` of ``2 * world_size``, concatenated (a new tensor)."""
    chunk = _check_split(x.shape[dim], rank, world_size)
    late = 2 * world_size - 1 - rank
    return torch.cat(
        [x.narrow(dim, rank * chunk, chunk), x.narrow(dim, late * chunk, chunk)], dim=dim
    )


def zigzag_unshard(shards: Sequence[Tensor], *, dim: int = 2) -> Tensor:
    """The global sequence from every rank's part (``shards[r]`` from rank r, as
    ``torch.distributed.all_gather`` returns them): the inverse of :func:`zigzag_shard`."""
    if not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError("shards must be a non-empty list or tuple of tensors, one per rank")
    local = shards[0].shape[dim]
    if local % 2 or any(shard.shape[dim] != local for shard in shards):
        raise ValueError(
            f"every shard must have the same even length along dim {dim}, got "
            f"{[shard.shape[dim] for shard in shards]}"
        )
    chunk = local // 2
    early = [shard.narrow(dim, 0, chunk) for shard in shards]
    late = [shard.narrow(dim, chunk, chunk) for shard in reversed(shards)]
    return torch.cat(early + late, dim=dim)


# ---- the ring -------------------------------------------------------------------------------


class _Ring:
    """This rank's neighbours in a process group, and the transfers between them."""

    def __init__(self, group: ProcessGroup | None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ring_attention needs torch.distributed initialized "
                "(torch.distributed.init_process_group) on every rank of the ring"
            )
        # The default group is set once torch.distributed is initialized.
        self.group = cast("ProcessGroup", dist.group.WORLD) if group is None else group
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError(
                "this process is not a member of group: ring_attention is called by the ranks "
                "of the ring only"
            )
        self.size = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.previous = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def send(self, tensor: Tensor, tag: int) -> list[Any]:
        """Start sending tensor to the next rank; the works to wait for."""
        return self._start([dist.P2POp(dist.isend, tensor, self.next, self.group, tag)])

    def receive(self, tensor: Tensor, tag: int) -> list[Any]:
        """Start receiving into tensor from the previous rank."""
        return self._start([dist.P2POp(dist.irecv, tensor, self.previous, self.group, tag)])

    def shift(self, outgoing: Tensor, incoming: Tensor, tag: int) -> list[Any]:
        """Start passing outgoing to the next rank and receiving incoming from the previous."""
        return self._start(
            [
                dist.P2POp(dist.isend, outgoing, self.next, self.group, tag),
                dist.P2POp(dist.irecv, incoming, self.previous, self.group, tag),
            ]
        )

    @staticmethod
    def _start(operations: list[Any]) -> list[Any]:
        return list(dist.batch_isend_irecv(operations))


def _wait(works: list[Any]) -> None:
    for work in works:
        work.wait()


def _pack(first: Tensor, second: Tensor) -> Tensor:
    """One contiguous buffer holding both tensors, so that a block travels as one message."""
    return torch.cat([first.reshape(-1), second.reshape(-1)])


def _unpack(buffer: Tensor, first: torch.Size, second: torch.Size) -> tuple[Tensor, Tensor]:
    """Views of _pack's buffer as tensors of the two shapes (contiguous in those shapes)."""
    split = first.numel()
    return buffer[:split].view(first), buffer[split:].view(second)


@dataclass(frozen=True)
class _Options:
    causal: bool
    scale: float | None
    layout: Layout
    backend: str | None
    group: ProcessGroup | None


def _seq_axis(layout: Layout) -> int:
    return 2 if layout == "bhsd" else 1


@dataclass(frozen=True)
class _Block:
    """What one step of the ring computes: the query rows [query_start, end) of this rank
    against key rows [0, key_stop) of the block in hand, under the causal mask or not."""

    query_start: int
    key_stop: int
    causal: bool


def _block(options: _Options, ring: _Ring, step: int, length: int) -> _Block:
    """The step's part of the local queries x the block in hand (module docstring)."""
    if not options.causal:
        return _Block(0, length, False)
    if step == 0:  # this rank's own block: the causal mask over the zig-zag order
        return _Block(0, length, True)
    source = (ring.rank - step) % ring.size
    half = length // 2
    if source < ring.rank:  # both chunks of the queries see its early chunk, none its late one
        return _Block(0, half, False)
    return _Block(half, length, False)  # only the queries' late chunk sees it, whole


def _rows(tensor: Tensor, axis: int, start: int, stop: int) -> Tensor:
    return tensor.narrow(axis, start, stop - start)


def _forward(q: Tensor, k: Tensor, v: Tensor, options: _Options) -> tuple[Tensor, Tensor]:
    ring = _Ring(options.group)
    axis = _seq_axis(options.layout)
    length = q.shape[axis]
    out_shape = (*q.shape[:-1], v.shape[-1])
    state = torch.zeros(out_shape, dtype=torch.float32)
    heads = q.shape[1] if options.layout == "bhsd" else q.shape[2]
    state_lse = torch.full((q.shape[0], heads, length), -torch.inf)
    keys = _pack(k, v)
    for step in range(ring.size):
        transfer: list[Any] = []
        if step + 1 < ring.size:
            incoming = torch.empty_like(keys)
            transfer = ring.shift(keys, incoming, _KEYS_TAG)
        block_k, block_v = _unpack(keys, k.shape, v.shape)
        block = _block(options, ring, step, length)
        part_out, part_lse = _attention.attention(
            _rows(q, axis, block.query_start, length),
            _rows(block_k, axis, 0, block.key_stop),
            _rows(block_v, axis, 0, block.key_stop),
            causal=block.causal,
            scale=options.scale,
            layout=options.layout,
            return_lse=True,
            backend=options.backend,
        )
        rows = _rows(state, axis, block.query_start, length)
        rows_lse = _rows(state_lse, 2, block.query_start, length)
        _attention.merge_attention_states(
            [rows, part_out],
            [rows_lse, part_lse],
            layout=options.layout,
            backend=options.backend,
            out=rows,
            lse=rows_lse,
        )
        _wait(transfer)
        if transfer:
            keys = incoming
    return state.to(q.dtype), state_lse


def _backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, options: _Options
) -> tuple[Tensor, Tensor, Tensor]:
    ring = _Ring(options.group)
    axis = _seq_axis(options.layout)
    length = q.shape[axis]
    dq = torch.zeros(q.shape, dtype=torch.float32)
    keys = _pack(k, v)
    gradients = torch.zeros(keys.shape, dtype=torch.float32)  # dk, dv of the block in hand
    sends: list[Any] = []
    sent: list[Tensor] = []  # the accumulators being sent, alive until their sends complete
    for step in range(ring.size):
        transfer: list[Any] = []
        if step + 1 < ring.size:
            incoming = torch.empty_like(keys)
            transfer = ring.shift(keys, incoming, _KEYS_TAG)
        arriving: list[Any] = []
        if step > 0:  # the block's accumulator, from the rank that held the block last step
            gradients = torch.empty(keys.shape, dtype=torch.float32)
            arriving = ring.receive(gradients, _GRADIENTS_TAG)
        block_k, block_v = _unpack(keys, k.shape, v.shape)
        block = _block(options, ring, step, length)
        queries = block.query_start, length
        part_dq, part_dk, part_dv = _attention.attention_backward(
            _rows(dout, axis, *queries),
            _rows(q, axis, *queries),
            _rows(block_k, axis, 0, block.key_stop),
            _rows(block_v, axis, 0, block.key_stop),
            _rows(out, axis, *queries),
            _rows(lse, 2, *queries),
            causal=block.causal,
            scale=options.scale,
            layout=options.layout,
            backend=options.backend,
        )
        _rows(dq, axis, *queries).add_(part_dq)
        _wait(arriving)
        block_dk, block_dv = _unpack(gradients, k.shape, v.shape)
        _rows(block_dk, axis, 0, block.key_stop).add_(part_dk)
        _rows(block_dv, axis, 0, block.key_stop).add_(part_dv)
        if ring.size > 1:
            sends += ring.send(gradients, _GRADIENTS_TAG)
            sent.append(gradients)
        _wait(transfer)
        if transfer:
            keys = incoming
    if ring.size > 1:  # the last hop brings this rank's own accumulator home
        gradients = torch.empty(keys.shape, dtype=torch.float32)
        _wait(ring.receive(gradients, _GRADIENTS_TAG))
    _wait(sends)
    dk, dv = _unpack(gradients, k.shape, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """The ring's forward, saving q, k, v, out and lse, and its backward through the ring."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, options: _Options
    ) -> tuple[Tensor, Tensor]:
        out, lse = _forward(q, k, v, options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(
        ctx: Any, dout: Tensor, _dlse: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(dout, q, k, v, out, lse, ctx.options), None)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, causal: bool, layout: Layout) -> None:
    """What the ring needs beyond what mfa checks, before any transfer starts."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise ValueError(f"{name} must have rank 4, got shape {tuple(tensor.shape)}")
        if tensor.device.type != "cpu":
            raise NotImplementedError(
                f"{name} is on {tensor.device}: ring_attention runs on CPU tensors (gloo, "
                "torch.distributed's backend on macOS, carries CPU tensors); on one device, "
                "mfa_native.torch.attention takes MPS tensors"
            )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k and v must have one dtype (k and v travel packed together), got {q.dtype}, "
            f"{k.dtype} and {v.dtype}"
        )
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    axis = _seq_axis(layout)
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


@overload
def ring_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_lse: Literal[False] = ..., **options: Unpack[_RingKw]
) -> Tensor: ...


@overload
def ring_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_lse: Literal[True], **options: Unpack[_RingKw]
) -> tuple[Tensor, Tensor]: ...


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    layout: Layout = "bhsd",
    return_lse: bool = False,
    group: ProcessGroup | None = None,
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention over a sequence split across the ranks of a process group, differentiable.

    Every rank of ``group`` calls it with its own slice: q ``[B, Hq, N, D]``, k ``[B, Hkv, N,
    D]`` and v ``[B, Hkv, N, Dv]`` (``[B, N, H, D]`` with ``layout="bshd"``), the same shapes on
    every rank, Hq a multiple of Hkv. The result is this rank's rows of the attention of the
    whole sequence: out ``[B, Hq, N, Dv]`` in q's dtype and, with ``return_lse=True``, its
    float32 log-sum-exp ``[B, Hq, N]`` (no gradient). ``loss.backward()`` runs mfa's backward
    around the ring; dk and dv return to the rank that holds k and v.

    Parameters
    ----------
    causal : bool
        Causal attention over the global positions. The slices must be the zig-zag split
        (:func:`zigzag_shard`), so N is even; without it any split works.
    scale : float, optional
        Multiplies ``q @ k^T``; None means ``1 / sqrt(D)``.
    group : torch.distributed.ProcessGroup, optional
        The ring (None: the default group); its rank order is the ring's order.
    backend : str, optional
        mfa's backend name for the block computations (None: "auto").

    Raises
    ------
    RuntimeError
        When torch.distributed is not initialized.
    TypeError, ValueError, NotImplementedError
        For arguments the ring cannot take (rank other than 4, lengths of q and k that differ,
        an odd length with ``causal``, tensors off the CPU), before any transfer starts; and
        what :func:`mfa_native.attention` rejects, from the first block (with its transfer
        posted). Every rank raises alike when all are given the same kinds of arguments; a
        rank that stops inside the ring leaves the others waiting until the process group's
        timeout.
    """
    _check_inputs(q, k, v, causal, layout)
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
        raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
    options = _Options(causal, None if scale is None else float(scale), layout, backend, group)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # torch types Function.apply without annotations.
        out, lse = _RingAttention.apply(q, k, v, options)  # type: ignore[no-untyped-call]
    else:
        out, lse = _forward(q, k, v, options)
    return (out, lse) if return_lse else out
