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
plain ``torch.distributed`` point-to-point (``batch_isend_irecv``); it has run on gloo, with 2
and 4 processes; not on NCCL, which carries CUDA tensors, which mfa does not compute on. The
step loops are ``mfa_native._ring``'s, shared with the MLX port (:mod:`mfa_native.mlx_ring`,
reached as ``mfa_native.mlx.ring_attention``); this module supplies torch's tensor operations
and transfers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


from . import _attention, _ring
from ._ring import Layout, Options, Shapes

__all__ = ["ring_attention", "zigzag_indices", "zigzag_shard", "zigzag_unshard"]

# A transfer: its works, and the tensor received into.
_Transfer = tuple[list[Any], Tensor]


# ---- the zig-zag split ----------------------------------------------------------------------


def _cat(parts: list[Tensor], dim: int) -> Tensor:
    return torch.cat(parts, dim=dim)


def zigzag_indices(seq_len: int, rank: int, world_size: int) -> Tensor:
    """The global positions of the rows that ``rank`` holds in the zig-zag split: of
    ``2 * world_size`` equal chunks, chunk ``rank`` followed by chunk
    ``2 * world_size - 1 - rank``. An int64 tensor of ``seq_len // world_size`` positions, e.g.
    for rotary embeddings; ``zigzag_shard(x, rank, world_size, dim=d)`` equals
    ``x.index_select(d, zigzag_indices(x.shape[d], rank, world_size))``.
    """
    early, late = _ring.zigzag_chunks(seq_len, rank, world_size)
    return torch.cat([torch.arange(early.start, early.stop), torch.arange(late.start, late.stop)])


def zigzag_shard(x: Tensor, rank: int, world_size: int, *, dim: int = 2) -> Tensor:
    """Rank ``rank``'s part of a global sequence ``x`` along axis ``dim`` (2: the sequence of
    ``[B, H, N, D]`` tensors and of lse ``[B, H, N]``; 1 for ``[B, N, H, D]``): chunks ``rank``
    and ``2 * world_size - 1 - rank`` of ``2 * world_size``, concatenated (a new tensor)."""
    return cast(Tensor, _ring.zigzag_shard(x, rank, world_size, dim, _cat))


def zigzag_unshard(shards: Sequence[Tensor], *, dim: int = 2) -> Tensor:
    """The global sequence from every rank's part (``shards[r]`` from rank r, as
    ``torch.distributed.all_gather`` returns them): the inverse of :func:`zigzag_shard`."""
    return cast(Tensor, _ring.zigzag_unshard(shards, dim, _cat))


# ---- the ring -------------------------------------------------------------------------------


class _TorchRing:
    """This rank's neighbours in a process group, the transfers between them, and the tensor
    operations of the ring's step loops (mfa_native._ring.Engine)."""

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

    def shift(self, outgoing: Tensor) -> _Transfer:
        incoming = torch.empty_like(outgoing)
        operations = [
            dist.P2POp(dist.isend, outgoing, self.next, self.group),
            dist.P2POp(dist.irecv, incoming, self.previous, self.group),
        ]
        return list(dist.batch_isend_irecv(operations)), incoming

    @staticmethod
    def wait(transfer: _Transfer) -> Tensor:
        works, tensor = transfer
        for work in works:
            work.wait()
        return tensor

    @staticmethod
    def zeros(shape: tuple[int, ...]) -> Tensor:
        return torch.zeros(shape, dtype=torch.float32)

    @staticmethod
    def empty_lse(shape: tuple[int, ...]) -> Tensor:
        return torch.full(shape, -torch.inf)

    @staticmethod
    def pack(first: Tensor, second: Tensor) -> Tensor:
        return torch.cat([first.reshape(-1), second.reshape(-1)])

    @staticmethod
    def unpack(
        buffer: Tensor, first: Sequence[int], second: Sequence[int]
    ) -> tuple[Tensor, Tensor]:
        """Views of pack's buffer, contiguous in the two shapes."""
        split = math.prod(first)
        return buffer[:split].view(*first), buffer[split:].view(*second)

    @staticmethod
    def merge_rows(
        state: tuple[Tensor, Tensor], start: int, part: tuple[Tensor, Tensor], options: Options
    ) -> tuple[Tensor, Tensor]:
        """In place, on views of the state's rows."""
        out, lse = state
        axis = _ring.seq_axis(options.layout)
        rows = _ring.rows(out, axis, start, out.shape[axis])
        rows_lse = _ring.rows(lse, 2, start, lse.shape[2])
        _attention.merge_attention_states(
            [rows, part[0]],
            [rows_lse, part[1]],
            layout=options.layout,
            backend=options.backend,
            out=rows,
            lse=rows_lse,
        )
        return state

    @staticmethod
    def add_rows(total: Tensor, axis: int, start: int, stop: int, part: Tensor) -> Tensor:
        _ring.rows(total, axis, start, stop).add_(part)
        return total

    def add_to_block(
        self, block: Tensor, shapes: Shapes, axis: int, stop: int, parts: Any
    ) -> Tensor:
        """In place, on views of the block's buffer."""
        for array, part in zip(self.unpack(block, *shapes), parts):
            self.add_rows(array, axis, 0, stop, part)
        return block

    @staticmethod
    def cast(array: Tensor, like: Tensor) -> Tensor:
        return array.to(like.dtype)


class _RingAttention(torch.autograd.Function):
    """The ring's forward, saving q, k, v, out and lse, and its backward through the ring."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, options: Options, group: ProcessGroup | None
    ) -> tuple[Tensor, Tensor]:
        out, lse = _ring.forward(_TorchRing(group), q, k, v, options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        ctx.group = group
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(
        ctx: Any, dout: Tensor, _dlse: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        gradients = _ring.backward(_TorchRing(ctx.group), dout, q, k, v, out, lse, ctx.options)
        return (*gradients, None, None)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """That q, k and v are CPU tensors (the rest is _ring.check_inputs)."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise NotImplementedError(
                f"{name} is on {tensor.device}: ring_attention runs on CPU tensors (gloo, "
                "torch.distributed's backend on macOS, carries CPU tensors); on one device, "
                "mfa_native.torch.attention takes MPS tensors"
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
    _check_inputs(q, k, v)
    _ring.check_inputs(q, k, v, causal, scale, layout)
    options = Options(causal, None if scale is None else float(scale), layout, backend)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # torch types Function.apply without annotations.
        out, lse = _RingAttention.apply(q, k, v, options, group)  # type: ignore[no-untyped-call]
    else:
        out, lse = _ring.forward(_TorchRing(group), q, k, v, options)
    return (out, lse) if return_lse else out
