"""Benchmark mfa's attention against its peers, side by side in one process.

    python -m mfa_native bench                 # the default grid (a few minutes on 2 cores)
    python -m mfa_native bench --quick         # a smaller grid, fewer repeats
    python -m mfa_native bench --json out.json --plot speed.png

Peers, each run on the same inputs in the same process:

mfa
    this package, on the backend chosen with ``--backend`` (default cpu).
torch
    PyTorch's ``scaled_dot_product_attention`` on the CPU (its flash-attention kernel for
    float32 and bfloat16), when torch is importable. Never required. Sliding windows have no
    torch equivalent short of an N x N mask, so those rows show none.
numpy
    naive attention that materializes the N x N scores, in float32, up to ``--naive-max-seq``.

Metrics, per configuration and pass ("fwd" = forward, "fwd+bwd" = forward then backward):

ms
    median wall time of ``--repeats`` runs after one warm-up run.
GFLOP/s
    4 * B * H * pairs * D per forward, 2.5 times that more for the backward, where pairs is
    the exact number of visible (query, key) pairs: N^2 without a mask, about N^2 / 2 causal.
GINSTRS
    MFA's measure (one FMA = one instruction): (2D + 5) * pairs forward and (9D + 15) * pairs
    forward + backward, per head, per second, in billions. It counts the work of MFA's
    7-product backward, which mfa's CPU backend also does.
x peer
    the peer's time divided by mfa's (above 1: mfa is faster). A "!" after a peer's time marks
    a result that differs from mfa's by more than the dtype's tolerance (a sanity check of the
    run, not a test: the tests compare against float64).
% GEMM
    mfa's GFLOP/s as a fraction of this machine's float32 GEMM ceiling, measured in the same
    run as the best of three numpy float32 matmuls of 4096 x 4096 x 4096.
peak extra MiB
    how far the process's resident set rose during one untimed run beyond the memory of the
    results that run returned (Linux only: the kernel's VmHWM, reset before the run). glibc's
    adaptive mmap threshold is pinned first so that freed blocks leave the resident set.

``--memory-check`` (on by default) also runs mfa alone at the issue's memory targets:
float32, B=1, H=8, N=16384, D=64, forward (< 64 MB extra) and forward + backward (< 128 MB).

Results go to a table on stdout, to JSON with ``--json`` and to a PNG of speed against N with
``--plot`` when matplotlib is installed. Timing numbers on shared machines are noisy: compare
peers within one run.
"""

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

import mfa_native

__all__ = ["main"]

_MIB = 2**20
_DTYPES = ("f32", "bf16", "f16")
_PASSES = ("fwd", "fwd+bwd")
# Relative error (to the largest magnitude of the peer's result) beyond which a row is flagged:
# the float32 bound leaves room for float32 reductions over N, bf16 / f16 for one rounding of
# the output (2^-8, 2^-11) plus the inputs' own rounding seen through different accumulations.
_AGREEMENT = {"f32": 1e-4, "bf16": 3e-2, "f16": 5e-3}


@dataclass(frozen=True)
class Config:
    """One benchmarked problem: q, k, v of shape (batch, heads, seq, dim), self-attention."""

    batch: int
    heads: int
    seq: int
    dim: int
    dtype: str
    causal: bool
    window: tuple = None  # (left, right) in FlashAttention's convention, or None

    def label(self):
        mask = "causal" if self.causal else "full"
        if self.window is not None:
            mask += f" window{self.window[0]},{self.window[1]}"
        return f"{self.dtype} B{self.batch} H{self.heads} N{self.seq} D{self.dim} {mask}"

    def visible_pairs(self):
        """Exact count of (query, key) pairs the mask leaves visible, over one head."""
        n = self.seq
        rows = np.arange(n, dtype=np.int64)
        lo = np.zeros(n, np.int64)
        hi = np.full(n, n - 1, np.int64)
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
        forward = 4 * self.batch * self.heads * self.visible_pairs() * self.dim
        return forward if which == "fwd" else 3.5 * forward

    def instructions(self, which):
        per_pair = 2 * self.dim + 5 if which == "fwd" else 9 * self.dim + 15
        return self.batch * self.heads * self.visible_pairs() * per_pair


