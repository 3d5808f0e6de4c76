"""Command line: ``python -m mfa_native {info,demo,bench,census}``."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import mfa_native
from mfa_native._measure import measure

_Array = npt.NDArray[Any]

_DEMO_SIZES = {
    # (batch, heads, sequence length, head dim)
    "default": (1, 8, 2048, 64),
    "small": (1, 2, 128, 32),
}
# mfa and the naive version both compute in float32; each output's error is a few float32
# roundings (2^-24) times growth of order sqrt(N) over the sums, far below this bound, which is
# relative to the largest magnitude of that output.
_DEMO_TOLERANCE = 1e-4


def _info(arguments: argparse.Namespace) -> int:
    details = mfa_native.info()
    if arguments.json:
        print(json.dumps(details, indent=2))
        return 0
    # The capabilities' keys printed after the others, at the same level.
    rows: dict[str, object] = {
        key: value for key, value in details.items() if key != "capabilities"
    }
    rows.update(details["capabilities"])
    for key, value in rows.items():
        print(f"{key:16} {', '.join(value) if isinstance(value, list) else value}")
    return 0


def _mib(count: int | None) -> str:
    return "n/a" if count is None else f"{count / 2**20:9.1f} MiB"


def _demo(arguments: argparse.Namespace) -> int:
    from mfa_native.bench import naive  # the benchmark's naive numpy attention

    batch, heads, seq, dim = _DEMO_SIZES[arguments.size]
    rng = np.random.default_rng(arguments.seed)
    q, k, v, dout = (
        rng.standard_normal((batch, heads, seq, dim), dtype=np.float32) for _ in range(4)
    )
    scale = 1 / math.sqrt(dim)
    context = mfa_native.Context(arguments.backend)
    print(
        f"mfa_native {mfa_native.__version__} demo: B={batch} H={heads} N={seq} D={dim} "
        f"float32, causal={arguments.causal}, backend {context.backend} "
        f"({context.device_name})"
    )

    # One-time costs (worker threads, BLAS and kernel set-up) are paid on a 16-row slice first.
    head = (q[:, :, :16], k[:, :, :16], v[:, :, :16])
    mfa_native.attention(*head, causal=arguments.causal, backend=context)
    naive.attention(*head, scale, arguments.causal)

    (out, lse), mfa_forward = measure(
        lambda: mfa_native.attention(
            q, k, v, causal=arguments.causal, return_lse=True, backend=context
        )
    )
    grads, mfa_backward = measure(
        lambda: mfa_native.attention_backward(
            dout, q, k, v, out, lse, causal=arguments.causal, backend=context
        )
    )
    (ref_out, ref_lse), naive_forward = measure(
        lambda: naive.attention(q, k, v, scale, arguments.causal)
    )
    ref_grads, naive_backward = measure(
        lambda: naive.attention_backward(dout, q, k, v, ref_out, ref_lse, scale, arguments.causal)
    )
    context.close()

    print(
        f"{'':16}{'time':>10}   {'peak extra, numpy (tracemalloc)':>32}   "
        f"{'peak extra, RSS (VmHWM)':>24}"
    )
    for label, cost in (
        ("mfa forward", mfa_forward),
        ("naive forward", naive_forward),
        ("mfa backward", mfa_backward),
        ("naive backward", naive_backward),
    ):
        print(
            f"{label:16}{cost.seconds:9.3f}s   {_mib(cost.traced_peak_bytes):>32}   "
            f"{_mib(cost.resident_rise_bytes):>24}"
        )
    unmeasured = mfa_forward.resident_rise_bytes is None
    print(
        "numpy (tracemalloc): peak of arrays allocated through numpy/Python during the call, "
        "outputs included.\nRSS (VmHWM): peak rise of the resident set during the call, "
        "libmfa's own allocations included"
        + ("; n/a: the high-water mark cannot be reset here." if unmeasured else ".")
    )

    within_tolerance = True
    for name, got, expected in zip(
        ("out", "lse", "dq", "dk", "dv"), (out, lse) + grads, (ref_out, ref_lse) + ref_grads
    ):
        error = float(np.max(np.abs(got.astype(np.float64) - expected)))
        bound = _DEMO_TOLERANCE * float(np.max(np.abs(expected)))
        within_tolerance &= error <= bound
        print(
            f"max abs error {name:4} {error:.3e}  (tolerance {bound:.3e})"
            f"{'' if error <= bound else '  FAILED'}"
        )
    return 0 if within_tolerance else 1


def _bench(argv: list[str]) -> int:
    # Imported here so that a missing benchmark module never affects the rest of the package.
    try:
        bench = importlib.import_module("mfa_native.bench")
    except ModuleNotFoundError as error:
        print(
            f"python -m mfa_native bench: the benchmark module is not available ({error})",
            file=sys.stderr,
        )
        return 2
    status = bench.main(argv)
    return 0 if status is None else int(status)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mfa_native",
        description="mfa_native: exact attention (FlashAttention) for Apple GPUs and CPUs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="version, library, backends and capabilities")
    info.add_argument("--json", action="store_true", help="print the details as JSON")
    info.set_defaults(run=_info)

    demo = commands.add_parser(
        "demo", help="forward and backward against a naive numpy version: errors, time, memory"
    )
    demo.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "cpu", "metal", "metal-sim"],
        help="'auto' (default) is metal where an Apple GPU is usable, else cpu; "
        "metal-sim is a slow simulator",
    )
    demo.add_argument(
        "--size",
        default="default",
        choices=sorted(_DEMO_SIZES),
        help="default: B=1 H=8 N=2048 D=64; small: B=1 H=2 N=128 D=32",
    )
    demo.add_argument("--causal", action="store_true", help="use a causal mask")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    demo.set_defaults(run=_demo)

    # Listed for --help only: main() hands "bench ..." to mfa_native.bench before parsing, since
    # argparse cannot pass options it does not know through unchanged.
    commands.add_parser(
        "bench", add_help=False, help="benchmarks; every later argument goes to mfa_native.bench"
    )
    commands.add_parser(
        "census",
        add_help=False,
        help="exact counts of the Metal kernels' memory traffic on metal-sim; every later "
        "argument goes to mfa_native.census",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    if argv[:1] == ["census"]:
        from mfa_native import census

        return census.main(argv[1:])
    arguments = _parser().parse_args(argv)
    status: int = arguments.run(arguments)
    return status


if __name__ == "__main__":
    sys.exit(main())
