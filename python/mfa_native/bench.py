"""Benchmark mfa's attention against its peers, side by side in one process.

    python -m mfa_native bench                      # cpu: the default grid (minutes on 2 cores)
    python -m mfa_native bench --quick              # a smaller grid, fewer repeats
    python -m mfa_native bench --backend metal      # on a Mac: N up to 16384, D up to 256
    python -m mfa_native bench --backend metal-sim  # anywhere: a smoke test at small sizes
    python -m mfa_native bench --json out.json --plot speed.png

These options default per backend (``--help`` lists them too):

========= ========================== ========== ============== ======= ========== ==============
backend   N                          D          dtypes         repeats dispatches peers
========= ========================== ========== ============== ======= ========== ==============
cpu       1024 2048 4096             64 128     f32 bf16       5       1          torch numpy
metal     1024 2048 4096 8192 16384  64 128 256 f16 bf16       5       5          mlx torch numpy
metal-sim 64 256                     16 64      f32            1       1          numpy
========= ========================== ========== ============== ======= ========== ==============

Each shape runs without a mask, causal, and with a sliding window (256,0; 32,0 on metal-sim).
``auto`` takes the defaults of the backend it resolves to. ``--quick`` keeps the first two
lengths, the first head dimension and at most 3 repeats: the full metal grid is long, since
its largest shapes take seconds per call and the peers' unfused backward longer still.
The float32 GEMM ceiling and the
memory targets are measured on cpu only unless asked for; metal-sim simulates every GPU thread
on the CPU, so its times say nothing about a GPU: it runs to check that the metal kernels'
results agree with the other peers.

Peers, each run on the same inputs in the same process; every peer but mfa is optional and
imported only when asked for:

mfa
    this package, on the backend chosen with ``--backend``. Its inputs are copied once into
    page-aligned memory (``mfa_native.empty``) so that the metal backend wraps them without a
    copy.
torch
    PyTorch's ``scaled_dot_product_attention``: on the CPU for cpu and metal-sim (its
    flash-attention kernel for float32 and bfloat16), on the GPU ("mps") for metal, with
    ``torch.mps.synchronize()`` ending each timed call. The backward is autograd (on "mps":
    through the N x N attention matrix). On "mps", configurations whose float32 N x N scores
    (B * H * N^2 * 4 bytes) reach 4 GiB are skipped: MPS aborts the process on NDArrays of
    2^32 bytes or more. Sliding windows have no torch equivalent short of an N x N mask, so
    those rows show none.
mlx
    MLX's ``mlx.core.fast.scaled_dot_product_attention`` on MLX's default device (the GPU on a
    Mac), forward, and backward through ``mlx.core.vjp`` (MLX has no fused backward on Metal:
    it differentiates the unfused composition); ``mlx.core.eval`` ends each timed call, since
    MLX computes lazily. No sliding window.
numpy
    naive attention that materializes the N x N scores, in float32, up to ``--naive-max-seq``.

A peer that raises (a GPU out of memory, say) is reported with its error and the run goes on;
an error of mfa's stops the run.

Metrics, per configuration and pass ("fwd" = forward, "fwd+bwd" = forward then backward):

ms
    wall time of one call: each of ``--repeats`` trials makes ``--dispatches`` calls in a row
    and takes their mean; the median over the trials is reported. One untimed call first warms
    up (first-touch page faults, pipeline compilation, lazy setup).
GPU ms
    metal only: the GPU's own time for one call, from ``Context.last_gpu_time()`` (the command
    buffer's GPU end minus start time: no planning, staging or waiting; forward + backward adds
    the forward's and the backward's). This follows the method of Metal FlashAttention's
    (MFA's) own benchmark: several dispatches per trial, several trials, and the best trial
    kept (MFA keeps the largest GINSTRS). MFA encodes its dispatches into one command buffer;
    mfa's C API is synchronous, so here each dispatch is a call with its own command buffer,
    and the gaps between them count in "ms" but not in "GPU ms".
GFLOP/s (TFLOPS on metal)
    4 * B * H * pairs * D per forward, 2.5 times that more for the backward, where pairs is
    the exact number of visible (query, key) pairs: N^2 without a mask, about N^2 / 2 causal.
GINSTRS
    MFA's measure (one FMA = one instruction), in billions per second, summed over the B * H
    heads: per head (2D + 5) * pairs for the forward; the backward adds (3D + 5) * pairs for dQ
    and (4D + 5) * pairs for dK and dV, so (9D + 15) * pairs forward + backward. It counts
    the work of MFA's 7-product backward, which mfa's kernels also do; a peer doing less work
    looks slower by this measure at equal time, so compare times.
    Where GPU time is recorded the table computes both rates from it (headers "GPU TFLOPS",
    "GPU GINSTRS"), as MFA does; the JSON has the rates from wall and from GPU time.
x peer
    the peer's wall time divided by mfa's (above 1: mfa is faster). A "!" after a peer's time
    marks a result that differs from mfa's by more than the dtype's tolerance (a sanity check
    of the run, not a test: the tests compare against float64); "err" marks a peer that
    raised, "n/a" one that does not run the configuration.
% GEMM
    mfa's GFLOP/s as a fraction of this machine's float32 GEMM ceiling, measured in the same
    run as the best of three numpy float32 matmuls of 4096 x 4096 x 4096.
peak extra MiB
    how far the process's resident set rose during one untimed run beyond the memory of the
    results that run returned (Linux only: the kernel's VmHWM, reset before the run). glibc's
    adaptive mmap threshold is pinned first so that freed blocks leave the resident set.

``--memory-check`` (on by default for cpu) also runs mfa alone at the issue's memory targets:
float32, B=1, H=8, N=16384, D=64, forward (< 64 MB extra) and forward + backward (< 128 MB).

Results go to a table on stdout, to JSON with ``--json`` and to a PNG of speed (from wall
time) against N with ``--plot`` when matplotlib is installed. Timing numbers on shared
machines are noisy: compare peers within one run.
"""

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