# ---- Inputs ---------------------------------------------------------------------------------

def _numpy_dtype(name):
    if name == "f32":
        return np.dtype(np.float32)
    if name == "f16":
        return np.dtype(np.float16)
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _inputs(config, seed=0):
    """q, k, v, dout as standard-normal arrays of the config's dtype."""
    rng = np.random.default_rng(seed)
    shape = (config.batch, config.heads, config.seq, config.dim)
    dtype = _numpy_dtype(config.dtype)
    return tuple(rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(4))


# ---- Peers ----------------------------------------------------------------------------------

class MfaPeer:
    name = "mfa"

    def __init__(self, backend, threads):
        self.context = mfa_native.Context(backend, num_threads=threads)

    def skip_reason(self, config):
        return None

    def prepare(self, config, q, k, v, dout):
        options = dict(causal=config.causal, causal_alignment="top_left", window=config.window,
                       backend=self.context)

        def forward():
            return mfa_native.attention(q, k, v, **options)

        def forward_backward():
            out, lse = mfa_native.attention(q, k, v, return_lse=True, **options)
            return mfa_native.attention_backward(dout, q, k, v, out, lse, **options)

        return {"fwd": forward, "fwd+bwd": forward_backward}


class TorchPeer:
    name = "torch"

    def __init__(self, torch, threads):
        self.torch = torch
        torch.set_num_threads(threads)
        self.functional = torch.nn.functional

    def skip_reason(self, config):
        if config.window is not None:
            return "no sliding window"
        return None

    def _tensor(self, array):
        if array.dtype == np.float32 or array.dtype == np.float16:
            return self.torch.from_numpy(array)
        return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)

    def prepare(self, config, q, k, v, dout):
        tq, tk, tv, tdout = (self._tensor(a) for a in (q, k, v, dout))
        attend = self.functional.scaled_dot_product_attention
        torch = self.torch

        def forward():
            with torch.no_grad():
                return attend(tq, tk, tv, is_causal=config.causal)

        leaves = [t.detach().clone().requires_grad_(True) for t in (tq, tk, tv)]

        def forward_backward():
            for leaf in leaves:
                leaf.grad = None
            attend(*leaves, is_causal=config.causal).backward(tdout)
            return tuple(leaf.grad for leaf in leaves)

        return {"fwd": forward, "fwd+bwd": forward_backward}


class NumpyPeer:
    """Naive attention in float32 numpy: the N x N scores and probabilities are materialized."""

    name = "numpy"

    def __init__(self, max_seq):
        self.max_seq = max_seq

    def skip_reason(self, config):
        if config.seq > self.max_seq:
            return f"N > --naive-max-seq {self.max_seq}"
        return None

    def prepare(self, config, q, k, v, dout):
        q, k, v, dout = (a.astype(np.float32) for a in (q, k, v, dout))
        scale = np.float32(1 / math.sqrt(config.dim))
        rows = np.arange(config.seq)[:, None]
        cols = np.arange(config.seq)[None, :]
        visible = np.ones((config.seq, config.seq), bool)
        if config.causal:
            visible &= cols <= rows
        if config.window is not None:
            left, right = config.window
            if left >= 0:
                visible &= cols >= rows - left
            if right >= 0:
                visible &= cols <= rows + right

        def probabilities():
            scores = np.where(visible, (q @ np.swapaxes(k, -1, -2)) * scale, -np.inf)
            peak = np.max(scores, axis=-1, keepdims=True)
            peak = np.where(np.isfinite(peak), peak, 0)
            weights = np.exp(scores - peak)
            total = np.sum(weights, axis=-1, keepdims=True)
            return weights / np.where(total > 0, total, 1)

        def forward():
            return probabilities() @ v

        def forward_backward():
            p = probabilities()
            out = p @ v
            dv = np.swapaxes(p, -1, -2) @ dout
            row_dot = np.sum(dout * out, axis=-1, keepdims=True)
            dscores = p * (dout @ np.swapaxes(v, -1, -2) - row_dot)
            return dscores @ k * scale, np.swapaxes(dscores, -1, -2) @ q * scale, dv

        return {"fwd": forward, "fwd+bwd": forward_backward}


