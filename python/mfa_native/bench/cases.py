"""What the benchmark runs: one problem (a Case) and the named grids of cases.

A grid is a list of blocks; a block is a product of axes, each a tuple of values:

=========  ==========================================================================
axis       values
=========  ==========================================================================
dtype      "f32", "bf16", "f16"
batch      B
heads      query heads Hq
kv_heads   key/value heads Hkv (None: Hq); Hkv divides Hq (grouped-query attention)
seq_q      query rows Nq (None: Nk)
seq        key rows Nk (and query rows where seq_q is None)
dim        head dimension D
causal     False (no mask) and/or True (causal, top-left: query i sees keys j <= i)
windows    sliding windows (left, right), each run without causal
=========  ==========================================================================

An axis a block leaves out takes the backend's default (``cli.DEFAULTS``: the dtypes, and for
the readme grid N, D and the windows); an axis given on the command line replaces every
block's. ``--quick`` keeps the first values of the axes a grid names in ``quick``.

Adding a grid is one entry of ``GRIDS``; adding an axis is a field of ``Case`` (with its
default, so that the other grids do not change) and a name in ``AXES``.
"""

import itertools
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

__all__ = ["Case", "Grid", "GRIDS", "AXES", "PASSES", "cases"]

PASSES = ("fwd", "fwd+bwd")
AXES = ("dtype", "dim", "seq", "batch", "heads", "kv_heads", "seq_q", "causal", "windows")
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: q of shape (batch, heads, seq, dim); k and v of shape
    (batch, kv_heads, seq_k, dim). ``kv_heads`` and ``seq_k`` left out mean ``heads`` and
    ``seq`` (self-attention). Masks are aligned top-left, as PyTorch's ``is_causal``."""

    batch: int
    heads: int
    seq: int
    dim: int
    dtype: str
    causal: bool = False
    window: Optional[tuple] = None  # (left, right) in FlashAttention's convention, or None
    kv_heads: Optional[int] = None
    seq_k: Optional[int] = None

    def __post_init__(self):
        # Resolved here so that every report and the JSON carry the actual numbers.
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.seq_k is None:
            object.__setattr__(self, "seq_k", self.seq)
        if self.window is not None:
            object.__setattr__(self, "window", tuple(self.window))
        sizes = dict(batch=self.batch, heads=self.heads, seq=self.seq, dim=self.dim)
        sizes.update(kv_heads=self.kv_heads, seq_k=self.seq_k)
        small = [f"{name} {value}" for name, value in sizes.items() if value < 1]
        if small:
            raise ValueError(f"sizes must be >= 1: {', '.join(small)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} does not divide heads {self.heads}")

    def label(self):
        heads = f"H{self.heads}" + (f"/{self.kv_heads}" if self.kv_heads != self.heads else "")
        seq = f"N{self.seq}" if self.seq == self.seq_k else f"Nq{self.seq} Nk{self.seq_k}"
        mask = "causal" if self.causal else "full"
        if self.window is not None:
            mask += f" window{self.window[0]},{self.window[1]}"
        return f"{self.dtype} B{self.batch} {heads} {seq} D{self.dim} {mask}"

    def visible_pairs(self):
        """Exact count of (query, key) pairs the mask leaves visible, over one head."""
        rows = np.arange(self.seq, dtype=np.int64)
        lo = np.zeros(self.seq, np.int64)
        hi = np.full(self.seq, self.seq_k - 1, np.int64)
        if self.causal:
            hi = np.minimum(hi, rows)
        if self.window is not None:
            left, right = self.window
            if left >= 0:
                lo = np.maximum(lo, rows - left)
            if right >= 0:
                hi = np.minimum(hi, rows + right)
        return int(np.maximum(hi - lo + 1, 0).sum())

    def flops(self, which):
        """4 * B * Hq * pairs * D forward (two products of 2 * D FLOPs per pair), 3.5 times
        that for forward + backward (the backward's five products)."""
        forward = 4 * self.batch * self.heads * self.visible_pairs() * self.dim
        return forward if which == "fwd" else 3.5 * forward

    def instructions(self, which):
        """MFA's instruction count: forward (2D+5), dQ (3D+5), dK and dV (4D+5) per pair."""
        d = self.dim
        per_pair = 2 * d + 5 if which == "fwd" else (2 * d + 5) + (3 * d + 5) + (4 * d + 5)
        return self.batch * self.heads * self.visible_pairs() * per_pair

    def bytes(self, which):
        """The memory traffic no implementation can avoid, every operand read or written once:
        forward, q, k, v in and out out; forward + backward, the forward also writes the f32
        lse, and the backward reads dout, q, k, v, out, lse and writes dq, dk, dv. For decoding
        (few query rows) this is almost all k and v."""
        item = _ITEMSIZE[self.dtype]
        q = self.batch * self.heads * self.seq * self.dim * item
        kv = self.batch * self.kv_heads * self.seq_k * self.dim * item
        if which == "fwd":
            return 2 * q + 2 * kv
        lse = self.batch * self.heads * self.seq * 4
        return (2 * q + 2 * kv + lse) + (4 * q + 4 * kv + lse)


