"""How the benchmark times its peers, checks their results and measures their memory.

Per case and pass:

1. warm-up: every peer makes ``warmups`` untimed calls, peer after peer (first-touch page
   faults, thread-pool start, lazy set-up, pipeline compilation). The first call's result is
   compared with mfa's; where a peer can say which kernel ran (torch's SDPA backend), that call
   is the one observed.
2. timed rounds, interleaved: each of ``repeats`` rounds runs one trial of every peer, in an
   order that rotates by one peer each round (A B C, B C A, C A B, ...), so a burst of load
   from elsewhere lands on every peer alike and no peer always runs right after the same one.
   A trial is ``dispatches`` calls in a row; its time is their mean. Every trial, whichever
   peer made it, is followed by the same pause: the longest ``Peer.settle_seconds`` of the
   peers (torch's OpenMP threads and OpenBLAS's, under numpy, spin on after a call), so that no
   trial runs beside another peer's spinning threads, and every trial starts from idle threads
   alike (a pause after one peer only made the other peer's small calls look fast beside it).
   Some virtual machines run the first milliseconds of work after an idle pause on one virtual
   CPU (a scheduler that packs threads while the machine is lightly loaded); there a trial of
   one call under ~25 ms measures that as much as the peer, and ``dispatches`` > 1 times calls
   as a model's layers make them, one after another.
3. memory: with ``memory``, one more untimed call per peer for the peak extra resident memory.

Reported per peer: the median trial time, the best trial's GPU time where recorded (MFA's
method), the threads its calls kept busy (median over the rounds of the process CPU time / wall
time of a trial: mfa's workers sleep when idle, so this says whether they all worked; torch's
spin while they wait, so its figure says little; on a shared machine a session gets only its
share of the CPUs, so read it from a quiet run), and "x peer", the median over the rounds of
the peer's time divided by mfa's in the same round (paired, so drifts of the machine's speed
between rounds cancel).

Nothing here changes a process-wide setting. Before each memory call, freed heap memory is
returned to the OS (``_measure.reset_resident_peak``) so that memory the allocator kept from
earlier calls does not hide a peak; it is done for every peer alike, outside the timed calls.
"""

import time
from dataclasses import asdict, dataclass

import numpy as np

from mfa_native._measure import reset_resident_peak, resident_rise
from mfa_native.bench.cases import PASSES
from mfa_native.bench.peers import MfaPeer, inputs

__all__ = ["Settings", "run", "planned_work", "calls_per_cell", "peak_extra_bytes"]

# Relative error (to the largest magnitude of the peer's result) beyond which a row is flagged:
# the float32 bound leaves room for float32 reductions over N, bf16 / f16 for one rounding of
# the output (2^-8, 2^-11) plus the inputs' own rounding seen through different accumulations.
AGREEMENT = {"f32": 1e-4, "bf16": 3e-2, "f16": 5e-3}


@dataclass(frozen=True)
class Settings:
    passes: tuple = PASSES
    repeats: int = 5
    dispatches: int = 1
    warmups: int = 1
    memory: bool = True


def calls_per_cell(settings):
    """Calls one peer makes per case and pass: what the progress line counts."""
    return settings.warmups + settings.repeats * settings.dispatches + int(settings.memory)


def _failure(peer, error):
    """The result entry of a peer that raised: a peer's failure (a GPU out of memory, say) is
    one of the results, while mfa's own is re-raised to stop the run."""
    if isinstance(peer, MfaPeer):
        raise error
    return {"error": f"{type(error).__name__}: {error}"}


def _result_bytes(result):
    if isinstance(result, (tuple, list)):
        return sum(_result_bytes(item) for item in result)
    nbytes = getattr(result, "nbytes", None)
    if nbytes is None and hasattr(result, "element_size"):  # torch tensor
        nbytes = result.element_size() * result.nelement()
    return int(nbytes or 0)


def peak_extra_bytes(function):
    """Resident-set rise during one call of function, minus what its results occupy; None, with
    no call, where the high-water mark cannot be reset."""
    baseline = reset_resident_peak()
    if baseline is None:
        return None
    result = function()
    return max(resident_rise(baseline) - _result_bytes(result), 0)


def _max_relative_difference(got, expected):
    """max |got - expected| / max |expected| over lists of float32 arrays (the difference of
    two float32 values is within one rounding of exact: ample for tolerances of 1e-4 and up)."""
    return max(
        float(np.max(np.abs(g - e))) / (float(np.max(np.abs(e))) or 1.0)
        for g, e in zip(got, expected)
    )


def _trial(peer, function, dispatches):
    """(wall seconds per call, GPU seconds per call or None) of dispatches calls in a row."""
    gpu_start = peer.gpu_seconds()
    start = time.perf_counter()
    for _ in range(dispatches):
        function()
    wall = (time.perf_counter() - start) / dispatches
    gpu = None if gpu_start is None else (peer.gpu_seconds() - gpu_start) / dispatches
    return wall, gpu


def _rates(case, which, seconds, prefix=""):
    if seconds is None:
        return {prefix + "gflops": None, prefix + "ginstrs": None}
    return {
        prefix + "gflops": case.flops(which) / seconds / 1e9,
        prefix + "ginstrs": case.instructions(which) / seconds / 1e9,
    }