def _make_peers(arguments):
    peers = []
    wanted = arguments.peers
    if "mfa" in wanted:
        peers.append(MfaPeer(arguments.backend, arguments.threads))
    if "torch" in wanted:
        try:
            import torch
        except ImportError:
            print("bench: torch is not installed; running without it", file=sys.stderr)
        else:
            peers.append(TorchPeer(torch, arguments.threads or _cpu_count()))
    if "numpy" in wanted:
        peers.append(NumpyPeer(arguments.naive_max_seq))
    return peers


# ---- Measurement ----------------------------------------------------------------------------

def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _median_seconds(function, repeats):
    """Median wall time of repeats calls (the caller has made a warm-up call already)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _pin_mmap_threshold():
    """Keep glibc from raising its mmap threshold after large frees, which would otherwise keep
    freed blocks resident and hide later peaks. No effect (and no harm) elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        m_mmap_threshold = -3
        libc.mallopt(m_mmap_threshold, 128 * 1024)
    except (OSError, AttributeError):
        pass


def _status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _result_bytes(result):
    if isinstance(result, (tuple, list)):
        return sum(_result_bytes(item) for item in result)
    nbytes = getattr(result, "nbytes", None)
    if nbytes is None and hasattr(result, "element_size"):  # torch tensor
        nbytes = result.element_size() * result.nelement()
    return int(nbytes or 0)


def _peak_extra_bytes(function):
    """Resident-set rise during one call of function, minus what its results occupy; None where
    the high-water mark cannot be reset."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        before = _status_kib("VmRSS")
    except OSError:
        return None
    result = function()
    peak = _status_kib("VmHWM")
    extra = (peak - before) * 1024 - _result_bytes(result)
    del result
    return max(extra, 0)


def _gemm_ceiling(size=4096):
    """Best GFLOP/s of three float32 numpy matmuls of size^3."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def _max_relative_difference(got, expected):
    """max |got - expected| / max |expected| over every array of the results, in float64."""
    if isinstance(got, (tuple, list)):
        return max(_max_relative_difference(g, e) for g, e in zip(got, expected))
    got, expected = _as_float64(got), _as_float64(expected)
    scale = float(np.max(np.abs(expected))) or 1.0
    return float(np.max(np.abs(got - expected))) / scale


def _as_float64(array):
    if hasattr(array, "detach"):  # torch tensor
        return array.detach().float().numpy().astype(np.float64)
    return np.asarray(array).astype(np.float64)


# ---- Progress and reports -------------------------------------------------------------------

class _Progress:
    """A one-line progress bar on stderr (redrawn in place when stderr is a terminal)."""

    def __init__(self, total, stream=sys.stderr):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.started = time.perf_counter()
        self.live = stream.isatty()

    def step(self, label):
        self.done += 1
        width = 30
        filled = width * self.done // self.total
        elapsed = time.perf_counter() - self.started
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{elapsed:6.1f}s  {label}")
        if self.live:
            self.stream.write("\r" + line[:150].ljust(150))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


def _format(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def _table(rows, peers, ceiling):
    others = [peer for peer in peers if peer != "mfa"]
    header = ["config", "pass", "mfa ms", "GFLOP/s", "GINSTRS"]
    if ceiling:
        header.append("% GEMM")
    header.append("MiB extra")
    for peer in others:
        header += [f"{peer} ms", f"x {peer}", f"{peer} MiB"]
    lines = [header]
    for row in rows:
        mfa = row["results"].get("mfa", {})
        line = [row["config_label"], row["pass"], _format(mfa.get("ms"), ".1f"),
                _format(mfa.get("gflops"), ".0f"), _format(mfa.get("ginstrs"), ".0f")]
        if ceiling:
            gflops = mfa.get("gflops")
            line.append(_format(None if gflops is None else 100 * gflops / ceiling, ".0f"))
        line.append(_format(_mib(mfa.get("peak_extra_bytes")), ".1f"))
        for peer in others:
            result = row["results"].get(peer, {})
            line += [_format(result.get("ms"), ".1f", result.get("skipped") and "n/a" or "-"),
                     _format(result.get("speedup_of_mfa"), ".2f"),
                     _format(_mib(result.get("peak_extra_bytes")), ".1f")]
            if result.get("disagrees"):
                line[-3] += " !"
        lines.append(line)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).rjust(width) if i else str(cell).ljust(width)
                  for i, (cell, width) in enumerate(zip(line, widths)))
        for line in lines)


