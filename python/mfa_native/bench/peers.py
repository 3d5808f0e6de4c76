"""The implementations the benchmark times beside mfa, each on the same inputs in one process.

A peer is a class with a ``name`` and a ``prepare(case, q, k, v, dout)`` that returns the calls
it times; every peer but mfa is optional and imported only when asked for. Adding a peer is a
subclass of Peer and one entry of ``FACTORIES`` (a function of the run's backend, threads and
options that returns the peer, or None with the reason on stderr when it cannot run here).
"""

import importlib
import math
import os
import sys

import numpy as np

import mfa_native
from mfa_native.bench import naive

__all__ = [
    "Peer",
    "MfaPeer",
    "BuildPeer",
    "TorchPeer",
    "MlxPeer",
    "NumpyPeer",
    "FACTORIES",
    "make_peers",
]


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def numpy_dtype(name):
    if name == "f32":
        return np.dtype(np.float32)
    if name == "f16":
        return np.dtype(np.float16)
    from mfa_native._context import bfloat16

    return bfloat16()


# Values generated at a time for bf16 and f16 inputs: 64 MiB of float32.
_PIECE = 2**24


def inputs(case, backward=True, seed=0):
    """q, k, v and dout (None without backward) as standard-normal arrays of the case's dtype,
    shared by every peer (none of them writes its inputs)."""
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(case.dtype)
    q_shape = (case.batch, case.heads, case.seq, case.dim)
    kv_shape = (case.batch, case.kv_heads, case.seq_k, case.dim)

    def normal(shape):
        if dtype == np.float32:
            return rng.standard_normal(shape, dtype=np.float32)
        # In pieces, so that a large bf16 cache never has a float32 twin in memory.
        array = np.empty(shape, dtype)
        flat = array.reshape(-1)
        for start in range(0, flat.size, _PIECE):
            flat[start : start + _PIECE] = rng.standard_normal(
                min(_PIECE, flat.size - start), dtype=np.float32
            )
        return array

    return (
        normal(q_shape),
        normal(kv_shape),
        normal(kv_shape),
        normal(q_shape) if backward else None,
    )