import mfa_native
from mfa_native._measure import pin_mmap_threshold, reset_resident_peak, resident_rise

__all__ = ["main"]

_MIB = 2**20
_DTYPES = ("f32", "bf16", "f16")
_PASSES = ("fwd", "fwd+bwd")
_PEERS = ("mfa", "torch", "mlx", "numpy")
# Relative error (to the largest magnitude of the peer's result) beyond which a row is flagged:
# the float32 bound leaves room for float32 reductions over N, bf16 / f16 for one rounding of
# the output (2^-8, 2^-11) plus the inputs' own rounding seen through different accumulations.
_AGREEMENT = {"f32": 1e-4, "bf16": 3e-2, "f16": 5e-3}
# What each option left out defaults to, per backend (the table in the module docstring).
# metal-sim simulates every GPU thread on the CPU: small shapes, one repeat, and a window
# narrower than N so that its block skipping runs.
_DEFAULTS = {
    "cpu": dict(
        seq=[1024, 2048, 4096],
        head_dims=[64, 128],
        dtypes=["f32", "bf16"],
        window=[(256, 0)],
        repeats=5,
        dispatches=1,
        peers=["mfa", "torch", "numpy"],
        naive_max_seq=2048,
        gemm=True,
        memory_check=True,
    ),
    "metal": dict(
        seq=[1024, 2048, 4096, 8192, 16384],
        head_dims=[64, 128, 256],
        dtypes=["f16", "bf16"],
        window=[(256, 0)],
        repeats=5,
        dispatches=5,
        peers=["mfa", "mlx", "torch", "numpy"],
        naive_max_seq=1024,
        gemm=False,
        memory_check=False,
    ),
    "metal-sim": dict(
        seq=[64, 256],
        head_dims=[16, 64],
        dtypes=["f32"],
        window=[(32, 0)],
        repeats=1,
        dispatches=1,
        peers=["mfa", "numpy"],
        naive_max_seq=2048,
        gemm=False,
        memory_check=False,
    ),
}


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
        """MFA's instruction count: forward (2D+5), dQ (3D+5), dK and dV (4D+5) per pair."""
        d = self.dim
        per_pair = 2 * d + 5 if which == "fwd" else (2 * d + 5) + (3 * d + 5) + (4 * d + 5)
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


def _page_aligned(array):
    aligned = mfa_native.empty(array.shape, array.dtype)
    aligned[...] = array
    return aligned


# ---- Peers ----------------------------------------------------------------------------------