def _mib(count):
    return None if count is None else count / _MIB


def _plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed; no plot written", file=sys.stderr)
        return False
    series = {}
    for row in rows:
        config = row["config"]
        if config["window"] is not None:
            continue
        panel = (row["pass"], config["dtype"])
        for peer, result in row["results"].items():
            if result.get("gflops") is None:
                continue
            key = (peer, config["dim"], config["causal"])
            series.setdefault(panel, {}).setdefault(key, []).append(
                (config["seq"], result["gflops"]))
    if not series:
        return False
    # Colour says which peer, line style which head dimension, marker whether causal.
    colours = {"mfa": "tab:blue", "torch": "tab:orange", "numpy": "tab:green"}
    dims = sorted({key[1] for lines in series.values() for key in lines})
    styles = ["-", "--", ":", "-."]
    panels = sorted(series)
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        for (peer, dim, causal), points in sorted(series[panel].items()):
            points.sort()
            axis.plot([p[0] for p in points], [p[1] for p in points],
                      color=colours.get(peer), marker="x" if causal else "o",
                      linestyle=styles[dims.index(dim) % len(styles)],
                      label=f"{peer} D={dim}{' causal' if causal else ''}")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("N")
        axis.set_ylabel("GFLOP/s")
        axis.set_title(f"{panel[1]} {panel[0]}")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


# ---- The run --------------------------------------------------------------------------------

def _grid(arguments):
    causal_values = {"both": (False, True), "yes": (True,), "no": (False,)}[arguments.causal]
    configs = []
    for dtype in arguments.dtypes:
        for dim in arguments.head_dims:
            for seq in arguments.seq:
                for causal in causal_values:
                    configs.append(Config(arguments.batch, arguments.heads, seq, dim, dtype,
                                          causal))
                for window in arguments.window:
                    configs.append(Config(arguments.batch, arguments.heads, seq, dim, dtype,
                                          False, window))
    return configs


def _benchmark(configs, peers, arguments, progress):
    rows = []
    for config in configs:
        inputs = _inputs(config)
        prepared = {}
        for peer in peers:
            reason = peer.skip_reason(config)
            prepared[peer.name] = reason if reason else peer.prepare(config, *inputs)
        for which in arguments.passes:
            results = {}
            reference = None
            for peer in peers:
                progress.step(f"{config.label()} {which} {peer.name}")
                runner = prepared[peer.name]
                if isinstance(runner, str):
                    results[peer.name] = {"skipped": runner}
                    continue
                function = runner[which]
                # The first call doubles as the warm-up (first-touch page faults, lazy setup).
                output = function()
                seconds = _median_seconds(function, arguments.repeats)
                result = {
                    "ms": seconds * 1e3,
                    "gflops": config.flops(which) / seconds / 1e9,
                    "ginstrs": config.instructions(which) / seconds / 1e9,
                    "peak_extra_bytes": _peak_extra_bytes(function) if arguments.memory else None,
                }
                if reference is None:
                    reference = output  # mfa's, when mfa runs: peers are checked against it
                else:
                    difference = _max_relative_difference(output, reference)
                    result["max_relative_difference_to_mfa"] = difference
                    result["disagrees"] = difference > _AGREEMENT[config.dtype]
                del output
                results[peer.name] = result
            mfa = results.get("mfa", {})
            for name, result in results.items():
                if name != "mfa" and "ms" in result and "ms" in mfa:
                    result["speedup_of_mfa"] = result["ms"] / mfa["ms"]
            rows.append({"config": asdict(config), "config_label": config.label(),
                         "pass": which, "results": results})
    return rows


def _memory_targets(arguments):
    """mfa alone at the issue's memory targets (float32, B=1, H=8, N=16384, D=64)."""
    config = Config(1, 8, 16384, 64, "f32", False)
    peer = MfaPeer(arguments.backend, arguments.threads)
    functions = peer.prepare(config, *_inputs(config))
    limits = {"fwd": 64e6, "fwd+bwd": 128e6}
    report = []
    for which in _PASSES:
        extra = _peak_extra_bytes(functions[which])
        report.append({"config_label": config.label(), "pass": which, "peak_extra_bytes": extra,
                       "limit_bytes": limits[which],
                       "met": None if extra is None else extra < limits[which]})
    return report