class Peer:
    """One implementation the benchmark times.

    ``prepare(case, q, k, v, dout)`` returns ``{"fwd": f, "fwd+bwd": g}``: calls without
    arguments that return only once their results are complete (a GPU peer waits for its
    device inside them), ``f`` returning the output and ``g`` the gradients dq, dk, dv.
    """

    name = None
    # Seconds the peer's runtime keeps CPU threads busy after a call returns; the benchmark
    # pauses the longest of its peers' after every call (bench.timing says why).
    settle_seconds = 0.0

    @property
    def label(self):
        """The peer, its version and its device, for the report's header."""
        return self.name

    # False for a peer without sliding windows (every windowed case is skipped).
    windows = True

    def skip_reason(self, case):
        """Why the peer does not run case, or None when it does."""
        if case.window is not None and not self.windows:
            return "no sliding window"
        return self.unsupported(case)

    def unsupported(self, case):
        """What else of case the peer cannot run, or None (beyond windows)."""
        return None

    def gpu_seconds(self):
        """GPU seconds the peer's calls have taken so far, or None where none are recorded."""
        return None

    def observe(self, function):
        """(result, the kernel that ran) of one untimed call; the kernel is None for a peer
        that has one way to run."""
        return function(), None

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

    def prepare(self, case, q, k, v, dout):
        if self.backend == "metal":
            # In mfa_native.empty's page-aligned memory, which the metal backend wraps without
            # a copy (its documented zero-copy path), as a Mac user would pass them.
            q, k, v = (_page_aligned(array) for array in (q, k, v))
            dout = None if dout is None else _page_aligned(dout)
        options = dict(
            causal=case.causal,
            causal_alignment="top_left",
            window=case.window,
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


class BuildPeer(Peer):
    """mfa as another libmfa build runs it: the library at ``path`` loaded beside mfa_native's
    own and called through its C ABI (mfa_attention_forward, mfa_attention_backward) on the
    same host arrays, so that a change is timed against its baseline build in one process,
    interleaved with it call by call (``--build``). Its calls skip mfa_native's Python layer
    (some 30-50 us a call), which reads as a few percent in the build's favour on calls of a
    few milliseconds: a run against a copy of the same library shows that offset."""

    name = "build"

    def __init__(self, path, backend, threads):
        from mfa_native._context import _BACKENDS, DTYPES
        from mfa_native._library import ffi

        self._ffi = ffi
        # The enums' values are the C ABI's, the same in every build.
        self._dtypes = DTYPES
        self.path = path
        # Local, as mfa_native loads its own: neither library's symbols can then stand in for
        # the other's in its calls between its own exported functions.
        try:
            self.lib = ffi.dlopen(path, ffi.RTLD_NOW | ffi.RTLD_LOCAL)
        except OSError as error:
            raise ValueError(f"--build {path}: {error}") from None
        options = ffi.new("mfa_context_options*")
        self.lib.mfa_context_options_init(options)
        options.num_threads = threads
        handle = ffi.new("mfa_context**")
        self._check(self.lib.mfa_context_create(_BACKENDS[backend], options, handle))
        self.context = ffi.gc(handle[0], self.lib.mfa_context_destroy)
        self.version = ffi.string(self.lib.mfa_version_string()).decode()

    @property
    def label(self):
        return f"build {self.path} (libmfa {self.version})"

    def _check(self, status):
        if status != self.lib.MFA_OK:
            ffi = self._ffi
            raise RuntimeError(
                f"{self.path}: {ffi.string(self.lib.mfa_status_string(status)).decode()}: "
                f"{ffi.string(self.lib.mfa_last_error()).decode()}"
            )

    def _tensor(self, array):
        """An mfa_tensor over a numpy array of rank 4 (elements, not bytes, for strides)."""
        tensor = self._ffi.new("mfa_tensor*")
        tensor.data = self._ffi.cast("void*", array.ctypes.data)
        tensor.dtype = self._dtypes[array.dtype]
        tensor.shape = list(array.shape)
        tensor.strides = [stride // array.itemsize for stride in array.strides]
        return tensor

    def prepare(self, case, q, k, v, dout):
        lib = self.lib
        params = self._ffi.new("mfa_attention_params*")
        lib.mfa_attention_params_init(params)
        params.causal = int(case.causal)
        params.alignment = lib.MFA_ALIGN_TOP_LEFT  # as MfaPeer calls mfa_native
        if case.window is not None:
            left, right = case.window
            params.window_left = -1 if left is None else left
            params.window_right = -1 if right is None else right
        tq, tk, tv = (self._tensor(array) for array in (q, k, v))

        # Each call allocates its outputs, as mfa_native's functions do for MfaPeer (fresh
        # pages cost a large output some 5 % of a short call): the builds then differ only by
        # mfa_native's Python layer, some 30 us a call. A default argument keeps the inputs
        # alive, whose addresses alone the tensors hold.
        def forward(inputs=(q, k, v, dout)):
            out = np.empty((*q.shape[:-1], v.shape[-1]), q.dtype)
            lse = np.empty((*q.shape[:-1], 1), np.float32)
            tout, tlse = self._tensor(out), self._tensor(lse)
            self._check(lib.mfa_attention_forward(self.context, params, tq, tk, tv, tout, tlse))
            return out, lse, tout, tlse

        if dout is None:
            return {"fwd": lambda: forward()[0]}
        tdout = self._tensor(dout)

        def forward_backward():
            out, lse, tout, tlse = forward()
            grads = [np.empty_like(array) for array in (q, k, v)]
            tdq, tdk, tdv = (self._tensor(array) for array in grads)
            self._check(
                lib.mfa_attention_backward(
                    self.context, params, tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv
                )
            )
            return grads

        return {"fwd": lambda: forward()[0], "fwd+bwd": forward_backward}


def _page_aligned(array):
    aligned = mfa_native.empty(array.shape, array.dtype)
    aligned[...] = array
    return aligned


# The fused SDPA operators torch dispatches to, and the backend each is. Its "math" backend is
# no operator of its own: it decomposes into two bmm (BLAS or oneDNN) around a softmax.
_TORCH_SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "_scaled_dot_product_attention_math_for_mps": "math-mps",
}


def torch_sdpa_kernel(operators):
    """The SDPA backend named by the aten operators one call ran ("aten::name.overload"):
    the fused kernels found, joined by "+" where forward and backward differ; "math" for
    torch's composite; "unknown" otherwise."""
    kernels = []
    for operator in operators:
        name = operator.removeprefix("aten::").split(".")[0].removesuffix("_backward")
        kernel = _TORCH_SDPA_KERNELS.get(name)
        if kernel is None and name.startswith("_scaled_dot_product"):
            kernel = name  # a fused kernel this table does not know yet: named as it is
        if kernel is not None and kernel not in kernels:
            kernels.append(kernel)
    if kernels:
        return "+".join(kernels)
    names = {operator.removeprefix("aten::").split(".")[0] for operator in operators}
    return "math" if "bmm" in names and names & {"_safe_softmax", "_softmax"} else "unknown"


class TorchPeer(Peer):
    """``torch.nn.functional.scaled_dot_product_attention`` on device "cpu" or "mps"."""

    name = "torch"
    windows = False
    # Its CPU ops run on GNU OpenMP, whose threads spin 300,000 times (OMP_WAIT_POLICY unset)
    # before they sleep: on Intel cores, where a pause lasts about 140 cycles, some 20 ms in which
    # they hold every core. Measured on a 16-core Xeon: mfa's call right after torch's took 1.7x
    # its time after its own.
    settle_seconds = 0.05

    def __init__(self, torch, device, threads):
        self.torch = torch
        self.device = device
        self.threads = threads
        # The one process-wide setting the benchmark makes: torch's intra-op threads equal to
        # mfa's (reported in the header and the JSON).
        torch.set_num_threads(threads)
        # torch.cpu.synchronize is a no-op that exists for device-agnostic code like this.
        self.synchronize = getattr(torch, device).synchronize

    @property
    def label(self):
        return f"torch {self.torch.__version__} ({self.device})"

    def unsupported(self, case):
        # MPS materializes float32 scores and aborts the process (no exception to catch) on an
        # NDArray of 2^32 bytes or more (pytorch issue 149261).
        scores = case.batch * case.heads * case.seq * case.seq_k * 4
        if self.device == "mps" and scores >= 2**32:
            return "MPS: N x N scores of 4 GiB or more"
        return None

    def observe(self, function):
        """One call under a TorchDispatchMode that records every aten operator it runs, so the
        SDPA backend reported is the one that ran, not one torch says it would choose (the
        mode only watches: the operators run as they would without it)."""
        from torch.utils._python_dispatch import TorchDispatchMode

        operators = []

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                operators.append(func.name())
                return func(*args, **(kwargs or {}))

        with Watch():
            result = function()
        return result, torch_sdpa_kernel(operators)

    def _tensor(self, array):
        if array.dtype == np.float32 or array.dtype == np.float16:
            tensor = self.torch.from_numpy(array)
        else:
            tensor = self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return tensor.to(self.device)

    def _float32(self, tensor):
        return tensor.detach().cpu().float().numpy()

    def prepare(self, case, q, k, v, dout):
        tq, tk, tv = (self._tensor(a) for a in (q, k, v))
        attend = self.torch.nn.functional.scaled_dot_product_attention
        torch = self.torch
        options = dict(is_causal=case.causal)
        if case.kv_heads != case.heads:
            options["enable_gqa"] = True

        def forward():
            with torch.no_grad():
                out = attend(tq, tk, tv, **options)
            self.synchronize()
            return out

        functions = {"fwd": forward}
        if dout is not None:
            tdout = self._tensor(dout)
            leaves = [t.detach().clone().requires_grad_(True) for t in (tq, tk, tv)]

            def forward_backward():
                for leaf in leaves:
                    leaf.grad = None
                attend(*leaves, **options).backward(tdout)
                self.synchronize()
                return tuple(leaf.grad for leaf in leaves)

            functions["fwd+bwd"] = forward_backward
        self.synchronize()  # the copies to the device are not part of any timed call
        return functions


class MlxPeer(Peer):
    """``mlx.core.fast.scaled_dot_product_attention`` on MLX's default device."""

    name = "mlx"
    windows = False

    def __init__(self, mx):
        self.mx = mx
        self.dtypes = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}

    @property
    def label(self):
        return f"mlx {self.mx.__version__} ({self.mx.default_device()})"

    def unsupported(self, case):
        if case.causal and case.seq != case.seq_k:
            return "MLX's causal mask is aligned bottom-right"
        return None

    def _float32(self, array):
        return np.asarray(array.astype(self.mx.float32))

    def prepare(self, case, q, k, v, dout):
        mx = self.mx
        # Through float32, which holds every bf16 and f16 value exactly: mx.array takes no
        # ml_dtypes arrays.
        arrays = [q, k, v] + ([] if dout is None else [dout])
        arrays = [mx.array(a.astype(np.float32)).astype(self.dtypes[case.dtype]) for a in arrays]
        mx.eval(*arrays)  # MLX is lazy: the conversions must not land in a timed call
        q, k, v = arrays[:3]
        # MLX's "causal" aligns the last query with the last key; for N x N it is top-left too.
        options = dict(scale=1 / math.sqrt(case.dim), mask="causal" if case.causal else None)

        def attend(q, k, v):
            return mx.fast.scaled_dot_product_attention(q, k, v, **options)

        def forward():
            out = attend(q, k, v)
            mx.eval(out)
            return out

        functions = {"fwd": forward}
        if dout is not None:

            def forward_backward():
                _, gradients = mx.vjp(attend, [q, k, v], [arrays[3]])
                mx.eval(gradients)
                return gradients

            functions["fwd+bwd"] = forward_backward
        return functions


