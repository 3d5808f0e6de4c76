"""Studies of mfa's features: each times calls that answer one question against each other,
interleaved in one process, and prints their ratios beside the project's target.

Every study builds, per shape, a few named calls ("variants") on the same inputs; the calls are
timed in rounds whose order rotates (as ``timing`` does for the peers), and a ratio is the median
over the rounds of one variant's time divided by another's in the same round, so that load from
elsewhere cancels. The studies (``--grid`` names them, beside the shape grids):

modifiers
    softcap 30, ALiBi (slopes 2^(-8 h / H)) and sinks, each alone, against the same call without
    them (B 1, H 8, N 2048, D 64 and 128, f32 and bf16): overhead = time with / time without,
    target <= 1.15. PyTorch's fastest CPU alternative for ALiBi is SDPA with the bias as an
    additive ``attn_mask`` (softcap and sinks have none); FlexAttention (``torch.compile``d
    ``flex_attention`` with a ``score_mod``) where it compiles here, with ``--flex``.
block-mask
    a block-diagonal boolean mask of 8 documents at N 4096 (B 1, H 8, D 64), passed with and
    without its ``mask_summary``, against the same call with an all-true mask: speedup =
    all-true time / documents time, target >= 4. Beside it torch SDPA with the boolean
    ``attn_mask`` and, with ``--flex``, FlexAttention with ``create_block_mask``.
decode-roof
    decoding Hq 32, D 128 against Nk 4k and 32k: at B 1 with Hkv 8 and 32, Nq 1 and 4, and at
    B 8 with Hkv 8, Nq 1: mfa against torch SDPA
    (``enable_gqa=True``), target >= 2x; the GB/s of k and v read against a streaming read of
    the same k and v bytes on as many threads, timed in the same rounds (target >= 60 % at Nk
    32k), and against the read roof; the threads a call keeps busy (process CPU time / wall
    time, target >= 0.9 x threads at B 1); and mfa on one thread against two at B 1. The last
    two need a quiet machine: where Linux groups processes by session (autogroup, as on a
    shared login), a busy session next to another gets half the CPUs, so two threads read 1.00.
    The threads busy are measured twice: over the timed trials, each after an idle pause, and
    over mfa's calls in a row for 0.2 s (the second half of them), as a decoding loop makes
    them; the target is on the second, since some virtual machines run the first milliseconds
    of work after an idle pause on one virtual CPU (``bench.timing`` says more).
varlen
    8 packed sequences of mixed lengths (8k tokens, H 8, D 64, causal) in one
    ``attention_varlen`` call against the 8 dense calls one after the other (target: within
    10 %) and against one dense call padded to the longest sequence.
paged
    paged decoding (``attention_with_kvcache``, blocks of 256 keys in a shuffled table) against
    the dense decode at the same lengths (Hq 32, Hkv 8, D 128, Nq 1): target within 15 %.
adapters
    what the torch, flash-attn and MLX front ends add to a call over the raw numpy call at
    N 128 and decoding (Nq 1, Nk 128), B 1, H 8, D 64: target under 20 us per call, measured
    in CPU time with the kernel skipped (``adapters`` says how).

``--quick`` runs each study at one small shape (f32, D 64 or 128, N 2048 / Nk 4096, B 1).
"""

import time
from dataclasses import dataclass

import numpy as np

import mfa_native
from mfa_native.bench import roof
from mfa_native.bench.cases import Case
from mfa_native.bench.peers import TorchPeer, inputs, numpy_dtype

__all__ = ["STUDIES", "Study", "agreement", "interleave", "result_row", "run", "table"]


def _settle_seconds(name):
    """How long torch's threads (the "torch ..." and "flex ..." variants) may keep spinning after
    a call (TorchPeer.settle_seconds says why)."""
    return TorchPeer.settle_seconds if name.startswith(("torch", "flex")) else 0.0