class Peer:
    """One implementation the benchmark times.

    ``prepare(config, q, k, v, dout)`` returns ``{"fwd": f, "fwd+bwd": g}``: calls without
    arguments that return only once their results are complete (a GPU peer waits for its
    device inside them), ``f`` returning the output and ``g`` the gradients dq, dk, dv.
    """

    name = None

    @property
    def label(self):
        """The peer, its version and its device, for the report's header."""
        return self.name

    def skip_reason(self, config):
        """Why the peer does not run config, or None when it does."""
        return None

    def gpu_seconds(self):
        """GPU seconds the peer's calls have taken so far, or None where none are recorded."""
        return None

    def as_float32(self, result):
        """The arrays of a result (one array, or dq, dk, dv) as a list of float32 numpy arrays:
        every dtype benchmarked converts to float32 exactly, and float32 arrays are not copied,
        which matters at N = 16384."""
        arrays = result if isinstance(result, (tuple, list)) else [result]
        return [self._float32(array) for array in arrays]

    def _float32(self, array):
        return np.asarray(array, np.float32)


class MfaPeer(Peer):
    name = "mfa"

    def __init__(self, backend, threads):
        self.context = mfa_native.Context(backend, num_threads=threads)
        self.backend = self.context.backend
        # The GPU time of every call so far, on the backend that records it.
        self._gpu_total = 0.0 if self.backend == "metal" else None

    @property
    def label(self):
        return f"mfa {mfa_native.__version__} ({self.backend})"

    def gpu_seconds(self):
        return self._gpu_total

    def _add_gpu_time(self):
        if self._gpu_total is not None:
            self._gpu_total += self.context.last_gpu_time()

    def prepare(self, config, q, k, v, dout):
        # In mfa_native.empty's page-aligned memory, which the metal backend always wraps
        # without a copy (its documented zero-copy path), as a Mac user would pass them.
        q, k, v, dout = (_page_aligned(array) for array in (q, k, v, dout))
        options = dict(
            causal=config.causal,
            causal_alignment="top_left",
            window=config.window,
            backend=self.context,
        )

        def forward():
            out = mfa_native.attention(q, k, v, **options)
            self._add_gpu_time()
            return out

        def forward_backward():
            out, lse = mfa_native.attention(q, k, v, return_lse=True, **options)
            self._add_gpu_time()
            gradients = mfa_native.attention_backward(dout, q, k, v, out, lse, **options)
            self._add_gpu_time()
            return gradients

        return {"fwd": forward, "fwd+bwd": forward_backward}


class TorchPeer(Peer):
    """``torch.nn.functional.scaled_dot_product_attention`` on device "cpu" or "mps"."""

    name = "torch"

    def __init__(self, torch, device, threads):
        self.torch = torch
        self.device = device
        torch.set_num_threads(threads)
        # torch.cpu.synchronize is a no-op that exists for device-agnostic code like this.
        self.synchronize = getattr(torch, device).synchronize

    @property
    def label(self):
        return f"torch {self.torch.__version__} ({self.device})"

    def skip_reason(self, config):
        if config.window is not None:
            return "no sliding window"
        # MPS materializes float32 scores and aborts the process (no exception to catch) on an
        # NDArray of 2^32 bytes or more (pytorch issue 149261).
        if self.device == "mps" and config.batch * config.heads * config.seq**2 * 4 >= 2**32:
            return "MPS: N x N scores of 4 GiB or more"
        return None

    def _tensor(self, array):
        if array.dtype == np.float32 or array.dtype == np.float16:
            tensor = self.torch.from_numpy(array)
        else:
            tensor = self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return tensor.to(self.device)

    def _float32(self, tensor):
        return tensor.detach().cpu().float().numpy()

    def prepare(self, config, q, k, v, dout):
        tq, tk, tv, tdout = (self._tensor(a) for a in (q, k, v, dout))
        attend = self.torch.nn.functional.scaled_dot_product_attention
        torch = self.torch

        def forward():
            with torch.no_grad():
                out = attend(tq, tk, tv, is_causal=config.causal)
            self.synchronize()
            return out

        leaves = [t.detach().clone().requires_grad_(True) for t in (tq, tk, tv)]

        def forward_backward():
            for leaf in leaves:
                leaf.grad = None
            attend(*leaves, is_causal=config.causal).backward(tdout)
            self.synchronize()
            return tuple(leaf.grad for leaf in leaves)

        self.synchronize()  # the copies to the device are not part of any timed call
        return {"fwd": forward, "fwd+bwd": forward_backward}