# The most the naive peer copies k and v into float32 for (bf16 and f16 inputs): the decode
# grid's largest cache, B 8, Hkv 32, Nk 32k, D 128, would be 8 GiB.
_NAIVE_MAX_COPY = 2 * 2**30


class NumpyPeer(Peer):
    """Naive attention in float32 numpy (``bench.naive``): the N x N scores and probabilities
    are materialized, so it runs only up to Nq x Nk = naive_max_seq^2 scores per head."""

    name = "numpy"
    # OpenBLAS's worker threads spin (yielding) for 2^28 cycles after a BLAS call before they
    # sleep, about 0.1 s; on a machine with few cores they would slow the next peer's call.
    settle_seconds = 0.15

    def __init__(self, max_seq):
        self.max_seq = max_seq

    def unsupported(self, case):
        if case.seq * case.seq_k > self.max_seq**2:
            return f"Nq x Nk > --naive-max-seq {self.max_seq} squared"
        float32_kv = 2 * case.batch * case.kv_heads * case.seq_k * case.dim * 4
        if case.dtype != "f32" and float32_kv > _NAIVE_MAX_COPY:
            return "its float32 copies of k and v would exceed 2 GiB"
        return None

    def prepare(self, case, q, k, v, dout):
        q, k, v = (a.astype(np.float32, copy=False) for a in (q, k, v))
        options = dict(
            scale=np.float32(1 / math.sqrt(case.dim)),
            causal=case.causal,
            window=case.window,
            alignment="top_left",
        )

        def forward():
            return naive.attention(q, k, v, **options)[0]

        functions = {"fwd": forward}
        if dout is not None:
            dout32 = dout.astype(np.float32, copy=False)

            def forward_backward():
                out, lse = naive.attention(q, k, v, **options)
                return naive.attention_backward(dout32, q, k, v, out, lse, **options)

            functions["fwd+bwd"] = forward_backward
        return functions


def optional_module(name):
    """The module, or None (said on stderr) when it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        print(f"bench: {name} is not available ({error}); running without it", file=sys.stderr)
        return None


def _torch(backend, threads, options):
    torch = optional_module("torch")
    if torch is None:
        return None
    device = "mps" if backend == "metal" else "cpu"
    if device == "mps" and not torch.backends.mps.is_available():
        print("bench: this torch cannot use the GPU (mps); running without it", file=sys.stderr)
        return None
    return TorchPeer(torch, device, threads)


def _mlx(backend, threads, options):
    mx = optional_module("mlx.core")
    return None if mx is None else MlxPeer(mx)


def _numpy(backend, threads, options):
    return NumpyPeer(options["naive_max_seq"])


# name -> factory(backend, threads, options): the peer, or None where it cannot run here.
FACTORIES = {"torch": _torch, "mlx": _mlx, "numpy": _numpy}


def make_peers(names, backend, threads, **options):
    """The peers named besides mfa, set up to run beside mfa on backend: torch on the GPU
    ("mps") beside metal, on the CPU otherwise. Those not installed are left out."""
    peers = []
    for name in names:
        peer = FACTORIES[name](backend, threads, options)
        if peer is not None:
            peers.append(peer)
    return peers