@dataclass(frozen=True)
class Grid:
    """A named list of blocks (dicts of axis -> values; see the module docstring)."""

    name: str
    summary: str
    blocks: tuple
    passes: tuple = PASSES
    quick: dict = field(default_factory=dict)  # axis -> how many leading values --quick keeps


GRIDS = {
    grid.name: grid
    for grid in (
        Grid(
            "readme",
            "the README's table: B 1, H 8, every N x D of the backend, no mask, causal and "
            "the backend's windows",
            ({},),
            quick={"seq": 1, "dim": 1},
        ),
        Grid(
            "decode",
            "decoding: Nq 1 and 4 against Nk 4k and 32k, Hq 32 with Hkv 8 and 32, D 128, "
            "B 1 and 8, forward only (k and v up to 8 GiB in f32: B 8, Hkv 32, Nk 32k)",
            (
                {
                    "seq_q": (1, 4),
                    "seq": (4096, 32768),
                    "heads": (32,),
                    "kv_heads": (8, 32),
                    "dim": (128,),
                    "batch": (1, 8),
                    "causal": (False,),
                    "windows": (),
                },
            ),
            passes=("fwd",),
            quick={"seq": 1, "batch": 1, "seq_q": 1},
        ),
        Grid(
            "shapes",
            "the shapes models run beside the README's: D 80, 96, 256; GQA prefill (Hq 32, "
            "Hkv 8, N 2048, D 128); small N with a large batch (B 8, N 128 and 256); B 4 at "
            "N 2048",
            (
                {"dim": (80, 96, 256), "seq": (1024, 2048), "windows": ()},
                {"heads": (32,), "kv_heads": (8,), "seq": (2048,), "dim": (128,), "windows": ()},
                {"batch": (8,), "seq": (128, 256), "dim": (64, 128), "windows": ()},
                {"batch": (4,), "seq": (2048,), "dim": (64,), "windows": ()},
            ),
            quick={"seq": 1, "dim": 1},
        ),
    )
}


def cases(grid, defaults, overrides=None, quick=False):
    """The cases of grid, in report order (dtype, D, Nk, B, Hq, Hkv, Nq, then the masks).

    defaults: axis -> values for the axes a block leaves out (every axis of AXES);
    overrides: axis -> values given on the command line, replacing every block's.
    """
    overrides = overrides or {}
    result = []
    for block in grid.blocks:
        axes = {**defaults, **block}
        if quick:
            axes.update({axis: tuple(axes[axis])[:keep] for axis, keep in grid.quick.items()})
        axes.update(overrides)
        masks = [(causal, None) for causal in axes["causal"]]
        masks += [(False, tuple(window)) for window in axes["windows"]]
        for dtype, dim, seq, batch, heads, kv_heads, seq_q in itertools.product(
            *(axes[axis] for axis in AXES[:7])
        ):
            for causal, window in masks:
                result.append(
                    Case(
                        batch,
                        heads,
                        seq if seq_q is None else seq_q,
                        dim,
                        dtype,
                        causal,
                        window,
                        kv_heads=kv_heads,
                        seq_k=seq,
                    )
                )
    return result