def interleave(functions, setup, keep=()):
    """({name: [seconds per call, per round]}, {name: result of its first call} for the names in
    keep) of every function, timed once in each of ``setup.repeats`` rounds in an order that
    rotates by one each round, after ``setup.warmups`` (at least 1) untimed calls of each; a
    round's trial of a function is ``setup.dispatches`` calls in a row, timed by their mean.
    Every trial is followed by the same pause, long enough for torch's threads to sleep when a
    torch variant is among them (the grids' timing, ``bench.timing``, says why)."""
    names = list(functions)
    pause = max((_settle_seconds(name) for name in names), default=0.0)
    results = {}
    for name in names:
        for index in range(max(setup.warmups, 1)):
            result = functions[name]()
            if index == 0 and name in keep:
                results[name] = result
            del result
        time.sleep(pause)
    seconds = {name: [] for name in names}
    for round_index in range(setup.repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            for _ in range(setup.dispatches):
                functions[name]()
            seconds[name].append((time.perf_counter() - start) / setup.dispatches)
            time.sleep(pause)
    return seconds, results


def _difference(got, expected):
    """max |got - expected| / max |expected|, in float32."""
    got, expected = (np.asarray(a, np.float32) for a in (got, expected))
    return float(np.max(np.abs(got - expected))) / (float(np.max(np.abs(expected))) or 1.0)


# As timing.AGREEMENT: what two ways of computing one result may differ by.
_AGREEMENT = {"f32": 1e-4, "bf16": 3e-2}


def agreement(dtype, got, expected):
    """The measure of two variants that must give one result: their difference and whether it
    is within the dtype's tolerance."""
    difference = _difference(got, expected)
    return (difference, f"<= {_AGREEMENT[dtype]:g}", difference <= _AGREEMENT[dtype])


def paired_ratio(seconds, numerator, denominator):
    """Median over the rounds of numerator's time / denominator's in the same round."""
    return float(np.median([a / b for a, b in zip(seconds[numerator], seconds[denominator])]))


@dataclass(frozen=True)
class Study:
    name: str
    summary: str
    run: object  # run(setup) -> list of rows


@dataclass
class Setup:
    """What every study gets: mfa's contexts, torch (or None), the roofs, the timing."""

    context: object
    single_thread: object  # a one-thread Context (decode-roof)
    torch: object
    roofs: dict
    repeats: int
    warmups: int
    quick: bool
    flex: bool
    # Calls in a row per trial (``--dispatches``).
    dispatches: int = 1
    # Every sequence length divided by it, and the adapters study's rounds (the tests run the
    # studies tiny).
    shrink: int = 1


def result_row(study, label, seconds, measures):
    """A result row: every variant's median ms and the measures (name -> (value, target text,
    met or None))."""
    return {
        "study": study,
        "label": label,
        "ms": {name: float(np.median(times)) * 1e3 for name, times in seconds.items()},
        "measures": {
            name: {"value": value, "target": target, "met": met}
            for name, (value, target, met) in measures.items()
        },
    }


def _torch_tensor(torch, array):
    if array.dtype == np.float32:
        return torch.from_numpy(array)
    return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)