class MlxPeer(Peer):
    """``mlx.core.fast.scaled_dot_product_attention`` on MLX's default device."""

    name = "mlx"

    def __init__(self, mx):
        self.mx = mx
        self.dtypes = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}

    @property
    def label(self):
        return f"mlx {self.mx.__version__} ({self.mx.default_device()})"

    def skip_reason(self, config):
        if config.window is not None:
            return "no sliding window"
        return None

    def _float32(self, array):
        return np.asarray(array.astype(self.mx.float32))

    def prepare(self, config, q, k, v, dout):
        mx = self.mx
        # Through float32, which holds every bf16 and f16 value exactly: mx.array takes no
        # ml_dtypes arrays.
        q, k, v, dout = (
            mx.array(a.astype(np.float32)).astype(self.dtypes[config.dtype])
            for a in (q, k, v, dout)
        )
        mx.eval(q, k, v, dout)  # MLX is lazy: the conversions must not land in a timed call
        # MLX's "causal" aligns the last query with the last key; for N x N it is top-left too.
        options = dict(scale=1 / math.sqrt(config.dim), mask="causal" if config.causal else None)

        def attend(q, k, v):
            return mx.fast.scaled_dot_product_attention(q, k, v, **options)

        def forward():
            out = attend(q, k, v)
            mx.eval(out)
            return out

        def forward_backward():
            _, gradients = mx.vjp(attend, [q, k, v], [dout])
            mx.eval(gradients)
            return gradients

        return {"fwd": forward, "fwd+bwd": forward_backward}


class NumpyPeer(Peer):
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


