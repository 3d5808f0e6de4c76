"""Per-call overhead of mfa_native's adapters against the raw numpy call, at small shapes.

    .venv/bin/python scripts/adapter_overhead.py [--rounds N] [--calls N]

For each shape (B = 1, H = 8, D = 64: N = 128, and decoding, Nq = 1 against Nk = 128) and each
path, times `calls` back-to-back calls, `rounds` times, interleaving the paths within each
round so that load from other processes falls on all of them alike, and keeps each path's
fastest round: the time of an undisturbed call. Two tables: the whole call, and the Python
layer alone, with libmfa's entry point replaced by a no-op (what the adapters add is Python,
and without the kernel's time the difference is not buried in its noise). The overhead of a
path is its time minus the raw numpy call's. torch and MLX paths appear where installed.
"""

import argparse
import platform
import time

import mfa_native
import numpy as np

try:
    import mfa_native.flash_attn
    import mfa_native.torch
    import torch
except ImportError:
    torch = None
try:
    import mfa_native.mlx
    import mlx.core as mx
except ImportError:
    mx = None


def paths(q, k, v):
    """(name, function of no arguments) for every path, the raw numpy call first."""
    yield "numpy: mfa_native.attention", lambda: mfa_native.attention(q, k, v, causal=True)
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        yield (
            "torch tensors: mfa_native.attention",
            lambda: mfa_native.attention(tq, tk, tv, causal=True),
        )
        yield (
            "mfa_native.torch.attention",
            lambda: mfa_native.torch.attention(tq, tk, tv, causal=True),
        )
        gq, gk, gv = (x.clone().requires_grad_() for x in (tq, tk, tv))
        yield (
            "mfa_native.torch.attention, recording autograd",
            lambda: mfa_native.torch.attention(gq, gk, gv, causal=True),
        )
        yield (
            "mfa_native.torch.scaled_dot_product_attention",
            lambda: mfa_native.torch.scaled_dot_product_attention(tq, tk, tv, is_causal=True),
        )
        bq, bk, bv = (x.transpose(1, 2) for x in (tq, tk, tv))
        yield (
            "mfa_native.flash_attn.flash_attn_func",
            lambda: mfa_native.flash_attn.flash_attn_func(bq, bk, bv, causal=True),
        )
    if mx is not None:
        mq, mk, mv = (mx.array(x) for x in (q, k, v))
        mx.eval(mq, mk, mv)
        yield (
            "MLX arrays: mfa_native.attention",
            lambda: mfa_native.attention(mq, mk, mv, causal=True),
        )
        scale = q.shape[-1] ** -0.5
        yield (
            "mfa_native.mlx.scaled_dot_product_attention",
            lambda: mfa_native.mlx.scaled_dot_product_attention(
                mq, mk, mv, scale=scale, mask="causal"
            ),
        )


def cpu_model():
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(functions, rounds, calls):
    """Fastest per-call seconds of each function over interleaved rounds."""
    best = [float("inf")] * len(functions)
    for function in functions:
        function()  # warm up: shared contexts, caches, first-call dispatch
    for _ in range(rounds):
        for index, function in enumerate(functions):
            started = time.perf_counter()
            for _ in range(calls):
                function()
            best[index] = min(best[index], (time.perf_counter() - started) / calls)
    return best


def table(title, names, seconds):
    print(f"\n{title}")
    print(f"{'path':52s} {'us/call':>9s} {'overhead us':>12s}")
    for name, value in zip(names, seconds):
        print(f"{name:52s} {value * 1e6:9.1f} {(value - seconds[0]) * 1e6:12.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20)
    arguments = parser.parse_args()
    print(f"CPU: {cpu_model()}; {mfa_native.info()['device']}")
    print(f"numpy {np.__version__}" + (f", torch {torch.__version__}" if torch else "")
          + (f", mlx {mx.__version__}" if mx else ""))  # fmt: skip
    rng = np.random.default_rng(0)
    for label, q_shape, kv_shape in (
        ("N = 128", (1, 8, 128, 64), (1, 8, 128, 64)),
        ("decode: Nq = 1, Nk = 128", (1, 8, 1, 64), (1, 8, 128, 64)),
    ):
        q = rng.standard_normal(q_shape).astype(np.float32)
        k, v = (rng.standard_normal(kv_shape).astype(np.float32) for _ in range(2))
        names, functions = zip(*paths(q, k, v))
        table(f"{label}, whole call", names, measure(functions, arguments.rounds, arguments.calls))
        call = mfa_native.Context._call
        mfa_native.Context._call = lambda self, function, *args: None
        try:
            seconds = measure(functions, arguments.rounds, arguments.calls)
        finally:
            mfa_native.Context._call = call
        table(f"{label}, Python layer alone (libmfa entry point a no-op)", names, seconds)


if __name__ == "__main__":
    main()
