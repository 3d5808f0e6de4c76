"""Benchmark mfa's attention against its peers, side by side in one process, beside the roofs
of the machine measured in the same run.

    python -m mfa_native bench                      # cpu: the readme grid (minutes on 2 cores)
    python -m mfa_native bench --quick              # each grid's first shapes: under a minute
    python -m mfa_native bench --grid decode shapes # other named grids (--help lists them)
    python -m mfa_native bench --backend metal      # on a Mac: N up to 16384, D up to 256
    python -m mfa_native bench --backend metal-sim  # anywhere: a smoke test at small sizes
    python -m mfa_native bench --json out.json --plot speed.png

The package: ``cases`` (a problem and the named grids), ``peers`` (mfa and what it is compared
with), ``timing`` (interleaved rounds, agreement, memory), ``roof`` (the native probes),
``report`` (progress line, table, plot), ``features`` (the studies below; ``adapters``, the
front ends' overhead), ``naive`` (the naive
numpy attention, shared with ``python -m mfa_native demo``) and ``cli``.

Grids (``--grid``, several allowed; ``cases.GRIDS``):

readme
    the README's table: B = 1, H = 8, each N x D of the backend (below), without a mask,
    causal, and with each sliding window.
decode
    decoding: Nq 1 and 4 against Nk 4096 and 32768, Hq 32 with Hkv 8 and 32, D 128, B 1
    and 8, forward only. Its largest cache (B 8, Hkv 32, Nk 32k) is 8 GiB of k and v in f32,
    4 GiB in bf16, which every peer reads in place; ``--batch 1`` keeps it within 1 GiB.
shapes
    D 80, 96 and 256 at N 1024 and 2048; GQA prefill (Hq 32, Hkv 8, N 2048, D 128); small N
    with a large batch (B 8, N 128 and 256, D 64 and 128); B 4 at N 2048, D 64.

Studies (also ``--grid``; ``features.STUDIES``, whose docstring says each one's shapes and
targets): each times a few calls that answer one question against each other, interleaved, and
prints their paired ratios beside the target, with torch's alternative where it has one
(``--flex`` adds a compiled FlexAttention):

modifiers
    softcap, ALiBi and sinks against the same call without them (target: at most 15 % more).
block-mask
    8 documents' block-diagonal boolean mask, with and without its ``mask_summary``, against
    an all-true mask at N 4096 (target: 4x faster).
decode-roof
    decode Hq 32 / Hkv 8 against torch SDPA (2x) and the read roof (60 %), 1 thread against 2.
varlen
    8 packed sequences (8k tokens) against the 8 dense calls (within 10 %) and padding.
paged
    paged decoding against the dense decode at the same lengths (within 15 %).
adapters
    what the front ends for torch (the operator, with and without autograd, its SDPA,
    flash_attn_func) and MLX (arrays, its SDPA) add to a call over the raw numpy call at
    N 128 and decoding (under 20 us), in CPU time with the kernel skipped (``adapters``).

``--dtypes``, ``--seq`` (key rows, and query rows), ``--seq-q``, ``--head-dims``, ``--batch``,
``--heads``, ``--kv-heads``, ``--causal`` and ``--window`` replace the grids' own values. These
options default per backend (``--help`` lists them too; N, D and the windows are the readme
grid's):

========= ========================== ========== ============== ======= ========== ==============
backend   N                          D          dtypes         repeats dispatches peers
========= ========================== ========== ============== ======= ========== ==============
cpu       1024 2048 4096             64 128     f32 bf16       5       1          torch numpy
metal     1024 2048 4096 8192 16384  64 128 256 f16 bf16       5       5          mlx torch numpy
metal-sim 64 256                     16 64      f32            1       1          numpy
========= ========================== ========== ============== ======= ========== ==============

The readme grid's windows: 256,0 (32,0 on metal-sim). ``auto`` takes the defaults of the backend
it resolves to. ``--quick`` keeps each grid's first shapes (readme: the first N and D), runs
the naive numpy peer (the slowest by far) only up to N = 512 and measures no memory; it keeps
the repeats, so its medians are of as many rounds as the full run's. The roofs are the CPU's,
measured for the cpu backend only; the memory targets are measured on cpu unless asked for.
The metal-sim backend simulates every GPU thread on the CPU, so its times say nothing about a
GPU: it runs to check that the metal kernels' results agree with the other peers.

Peers, each run on the same inputs in the same process; every peer but mfa is optional and
imported only when asked for:

mfa
    this package, on the backend chosen with ``--backend``. On metal its inputs are copied
    once into page-aligned memory (``mfa_native.empty``) so that the backend wraps them
    without a copy; elsewhere it reads the arrays every peer reads.
torch
    PyTorch's ``scaled_dot_product_attention`` (``enable_gqa`` where Hkv < Hq): on the CPU for
    cpu and metal-sim, on the GPU ("mps") for metal, with ``torch.mps.synchronize()`` ending
    each timed call. The backward is autograd. The SDPA backend that ran (flash, math, ...) is
    read from the aten operators of the first warm-up call of each case and pass (watched by a
    ``TorchDispatchMode``) and reported ("torch kernel"). On "mps", configurations whose
    float32 scores (B * H * Nq * Nk * 4 bytes) reach 4 GiB are skipped: MPS aborts the process
    on NDArrays of 2^32 bytes or more.
    Sliding windows have no torch equivalent short of an N x N mask, so those rows show none.
mlx
    MLX's ``mlx.core.fast.scaled_dot_product_attention`` on MLX's default device (the GPU on a
    Mac), forward, and backward through ``mlx.core.vjp`` (MLX has no fused backward on Metal:
    it differentiates the unfused composition); ``mlx.core.eval`` ends each timed call, since
    MLX computes lazily. No sliding window; no causal mask where Nq != Nk (MLX aligns it
    bottom-right, the benchmark top-left).
numpy
    naive attention that materializes the Nq x Nk scores (``naive``), in float32, up to
    ``--naive-max-seq`` squared scores per head, and for bf16 and f16 inputs up to 2 GiB of
    float32 copies of k and v.

A peer that raises (a GPU out of memory, say) is reported with its error and the run goes on;
an error of mfa's stops the run.

Timing (``timing``): per case and pass, ``--warmups`` untimed calls of every peer, then
``--repeats`` rounds that time every peer once each, interleaved (A B C, B C A, C A B, ...), so
that load from elsewhere lands on every peer alike. The benchmark sets no process-wide option
that changes a peer's speed besides torch's thread count, equal to mfa's (the header says so);
the roof probes pin no thread and change nothing.

Metrics, per configuration and pass ("fwd" = forward, "fwd+bwd" = forward then backward):

ms
    wall time of one call: each trial makes ``--dispatches`` calls in a row and takes their
    mean; the median over the rounds is reported.
GPU ms
    metal only: the GPU's own time for one call, from ``Context.last_gpu_time()`` (the command
    buffer's GPU end minus start time: no planning, staging or waiting; forward + backward adds
    the forward's and the backward's). This follows the method of Metal FlashAttention's
    (MFA's) own benchmark: several dispatches per trial, several trials, and the best trial
    kept (MFA keeps the largest GINSTRS). MFA encodes its dispatches into one command buffer;
    mfa's C API is synchronous, so here each dispatch is a call with its own command buffer,
    and the gaps between them count in "ms" but not in "GPU ms".
GFLOP/s (TFLOPS on metal)
    4 * B * Hq * pairs * D per forward, 2.5 times that more for the backward, where pairs is
    the exact number of visible (query, key) pairs: Nq * Nk without a mask, about N^2 / 2
    causal.
GINSTRS
    MFA's measure (one FMA = one instruction), in billions per second, summed over the B * H
    heads: per head (2D + 5) * pairs for the forward; the backward adds (3D + 5) * pairs for dQ
    and (4D + 5) * pairs for dK and dV, so (9D + 15) * pairs forward + backward. It counts
    the work of MFA's 7-product backward; a peer doing less work looks slower by this measure
    at equal time, so compare times.
    Where GPU time is recorded the table computes both rates from it (headers "GPU TFLOPS",
    "GPU GINSTRS"), as MFA does; the JSON has the rates from wall and from GPU time.
roof, % roof
    which roof bounds the result and how much of it mfa reached (``roof``): "fma" (the fp32
    FMA roof: f32 and f16), "bf16" (the bf16 dot-product roof, where the CPU has one) or "bw"
    (the streaming read bandwidth times the case's FLOPs per byte of compulsory traffic, where
    that is lower: decoding). The three roofs are measured at the start of the run and printed
    in the header. The JSON has every peer's fraction.
x peer
    the median over the rounds of the peer's wall time divided by mfa's in the same round
    (above 1: mfa is faster). A "!" after a peer's time marks a result that differs from mfa's
    by more than the dtype's tolerance (a sanity check of the run, not a test: the tests compare
    against float64); "err" marks a peer that raised, "n/a" one that does not run the
    configuration.
peer kernel
    the backend the peer chose for the call, where it has several (torch: "flash", "math").
peak extra MiB
    how far the process's resident set rose during one untimed call beyond the memory of the
    results that call returned (Linux only: the kernel's VmHWM, reset before the call, after
    freed heap memory is returned to the OS so that it cannot hide the call's peak).

``--memory-check`` (on by default for cpu) also runs mfa alone at the project's memory targets:
float32, B=1, H=8, N=16384, D=64, forward (< 16 MiB extra) and forward + backward (< 128 MiB).

``--build LIBRARY`` adds the peer "build": another libmfa (a baseline build's shared library)
loaded beside mfa_native's and called through the C ABI on the same arrays, so that a change
is measured against its baseline in one run, interleaved call by call; the grids' cases only.
Its calls skip mfa_native's Python layer (some 30-50 us each): on calls of a few milliseconds
that favours the build by a few percent, which a run against a copy of the same library shows.

Results go to a table on stdout, to JSON with ``--json`` and to a PNG of speed (from wall
time) against N with ``--plot`` when matplotlib is installed. Timing numbers on shared
machines are noisy: compare peers within one run.
"""

from mfa_native.bench.cli import main

__all__ = ["main"]
