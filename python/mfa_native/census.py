"""The kernel census: what the Metal kernels do, counted exactly on metal-sim.

``python -m mfa_native census`` runs the forward and the backward on metal-sim for each
simulated GPU family's plan, dtype and head dimension, with the simulator's census on
(``MFA_SIM_CENSUS``: one line per dispatch of the bytes its threads read and wrote in
threadgroup and device memory, its barriers and its simdgroup matrix products), and prints per
kernel:

- threadgroup bytes (read + written) per useful FMA,
- device bytes (read + written) per useful FMA,
- device accesses (loads and stores, a vector load counting as one) per useful FMA: what the
  staging copies' vector loads cut, four elements a load on interior tiles,
- barriers per traversal block (per threadgroup),
- simdgroup matrix products per useful FMA x 512 (one 8x8x8 product is 512 FMAs; 1.0 means no
  wasted products).

Useful FMAs are the visible (query, key) pairs times the widths each kernel multiplies over:
forward S = Q K^T and O = P V (D + Dv); backward-query S, dP = dO V^T and dQ = dS K (2 D + Dv);
backward-key-value S, dP, dV = P^T dO and dK = dS^T Q (2 D + 2 Dv). These are counts of the
kernels' work, not timings. The race detector is turned off for the run (it does not change
the counts, only the time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

FAMILIES = ("apple7", "apple8", "apple9")
DTYPES = ("float16", "bfloat16", "float32")
HEAD_DIMS = (64, 128, 256)
# Threadgroup bytes per FMA of the forward that the peers' kernels move (f16, M1 for MFA).
PEER_FORWARD_THREADGROUP_BYTES_PER_FMA = {"MFA": "0.31", "MLX": "0.34-0.37"}

_TRAVERSAL_CONSTANT = "104"  # MFA_FC_BLOCK_TRAVERSAL (metal/attention_params.h)
_KERNELS: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "kernel_attention_forward": ("forward", lambda d, dv: d + dv),
    "kernel_attention_backward_query": ("backward-query", lambda d, dv: 2 * d + dv),
    "kernel_attention_backward_key_value": ("backward-key-value", lambda d, dv: 2 * d + 2 * dv),
}


def _dtype(name: str) -> np.dtype[Any]:
    from ._context import bfloat16

    return bfloat16() if name == "bfloat16" else np.dtype(name)


def census(
    families: Sequence[str] = FAMILIES,
    dtypes: Sequence[str] = DTYPES,
    head_dims: Sequence[int] = HEAD_DIMS,
    sequence: int = 128,
) -> list[dict[str, Any]]:
    """One row per (family, dtype, D, kernel): the census of a B=1, H=1, N=sequence problem."""
    if sequence < 1:
        raise ValueError(f"sequence must be at least 1, not {sequence}")
    os.environ["MFA_SIM_CHECK_RACES"] = "0"
    import mfa_native

    rows = []
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "census.jsonl")
        os.environ["MFA_SIM_CENSUS"] = path
        try:
            rng = np.random.default_rng(0)
            for family in families:
                context = mfa_native.Context(backend="metal-sim", gpu_family=family)
                for dtype_name in dtypes:
                    dtype = _dtype(dtype_name)
                    for d in head_dims:
                        shape = (1, 1, sequence, d)
                        q, k, v, dout = (
                            rng.standard_normal(shape).astype(np.float32).astype(dtype)
                            for _ in range(4)
                        )
                        if os.path.exists(path):
                            os.remove(path)
                        out, lse = mfa_native.attention(q, k, v, return_lse=True, backend=context)
                        mfa_native.attention_backward(dout, q, k, v, out, lse, backend=context)
                        with open(path, encoding="utf-8") as f:
                            dispatches = [json.loads(line) for line in f]
                        rows.extend(_rows(family, dtype_name, d, sequence, dispatches))
        finally:
            del os.environ["MFA_SIM_CENSUS"]
    return rows


def _rows(
    family: str, dtype: str, d: int, n: int, dispatches: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for dispatch in dispatches:
        if dispatch["kernel"] not in _KERNELS:
            continue
        name, widths = _KERNELS[dispatch["kernel"]]
        fmas = n * n * widths(d, d)  # every pair is visible: no mask
        groups = int(np.prod(dispatch["threadgroups"]))
        traversal = dispatch["constants"][_TRAVERSAL_CONSTANT]
        blocks = -(-n // traversal)
        products = sum(dispatch["multiplies"].values())
        rows.append(
            {
                "family": family,
                "dtype": dtype,
                "D": d,
                "kernel": name,
                "threadgroup_bytes_per_fma": (
                    dispatch["threadgroup_bytes_read"] + dispatch["threadgroup_bytes_written"]
                )
                / fmas,
                "device_bytes_per_fma": (
                    dispatch["device_bytes_read"] + dispatch["device_bytes_written"]
                )
                / fmas,
                "device_accesses_per_fma": dispatch["device_accesses"] / fmas,
                "barriers_per_block": dispatch["barriers"] / (groups * blocks),
                "products_per_useful": products * 512 / fmas,
                "multiplies": dispatch["multiplies"],
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| family | dtype | D | kernel | threadgroup B/FMA | device B/FMA | device accesses/FMA "
        "| barriers/block | MMA work/useful |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['dtype']} | {r['D']} | {r['kernel']} "
            f"| {r['threadgroup_bytes_per_fma']:.3f} | {r['device_bytes_per_fma']:.3f} "
            f"| {r['device_accesses_per_fma']:.4f} "
            f"| {r['barriers_per_block']:.2f} | {r['products_per_useful']:.2f} |"
        )
    peers = ", ".join(f"{k} {v}" for k, v in PEER_FORWARD_THREADGROUP_BYTES_PER_FMA.items())
    lines.append("")
    lines.append(f"Forward threadgroup bytes per FMA of the peers (f16): {peers}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mfa_native census", description=__doc__)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    parser.add_argument("--sequence", type=int, default=128, help="N of the problem (128)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    arguments = parser.parse_args(argv)
    rows = census(arguments.families, arguments.dtypes, arguments.head_dims, arguments.sequence)
    print(json.dumps(rows, indent=2) if arguments.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