def _flex(torch):
    """The compiled flex_attention and create_block_mask, or None where they cannot run."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    return torch.compile(flex_attention), create_block_mask


def _try(seconds_of, functions, name, make):
    """Adds functions[name] = make() unless it raises (its error becomes the variant's)."""
    try:
        function = make()
        function()
    except Exception as error:  # a peer's failure is a result, as in timing._failure
        seconds_of[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        return
    functions[name] = function


def _modifiers(setup):
    dtypes = ("f32",) if setup.quick else ("f32", "bf16")
    dims = (64,) if setup.quick else (64, 128)
    return [
        _modifiers_case(setup, Case(1, 8, 2048 // setup.shrink, dim, dtype))
        for dtype in dtypes
        for dim in dims
    ]


def _modifiers_case(setup, case):
    q, k, v, _ = inputs(case, backward=False)
    heads = case.heads
    slopes = (2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)).astype(np.float32)
    sinks = np.linspace(-1.0, 1.0, heads, dtype=np.float32)
    options = dict(backend=setup.context)

    def call(**extra):
        return lambda: mfa_native.attention(q, k, v, **options, **extra)

    functions = {
        "plain": call(),
        "softcap": call(softcap=30.0),
        "alibi": call(alibi_slopes=slopes),
        "sinks": call(sinks=sinks),
    }
    failures = {}
    torch = setup.torch
    if torch is not None:
        tq, tk, tv = (_torch_tensor(torch, a) for a in (q, k, v))
        positions = torch.arange(case.seq, dtype=torch.float32)
        distance = (positions[:, None] - positions[None, :]).abs()
        bias = (-torch.from_numpy(slopes)[:, None, None] * distance)[None]
        bias = bias.to(tq.dtype)
        attend = torch.nn.functional.scaled_dot_product_attention

        def sdpa(**extra):
            def go():
                with torch.no_grad():
                    return attend(tq, tk, tv, **extra)

            return go

        functions["torch"] = sdpa()
        functions["torch alibi"] = sdpa(attn_mask=bias)
        if setup.flex:
            compiled = _flex(torch)
            if compiled is not None:
                flex, _ = compiled
                torch_slopes = torch.from_numpy(slopes)

                def softcap_mod(score, b, h, i, j):
                    return 30.0 * torch.tanh(score / 30.0)

                def alibi_mod(score, b, h, i, j):
                    return score - torch_slopes[h] * (i - j).abs()

                for name, mod in (("flex softcap", softcap_mod), ("flex alibi", alibi_mod)):

                    def make(mod=mod):
                        def go():
                            with torch.no_grad():
                                return flex(tq, tk, tv, score_mod=mod)

                        return go

                    _try(failures, functions, name, make)
    seconds, _ = interleave(functions, setup)
    measures = {}
    for name in ("softcap", "alibi", "sinks"):
        overhead = paired_ratio(seconds, name, "plain")
        measures[f"{name} overhead"] = (overhead, "<= 1.15", overhead <= 1.15)
    if "torch alibi" in seconds:
        measures["x torch alibi (attn_mask)"] = (
            paired_ratio(seconds, "torch alibi", "alibi"),
            "",
            None,
        )
    for name in ("flex softcap", "flex alibi"):
        if name in seconds:
            mine = name.split()[1]
            measures[f"x {name}"] = (paired_ratio(seconds, name, mine), "", None)
    row = result_row("modifiers", case.label(), seconds, measures)
    row["errors"] = failures
    return row


def _documents_mask(seq, documents):
    """Block-diagonal boolean mask: key j visible from query i where both lie in one of
    ``documents`` equal runs of positions."""
    document = np.arange(seq) * documents // seq
    return document[:, None] == document[None, :]


def _block_mask(setup):
    seq = (2048 if setup.quick else 4096) // setup.shrink
    dtypes = ("f32",) if setup.quick else ("f32", "bf16")
    return [_block_mask_case(setup, seq, dtype) for dtype in dtypes]


def _block_mask_case(setup, seq, dtype):
    case = Case(1, 8, seq, 64, dtype)
    q, k, v, _ = inputs(case, backward=False)
    documents = _documents_mask(seq, 8)
    every = np.ones((seq, seq), bool)
    summary = mfa_native.mask_summary(documents, seq, seq, backend=setup.context)
    options = dict(backend=setup.context)
    functions = {
        "all-true mask": lambda: mfa_native.attention(q, k, v, mask=every, **options),
        "documents": lambda: mfa_native.attention(q, k, v, mask=documents, **options),
        "documents + summary": lambda: mfa_native.attention(
            q, k, v, mask=documents, block_mask=summary, **options
        ),
    }
    failures = {}
    torch = setup.torch
    if torch is not None:
        tq, tk, tv = (_torch_tensor(torch, a) for a in (q, k, v))
        torch_mask = torch.from_numpy(documents)
        attend = torch.nn.functional.scaled_dot_product_attention

        def sdpa():
            with torch.no_grad():
                return attend(tq, tk, tv, attn_mask=torch_mask)

        functions["torch documents"] = sdpa
        if setup.flex:
            compiled = _flex(torch)
            if compiled is not None:
                flex, create_block_mask = compiled
                document = torch.arange(seq) * 8 // seq

                def same_document(b, h, i, j):
                    return document[i] == document[j]

                def make():
                    blocks = create_block_mask(same_document, None, None, seq, seq, "cpu")

                    def go():
                        with torch.no_grad():
                            return flex(tq, tk, tv, block_mask=blocks)

                    return go

                _try(failures, functions, "flex documents", make)
    seconds, results = interleave(functions, setup, keep=("documents", "documents + summary"))
    measures = {}
    for name in ("documents", "documents + summary"):
        speedup = paired_ratio(seconds, "all-true mask", name)
        measures[f"speedup, {name}"] = (speedup, ">= 4", speedup >= 4.0)
    measures["summary changes nothing"] = agreement(
        dtype, results["documents + summary"], results["documents"]
    )
    for name in ("torch documents", "flex documents"):
        if name in seconds:
            measures[f"x {name}"] = (
                paired_ratio(seconds, name, "documents + summary"),
                "",
                None,
            )
    row = result_row("block-mask", f"{case.label()} 8 documents", seconds, measures)
    row["errors"] = failures
    return row


def _decode_cases(quick, shrink, shapes=((1, 8, 1), (8, 8, 1))):
    """Decode cases Hq 32, D 128 for each (B, Hkv, Nq) of shapes (quick: the first)."""
    seqs = tuple(seq // shrink for seq in ((4096,) if quick else (4096, 32768)))
    dtypes = ("f32",) if quick else ("f32", "bf16")
    return [
        Case(batch, 32, seq_q, 128, dtype, kv_heads=kv_heads, seq_k=seq_k)
        for dtype in dtypes
        for seq_k in seqs
        for batch, kv_heads, seq_q in (shapes[:1] if quick else shapes)
    ]


# The decode-roof study's (B, Hkv, Nq): at B 1 GQA and plain multi-head, one and four new
# tokens; at B 8 the GQA single token (torch alone would take minutes at B 8, Hkv 32, Nk 32k).
_DECODE_ROOF_SHAPES = ((1, 8, 1), (1, 32, 1), (1, 8, 4), (1, 32, 4), (8, 8, 1))


def _decode_roof(setup):
    cases = _decode_cases(setup.quick, setup.shrink, _DECODE_ROOF_SHAPES)
    return [_decode_case(setup, case) for case in cases]


def _busy(function, samples):
    """function, also appending to samples the process CPU time / wall time of each call: the
    threads it kept busy (a worker blocked on a lock or asleep adds no CPU time; one stalled on
    memory does, and so does the caller while it spins for its job's last tasks, at most one
    task's time: thread_pool.h says why it spins)."""

    def timed():
        cpu, wall = time.process_time(), time.perf_counter()
        result = function()
        samples.append((time.process_time() - cpu) / (time.perf_counter() - wall))
        return result

    return timed


def _in_a_row(function, seconds):
    """(median ms, median threads busy) of function's calls made one after another for
    ``seconds``, over the calls of the second half (the first half lets the machine leave its
    idle state)."""
    samples, starts, ends = [], [], []
    timed = _busy(function, samples)
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds or len(samples) < 4:
        starts.append(time.perf_counter() - begin)
        timed()
        ends.append(time.perf_counter() - begin)
    steady = [i for i, start in enumerate(starts) if start >= seconds / 2] or list(
        range(len(samples) // 2, len(samples))
    )
    ms = float(np.median([(ends[i] - starts[i]) * 1e3 for i in steady]))
    return ms, float(np.median([samples[i] for i in steady]))


def _decode_case(setup, case):
    threads = setup.context.capabilities["num_threads"]
    q, k, v, _ = inputs(case, backward=False)
    busy = []
    functions = {
        "mfa": _busy(lambda: mfa_native.attention(q, k, v, backend=setup.context), busy),
    }
    if case.batch == 1:
        functions["mfa 1 thread"] = lambda: mfa_native.attention(
            q, k, v, backend=setup.single_thread
        )
    read_bytes = None
    try:
        functions["read k, v"], read_bytes = roof.reader((k, v), threads)
    except roof.RoofUnavailable:
        pass
    torch = setup.torch
    if torch is not None:
        tq, tk, tv = (_torch_tensor(torch, a) for a in (q, k, v))
        attend = torch.nn.functional.scaled_dot_product_attention

        def sdpa():
            with torch.no_grad():
                return attend(tq, tk, tv, enable_gqa=True)

        functions["torch"] = sdpa
    seconds, results = interleave(functions, setup, keep=("mfa", "mfa 1 thread"))
    measures = {}
    if "mfa 1 thread" in results:
        # Split differently over the keys, so equal within float32 roundings only.
        measures["1 thread = 2"] = agreement(case.dtype, results["mfa 1 thread"], results["mfa"])
    if "torch" in seconds:
        speedup = paired_ratio(seconds, "torch", "mfa")
        measures["x torch"] = (speedup, ">= 2", speedup >= 2.0)
    rate = case.bytes("fwd") / float(np.median(seconds["mfa"])) / 1e9
    measures["GB/s"] = (rate, "", None)
    # The bandwidth target is set at Nk 32k, where k and v outgrow the last-level cache.
    long_cache = case.seq_k * setup.shrink >= 32768
    if read_bytes:
        # mfa's GB/s over the read's in the same round: (read time / mfa time) x bytes ratio.
        fraction = paired_ratio(seconds, "read k, v", "mfa") * case.bytes("fwd") / read_bytes
        met = fraction >= 0.6 if long_cache else None
        measures["of reading k, v"] = (fraction, ">= 0.60 at Nk 32k", met)
    read = setup.roofs.get("read")
    if read is not None:
        measures["of read roof"] = (rate / read.rate, "", None)
    # The threads a call keeps busy, over its timed calls (the warm-ups left out), and in a row.
    measures["threads busy after a pause"] = (
        float(np.median(busy[-setup.repeats * setup.dispatches :])),
        "",
        None,
    )
    ms, held = _in_a_row(functions["mfa"], 0.2 / setup.shrink)
    measures["mfa ms in a row"] = (ms, "", None)
    wanted = 0.9 * threads
    measures["threads busy in a row"] = (
        held,
        f">= {wanted:.1f} of {threads} at B 1",
        held >= wanted if case.batch == 1 else None,
    )
    if "mfa 1 thread" in seconds:
        measures["1 thread / 2"] = (paired_ratio(seconds, "mfa 1 thread", "mfa"), "~2", None)
    return result_row("decode-roof", case.label(), seconds, measures)


# Mixed lengths of 8 sequences, 8192 tokens in all (4096 under --quick).
_VARLEN_LENGTHS = (2048, 1536, 1280, 1024, 896, 640, 512, 256)


def _varlen(setup):
    scale = (2 if setup.quick else 1) * setup.shrink
    lengths = tuple(length // scale for length in _VARLEN_LENGTHS)
    dtypes = ("f32",) if setup.quick else ("f32", "bf16")
    return [_varlen_case(setup, lengths, dtype) for dtype in dtypes]


def _varlen_case(setup, lengths, dtype):
    heads, dim = 8, 64
    total = sum(lengths)
    rng = np.random.default_rng(0)
    dt = numpy_dtype(dtype)
    q, k, v = (
        rng.standard_normal((total, heads, dim), dtype=np.float32).astype(dt) for _ in range(3)
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    longest = max(lengths)
    # The dense calls read each sequence in bhsd, as a caller holding them apart would.
    pieces = [
        tuple(
            np.ascontiguousarray(a[offsets[b] : offsets[b + 1]].transpose(1, 0, 2)[None])
            for a in (q, k, v)
        )
        for b in range(len(lengths))
    ]
    padded = [np.zeros((len(lengths), heads, longest, dim), dt) for _ in range(3)]
    for b, piece in enumerate(pieces):
        for whole, part in zip(padded, piece):
            whole[b, :, : part.shape[2]] = part[0]
    options = dict(causal=True, causal_alignment="top_left", backend=setup.context)
    functions = {
        "varlen": lambda: mfa_native.attention_varlen(
            q, k, v, offsets, offsets, longest, longest, **options
        ),
        "separate": lambda: [mfa_native.attention(*piece, **options) for piece in pieces],
        "padded": lambda: mfa_native.attention(*padded, **options),
    }
    torch = setup.torch
    if torch is not None:
        torch_pieces = [tuple(_torch_tensor(torch, a) for a in piece) for piece in pieces]
        attend = torch.nn.functional.scaled_dot_product_attention

        def sdpa():
            with torch.no_grad():
                return [attend(*piece, is_causal=True) for piece in torch_pieces]

        functions["torch separate"] = sdpa
    seconds, results = interleave(functions, setup, keep=("varlen", "separate"))
    within = paired_ratio(seconds, "varlen", "separate")
    separate = np.concatenate([out[0].transpose(1, 0, 2) for out in results["separate"]])
    measures = {
        "varlen / separate": (within, "<= 1.10", within <= 1.10),
        "padded / varlen": (paired_ratio(seconds, "padded", "varlen"), "", None),
        "varlen = separate": agreement(dtype, results["varlen"], separate),
    }
    if "torch separate" in seconds:
        measures["x torch separate"] = (
            paired_ratio(seconds, "torch separate", "varlen"),
            "",
            None,
        )
    label = f"{dtype} {len(lengths)} seqs {total} tokens H{heads} D{dim} causal"
    return result_row("varlen", label, seconds, measures)


_PAGE = 256


def _paged(setup):
    return [_paged_case(setup, case) for case in _decode_cases(setup.quick, setup.shrink)]


def _paged_case(setup, case):
    q, k, v, _ = inputs(case, backward=False)
    blocks_per_sequence = -(-case.seq_k // _PAGE)
    blocks = case.batch * blocks_per_sequence
    rng = np.random.default_rng(1)
    table = rng.permutation(blocks).astype(np.int32).reshape(case.batch, blocks_per_sequence)
    dt = numpy_dtype(case.dtype)
    caches = []
    for dense in (k, v):
        cache = np.empty((blocks, case.kv_heads, _PAGE, case.dim), dt)
        for b in range(case.batch):
            for page in range(blocks_per_sequence):
                rows_of = dense[b, :, page * _PAGE : (page + 1) * _PAGE]
                cache[table[b, page], :, : rows_of.shape[1]] = rows_of
        caches.append(cache)
    lengths = np.full(case.batch, case.seq_k, np.int32)
    functions = {
        "dense": lambda: mfa_native.attention(q, k, v, backend=setup.context),
        "paged": lambda: mfa_native.attention_with_kvcache(
            q, caches[0], caches[1], table, lengths, backend=setup.context
        ),
    }
    seconds, results = interleave(functions, setup, keep=("dense", "paged"))
    ratio = paired_ratio(seconds, "paged", "dense")
    measures = {
        "paged / dense": (ratio, "<= 1.15", ratio <= 1.15),
        "paged = dense": agreement(case.dtype, results["paged"], results["dense"]),
    }
    return result_row("paged", f"{case.label()} pages of {_PAGE}", seconds, measures)


def _adapters(setup):
    from mfa_native.bench import adapters  # imports torch and MLX where installed

    return adapters.run(setup)


STUDIES = {
    study.name: study
    for study in (
        Study("modifiers", "softcap, ALiBi, sinks against the call without them", _modifiers),
        Study("block-mask", "8 documents' mask against an all-true one", _block_mask),
        Study("decode-roof", "decode against torch SDPA and the read roof", _decode_roof),
        Study("varlen", "8 packed sequences against 8 dense calls, padding", _varlen),
        Study("paged", "paged decode against dense decode", _paged),
        Study("adapters", "the torch and MLX front ends' cost over the numpy call", _adapters),
    )
}


def run(names, setup):
    rows = []
    for name in names:
        rows += STUDIES[name].run(setup)
    return rows


def _format_measure(name, measure):
    value = measure["value"]
    if name.startswith("of "):
        shown = f"{value:.0%}"
    elif " = " in name or "changes nothing" in name:
        shown = f"{value:.1e}"
    else:
        shown = f"{value:.2f}"
    verdict = ""
    if measure["met"] is not None:
        verdict = f" (target {measure['target']}: {'met' if measure['met'] else 'NOT met'})"
    return f"{name} {shown}{verdict}"


def table(rows):
    """Lines: per row its label, each variant's median ms, then each measure."""
    lines = []
    study = None
    for row in rows:
        if row["study"] != study:
            study = row["study"]
            lines.append(f"study {study}: {STUDIES[study].summary}")
        times = ", ".join(f"{name} {ms:.2f}" for name, ms in row["ms"].items())
        lines.append(f"  {row['label']}: ms: {times}")
        for name, measure in row["measures"].items():
            lines.append(f"    {_format_measure(name, measure)}")
        for name, error in row.get("errors", {}).items():
            lines.append(f"    {name}: {error}")
    return lines