def _optional_module(name):
    """The module, or None (said on stderr) when it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        print(f"bench: {name} is not available ({error}); running without it", file=sys.stderr)
        return None


def _other_peers(names, backend, threads, naive_max_seq):
    """The peers named besides mfa, set up to run beside mfa on backend: torch on the GPU
    ("mps") beside metal, on the CPU otherwise. Those not installed are left out."""
    peers = []
    for name in names:
        if name == "torch":
            torch = _optional_module("torch")
            if torch is None:
                continue
            device = "mps" if backend == "metal" else "cpu"
            if device == "mps" and not torch.backends.mps.is_available():
                print(
                    "bench: this torch cannot use the GPU (mps); running without it",
                    file=sys.stderr,
                )
                continue
            peers.append(TorchPeer(torch, device, threads or _cpu_count()))
        elif name == "mlx":
            mx = _optional_module("mlx.core")
            if mx is not None:
                peers.append(MlxPeer(mx))
        elif name == "numpy":
            peers.append(NumpyPeer(naive_max_seq))
    return peers


# ---- Measurement ----------------------------------------------------------------------------


def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _timed_trials(peer, function, repeats, dispatches):
    """Seconds per call: (median over the trials of the wall time, best trial of the peer's GPU
    time or None), each trial being dispatches calls in a row. The caller has warmed up."""
    walls, gpus = [], []
    for _ in range(repeats):
        gpu_start = peer.gpu_seconds()
        start = time.perf_counter()
        for _ in range(dispatches):
            function()
        walls.append((time.perf_counter() - start) / dispatches)
        if gpu_start is not None:
            gpus.append((peer.gpu_seconds() - gpu_start) / dispatches)
    return float(np.median(walls)), (min(gpus) if gpus else None)


def _measure(peer, function, config, which, arguments):
    """(the output of the warm-up call, the result entry) of one peer on one pass."""
    output = function()
    wall, gpu = _timed_trials(peer, function, arguments.repeats, arguments.dispatches)
    result = {"ms": wall * 1e3, "gpu_ms": None if gpu is None else gpu * 1e3}
    for prefix, seconds in (("", wall), ("gpu_", gpu)):
        result[prefix + "gflops"] = None if seconds is None else config.flops(which) / seconds / 1e9
        result[prefix + "ginstrs"] = (
            None if seconds is None else config.instructions(which) / seconds / 1e9
        )
    result["peak_extra_bytes"] = _peak_extra_bytes(function) if arguments.memory else None
    return output, result


def _result_bytes(result):
    if isinstance(result, (tuple, list)):
        return sum(_result_bytes(item) for item in result)
    nbytes = getattr(result, "nbytes", None)
    if nbytes is None and hasattr(result, "element_size"):  # torch tensor
        nbytes = result.element_size() * result.nelement()
    return int(nbytes or 0)


def _peak_extra_bytes(function):
    """Resident-set rise during one call of function, minus what its results occupy; None, with
    no call, where the high-water mark cannot be reset."""
    baseline = reset_resident_peak()
    if baseline is None:
        return None
    result = function()
    return max(resident_rise(baseline) - _result_bytes(result), 0)


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
    """max |got - expected| / max |expected| over lists of float32 arrays (the difference of
    two float32 values is within one rounding of exact: ample for tolerances of 1e-4 and up)."""
    return max(
        float(np.max(np.abs(g - e))) / (float(np.max(np.abs(e))) or 1.0)
        for g, e in zip(got, expected)
    )


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
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{elapsed:6.1f}s  {label}"
        )
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


def _number(value, missing="-"):
    """Three significant digits below 100, no decimals above: ms and rates span 1e-3 to 1e5."""
    if value is None:
        return missing
    return format(value, ".0f" if abs(value) >= 100 else ".3g")


def _table(rows, peers, ceiling, tera):
    """The report as aligned text; mfa's rates in TFLOPS when tera, else GFLOP/s. Columns that
    no row fills (GPU time, memory) are left out."""
    others = [peer for peer in peers if peer != "mfa"]
    results = [result for row in rows for result in row["results"].values()]
    gpu = any(row["results"].get("mfa", {}).get("gpu_ms") is not None for row in rows)
    memory = any(result.get("peak_extra_bytes") is not None for result in results)
    clock = "gpu_" if gpu else ""
    prefix = "GPU " if gpu else ""
    header = ["config", "pass", "mfa ms"] + (["GPU ms"] if gpu else [])
    header += [prefix + ("TFLOPS" if tera else "GFLOP/s"), prefix + "GINSTRS"]
    header += (["% GEMM"] if ceiling else []) + (["MiB extra"] if memory else [])
    for peer in others:
        header += [f"{peer} ms", f"x {peer}"] + ([f"{peer} MiB"] if memory else [])
    lines = [header]
    for row in rows:
        mfa = row["results"].get("mfa", {})
        gflops = mfa.get(clock + "gflops")
        line = [row["config_label"], row["pass"], _number(mfa.get("ms"))]
        if gpu:
            line.append(_number(mfa.get("gpu_ms")))
        line += [
            _number(None if gflops is None else gflops / 1e3 if tera else gflops),
            _number(mfa.get(clock + "ginstrs")),
        ]
        if ceiling:
            line.append(_format(None if gflops is None else 100 * gflops / ceiling, ".0f"))
        if memory:
            line.append(_format(_mib(mfa.get("peak_extra_bytes")), ".1f"))
        for peer in others:
            result = row["results"].get(peer, {})
            missing = "n/a" if "skipped" in result else "err" if "error" in result else "-"
            time_cell = _number(result.get("ms"), missing)
            if result.get("disagrees"):
                time_cell += " !"
            line += [time_cell, _format(result.get("speedup_of_mfa"), ".2f")]
            if memory:
                line.append(_format(_mib(result.get("peak_extra_bytes")), ".1f"))
        lines.append(line)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            str(cell).rjust(width) if i else str(cell).ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths))
        )
        for line in lines
    )


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
                (config["seq"], result["gflops"])
            )
    if not series:
        return False
    # Colour says which peer, line style which head dimension, marker whether causal.
    colours = {"mfa": "tab:blue", "torch": "tab:orange", "mlx": "tab:red", "numpy": "tab:green"}
    dims = sorted({key[1] for lines in series.values() for key in lines})
    styles = ["-", "--", ":", "-."]
    panels = sorted(series)
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        for (peer, dim, causal), points in sorted(series[panel].items()):
            points.sort()
            axis.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                color=colours.get(peer),
                marker="x" if causal else "o",
                linestyle=styles[dims.index(dim) % len(styles)],
                label=f"{peer} D={dim}{' causal' if causal else ''}",
            )
        axis.set_xscale("log", base=2)
        axis.set_xlabel("N")
        axis.set_ylabel("GFLOP/s (wall time)")
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
                    configs.append(
                        Config(arguments.batch, arguments.heads, seq, dim, dtype, causal)
                    )
                for window in arguments.window:
                    configs.append(
                        Config(arguments.batch, arguments.heads, seq, dim, dtype, False, window)
                    )
    return configs


def _failure(peer, error):
    """The result entry of a peer that raised: a peer's failure (a GPU out of memory, say) is
    one of the results, while mfa's own is re-raised to stop the run."""
    if isinstance(peer, MfaPeer):
        raise error
    return {"error": f"{type(error).__name__}: {error}"}