def _parse_window(text):
    try:
        left, right = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT (e.g. 256,0), got {text!r}")
    return (left, right)


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m mfa_native bench",
        description="Time mfa against PyTorch CPU SDPA and naive numpy attention.")
    parser.add_argument("--quick", action="store_true",
                        help="N 1024 2048, D 64, repeats 3, no memory check")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "auto", "metal", "metal-sim"])
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for mfa and torch (default: every usable core)")
    parser.add_argument("--peers", nargs="+", default=["mfa", "torch", "numpy"],
                        choices=["mfa", "torch", "numpy"])
    parser.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], choices=_DTYPES)
    parser.add_argument("--seq", nargs="+", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    parser.add_argument("--window", nargs="*", type=_parse_window, default=[(256, 0)],
                        help="sliding windows LEFT,RIGHT to add per shape (default 256,0)")
    parser.add_argument("--passes", nargs="+", default=list(_PASSES), choices=_PASSES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--naive-max-seq", type=int, default=2048,
                        help="largest N the naive numpy peer runs (it stores N x N scores)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the peak-extra-memory measurement of every row")
    parser.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                        help="skip mfa's run at the memory targets (N=16384)")
    parser.add_argument("--no-gemm", dest="gemm", action="store_false",
                        help="skip measuring the float32 GEMM ceiling")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of GFLOP/s against N")
    return parser


def main(argv=None):
    """Run the benchmark; returns the process exit status (0, or 2 for bad arguments)."""
    arguments = _parser().parse_args(argv)
    if arguments.quick:
        arguments.seq, arguments.head_dims, arguments.repeats = [1024, 2048], [64], 3
        arguments.memory_check = False
    if arguments.repeats < 1 or arguments.threads < 0 or min(arguments.seq) < 1:
        print("bench: --repeats and --seq must be >= 1, --threads >= 0", file=sys.stderr)
        return 2
    _pin_mmap_threshold()
    peers = _make_peers(arguments)
    if not any(peer.name == "mfa" for peer in peers):
        print("bench: mfa must be among --peers", file=sys.stderr)
        return 2
    mfa = peers[0]
    configs = _grid(arguments)
    print(f"mfa_native {mfa_native.__version__} on {mfa.context.device_name}; "
          f"{platform.machine()}, {_cpu_count()} usable cores; "
          f"peers: {', '.join(peer.name for peer in peers)}")

    ceiling = _gemm_ceiling() if arguments.gemm else None
    if ceiling:
        print(f"float32 GEMM ceiling (numpy matmul 4096^3): {ceiling:.0f} GFLOP/s")
    progress = _Progress(len(configs) * len(arguments.passes) * len(peers))
    rows = _benchmark(configs, peers, arguments, progress)
    progress.close()
    print(_table(rows, [peer.name for peer in peers], ceiling))

    memory = _memory_targets(arguments) if arguments.memory_check else []
    for check in memory:
        extra = check["peak_extra_bytes"]
        verdict = "n/a" if extra is None else ("met" if check["met"] else "NOT met")
        print(f"memory target, {check['config_label']} {check['pass']}: "
              f"{_format(_mib(extra), '.1f', 'n/a')} MiB extra "
              f"(limit {check['limit_bytes'] / 1e6:.0f} MB): {verdict}")

    if arguments.json:
        document = {
            "mfa_version": mfa_native.__version__,
            "device": mfa.context.device_name,
            "machine": platform.machine(),
            "usable_cores": _cpu_count(),
            "threads": arguments.threads or _cpu_count(),
            "peers": [peer.name for peer in peers],
            "repeats": arguments.repeats,
            "gemm_ceiling_gflops": ceiling,
            "rows": rows,
            "memory_targets": memory,
        }
        with open(arguments.json, "w") as stream:
            json.dump(document, stream, indent=1)
        print(f"wrote {arguments.json}")
    if arguments.plot and _plot(rows, arguments.plot):
        print(f"wrote {arguments.plot}")
    return 0