def _measure_pass(case, which, peers, runners, settings, progress):
    """The results of every peer on one case and pass, keyed by peer name."""
    results, functions, observed = {}, {}, {}
    for peer in peers:
        runner = runners[peer.name]
        if which in runner:
            functions[peer.name] = runner[which]
        else:
            results[peer.name] = dict(runner)
    active = [peer for peer in peers if peer.name in functions]
    label = f"{case.label()} {which}"
    work = _work(case, which)
    made = dict.fromkeys(functions, 0)

    def step(peer, what):
        made[peer.name] += 1
        progress.step(f"{label} {peer.name} {what}", work)

    def fail(peer, error):
        results[peer.name] = _failure(peer, error)
        if peer in active:
            active.remove(peer)

    pause = max((peer.settle_seconds for peer in active), default=0.0)

    # 1. Warm-up, the first call observed and its result compared with mfa's (the first peer's)
    #    at once, so that only mfa's stays in memory.
    reference = None
    for peer in list(active):
        try:
            step(peer, "warm-up")
            output, kernel = peer.observe(functions[peer.name])
            agreement = {}
            if reference is None:
                reference = peer.as_float32(output)
            else:
                difference = _max_relative_difference(peer.as_float32(output), reference)
                agreement["max_relative_difference_to_mfa"] = difference
                agreement["disagrees"] = difference > AGREEMENT[case.dtype]
            observed[peer.name] = (kernel, agreement)
            del output
            for _ in range(settings.warmups - 1):
                step(peer, "warm-up")
                functions[peer.name]()
        except Exception as error:
            fail(peer, error)
        time.sleep(pause)

    # 2. Interleaved rounds, the order rotating by one peer each round.
    walls = {peer.name: [] for peer in active}
    gpus = {peer.name: [] for peer in active}
    busy = {peer.name: [] for peer in active}
    for round_index in range(settings.repeats):
        shift = round_index % len(active) if active else 0
        for peer in active[shift:] + active[:shift]:
            try:
                for _ in range(settings.dispatches):
                    step(peer, f"trial {round_index + 1}/{settings.repeats}")
                cpu = time.process_time()
                wall, gpu = _trial(peer, functions[peer.name], settings.dispatches)
                cpu = (time.process_time() - cpu) / settings.dispatches
            except Exception as error:
                fail(peer, error)
                continue
            walls[peer.name].append(wall)
            busy[peer.name].append(cpu / wall if wall > 0 else 0.0)
            if gpu is not None:
                gpus[peer.name].append(gpu)
            time.sleep(pause)

    # 3. Results and memory.
    del reference
    for peer in active:
        wall = float(np.median(walls[peer.name]))
        gpu = min(gpus[peer.name]) if gpus[peer.name] else None
        kernel, agreement = observed[peer.name]
        result = {"ms": wall * 1e3, "gpu_ms": None if gpu is None else gpu * 1e3}
        result["threads_busy"] = float(np.median(busy[peer.name]))
        result.update(_rates(case, which, wall))
        result.update(_rates(case, which, gpu, "gpu_"))
        if kernel is not None:
            result["kernel"] = kernel
        result.update(agreement)
        result["peak_extra_bytes"] = None
        if settings.memory:
            step(peer, "memory")
            try:
                result["peak_extra_bytes"] = peak_extra_bytes(functions[peer.name])
            except Exception as error:
                result = _failure(peer, error)
        results[peer.name] = result
    progress.skip(sum(calls_per_cell(settings) - count for count in made.values()) * work)

    mfa = results.get("mfa", {})
    for name, result in results.items():
        if name != "mfa" and "ms" in result and "ms" in mfa:
            ratios = [p / m for p, m in zip(walls[name], walls["mfa"])]
            result["speedup_of_mfa"] = float(np.median(ratios))
            result["speedup_range"] = [min(ratios), max(ratios)]
    return {peer.name: results[peer.name] for peer in peers}


def _work(case, which):
    """The progress line's weight of one call: its time at 100 GFLOP/s and 10 GB/s, whichever
    is longer (only the proportions matter: decoding is weighed by its bytes, prefill by its
    FLOPs)."""
    return max(case.flops(which) / 100e9, case.bytes(which) / 10e9)


def planned_work(cases, peers, settings):
    """The progress line's total: every call of every peer, weighted by _work."""
    return sum(
        calls_per_cell(settings) * _work(case, which)
        for case in cases
        for which in settings.passes
        for peer in peers
    )


def run(cases, peers, settings, progress, grid=None):
    """One row per case and pass. The first peer (mfa) is the reference: the others' results
    are compared with its results, and their times divided by its time."""
    rows = []
    for case in cases:
        backward = any(which != "fwd" for which in settings.passes)
        arrays = inputs(case, backward=backward)
        # Per peer: its functions, or the entry of a peer that skips or fails the case.
        runners = {}
        for peer in peers:
            reason = peer.skip_reason(case)
            if reason:
                runners[peer.name] = {"skipped": reason}
                continue
            try:
                runners[peer.name] = peer.prepare(case, *arrays)
            except Exception as error:
                runners[peer.name] = _failure(peer, error)
        for which in settings.passes:
            skipped = sum(1 for runner in runners.values() if which not in runner)
            progress.skip(skipped * calls_per_cell(settings) * _work(case, which))
            results = _measure_pass(case, which, peers, runners, settings, progress)
            row = {"config": asdict(case), "config_label": case.label(), "pass": which}
            if grid is not None:
                row["grid"] = grid
            row["results"] = results
            rows.append(row)
            progress.finished(f"{case.label()} {which}")
        del arrays, runners
    return rows