def _benchmark(configs, peers, arguments, progress):
    """One row per configuration and pass. The first peer (mfa) is the reference: the others'
    results are compared with its results, and their times divided by its time."""
    rows = []
    for config in configs:
        inputs = _inputs(config)
        # Per peer: its functions, or the entry of a peer that skips or fails the config.
        prepared = {}
        for peer in peers:
            reason = peer.skip_reason(config)
            if reason:
                prepared[peer.name] = {"skipped": reason}
                continue
            try:
                prepared[peer.name] = peer.prepare(config, *inputs)
            except Exception as error:
                prepared[peer.name] = _failure(peer, error)
        for which in arguments.passes:
            results = {}
            reference = None
            for peer in peers:
                progress.step(f"{config.label()} {which} {peer.name}")
                runner = prepared[peer.name]
                if which not in runner:
                    results[peer.name] = dict(runner)
                    continue
                try:
                    output, result = _measure(peer, runner[which], config, which, arguments)
                except Exception as error:
                    results[peer.name] = _failure(peer, error)
                    continue
                if reference is None:
                    reference = peer.as_float32(output)
                else:
                    difference = _max_relative_difference(peer.as_float32(output), reference)
                    result["max_relative_difference_to_mfa"] = difference
                    result["disagrees"] = difference > _AGREEMENT[config.dtype]
                del output
                results[peer.name] = result
            mfa = results.get("mfa", {})
            for name, result in results.items():
                if name != "mfa" and "ms" in result and "ms" in mfa:
                    result["speedup_of_mfa"] = result["ms"] / mfa["ms"]
            rows.append(
                {
                    "config": asdict(config),
                    "config_label": config.label(),
                    "pass": which,
                    "results": results,
                }
            )
    return rows


def _memory_targets(mfa):
    """mfa alone at the issue's memory targets (float32, B=1, H=8, N=16384, D=64)."""
    config = Config(1, 8, 16384, 64, "f32", False)
    functions = mfa.prepare(config, *_inputs(config))
    limits = {"fwd": 64e6, "fwd+bwd": 128e6}
    report = []
    for which in _PASSES:
        extra = _peak_extra_bytes(functions[which])
        report.append(
            {
                "config_label": config.label(),
                "pass": which,
                "peak_extra_bytes": extra,
                "limit_bytes": limits[which],
                "met": None if extra is None else extra < limits[which],
            }
        )
    return report


def _parse_window(text):
    try:
        left, right = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LEFT,RIGHT (e.g. 256,0), got {text!r}"
        ) from None
    return (left, right)


def _show(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return " ".join(_show(item) for item in value) or "none"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _by_backend(name, text=""):
    """Help text ending with the per-backend defaults of an option, read from _DEFAULTS."""
    defaults = "; ".join(
        f"{backend}: {_show(values[name])}" for backend, values in _DEFAULTS.items()
    )
    return f"{text} (default {defaults})" if text else f"default {defaults}"


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m mfa_native bench",
        description="Time mfa against PyTorch SDPA, MLX SDPA and naive numpy attention. "
        "Several defaults depend on the backend (auto: the one it resolves to).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the backend's first two N, first D, at most 3 repeats, no memory check",
    )
    parser.add_argument("--backend", default="cpu", choices=["cpu", "auto", "metal", "metal-sim"])
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for mfa and torch (default: every usable core)",
    )
    parser.add_argument("--peers", nargs="+", choices=_PEERS, help=_by_backend("peers"))
    parser.add_argument("--dtypes", nargs="+", choices=_DTYPES, help=_by_backend("dtypes"))
    parser.add_argument("--seq", nargs="+", type=int, help=_by_backend("seq"))
    parser.add_argument("--head-dims", nargs="+", type=int, help=_by_backend("head_dims"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    parser.add_argument(
        "--window",
        nargs="*",
        type=_parse_window,
        help=_by_backend(
            "window", "sliding windows LEFT,RIGHT to add per shape; --window alone adds none"
        ),
    )
    parser.add_argument("--passes", nargs="+", default=list(_PASSES), choices=_PASSES)
    parser.add_argument("--repeats", type=int, help=_by_backend("repeats", "timed trials"))
    parser.add_argument(
        "--dispatches", type=int, help=_by_backend("dispatches", "calls in a row per trial")
    )
    parser.add_argument(
        "--naive-max-seq",
        type=int,
        help=_by_backend(
            "naive_max_seq", "largest N the naive numpy peer runs (it stores N x N scores)"
        ),
    )
    parser.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="skip the peak-extra-memory measurement of every row",
    )
    parser.add_argument(
        "--memory-check",
        action=argparse.BooleanOptionalAction,
        help=_by_backend("memory_check", "run mfa alone at the memory targets, N=16384"),
    )
    parser.add_argument(
        "--gemm",
        action=argparse.BooleanOptionalAction,
        help=_by_backend("gemm", "measure the float32 GEMM ceiling"),
    )
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of GFLOP/s against N")
    return parser


def _apply_defaults(arguments, backend):
    """Fill every option left out (None) with the backend's default, trimmed by --quick."""
    defaults = dict(_DEFAULTS[backend])
    if arguments.quick:
        defaults.update(
            seq=defaults["seq"][:2],
            head_dims=defaults["head_dims"][:1],
            repeats=min(defaults["repeats"], 3),
            memory_check=False,
        )
    for name, value in defaults.items():
        if getattr(arguments, name) is None:
            setattr(arguments, name, value)


def main(argv=None):
    """Run the benchmark; returns the process exit status (0, or 2 for bad arguments or a
    backend that cannot run here)."""
    arguments = _parser().parse_args(argv)
    if arguments.threads < 0:
        print("bench: --threads must be >= 0", file=sys.stderr)
        return 2
    try:
        mfa = MfaPeer(arguments.backend, arguments.threads)
    except mfa_native.MFAError as error:
        print(
            f"bench: backend {arguments.backend} cannot run here: {error.message} (available: "
            f"{', '.join(mfa_native.available_backends())})",
            file=sys.stderr,
        )
        return 2
    _apply_defaults(arguments, mfa.backend)
    if min(arguments.repeats, arguments.dispatches, *arguments.seq) < 1:
        print("bench: --repeats, --dispatches and --seq must be >= 1", file=sys.stderr)
        return 2
    if "mfa" not in arguments.peers:
        print("bench: mfa must be among --peers", file=sys.stderr)
        return 2
    pin_mmap_threshold()
    others = [name for name in dict.fromkeys(arguments.peers) if name != "mfa"]
    peers = [mfa] + _other_peers(others, mfa.backend, arguments.threads, arguments.naive_max_seq)
    configs = _grid(arguments)
    print(
        f"{mfa.label} on {mfa.context.device_name}; {platform.machine()}, {_cpu_count()} "
        f"usable cores; peers: {', '.join(peer.label for peer in peers[1:]) or 'none'}; "
        f"{arguments.repeats} trials of {arguments.dispatches} calls"
    )

    ceiling = _gemm_ceiling() if arguments.gemm else None
    if ceiling:
        print(f"float32 GEMM ceiling (numpy matmul 4096^3): {ceiling:.0f} GFLOP/s")
    progress = _Progress(len(configs) * len(arguments.passes) * len(peers))
    rows = _benchmark(configs, peers, arguments, progress)
    progress.close()
    print(_table(rows, [peer.name for peer in peers], ceiling, tera=mfa.backend == "metal"))
    for row in rows:
        for name, result in row["results"].items():
            if "error" in result:
                print(f"{name} failed on {row['config_label']} {row['pass']}: {result['error']}")

    memory = _memory_targets(mfa) if arguments.memory_check else []
    for check in memory:
        extra = check["peak_extra_bytes"]
        verdict = "n/a" if extra is None else ("met" if check["met"] else "NOT met")
        print(
            f"memory target, {check['config_label']} {check['pass']}: "
            f"{_format(_mib(extra), '.1f', 'n/a')} MiB extra "
            f"(limit {check['limit_bytes'] / 1e6:.0f} MB): {verdict}"
        )

    if arguments.json:
        document = {
            "mfa_version": mfa_native.__version__,
            "backend": mfa.backend,
            "device": mfa.context.device_name,
            "machine": platform.machine(),
            "usable_cores": _cpu_count(),
            "threads": arguments.threads or _cpu_count(),
            "peers": {peer.name: peer.label for peer in peers},
            "repeats": arguments.repeats,
            "dispatches": arguments.dispatches,
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
