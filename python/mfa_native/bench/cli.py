"""``python -m mfa_native bench``: options, per-backend defaults, and the run."""

import argparse
import json
import platform
import sys
import time

import mfa_native
from mfa_native.bench import cases as grids
from mfa_native.bench import features, report, roof, timing
from mfa_native.bench.peers import FACTORIES, BuildPeer, MfaPeer, cpu_count, inputs, make_peers

__all__ = ["main", "DEFAULTS"]

_DTYPES = ("f32", "bf16", "f16")
_PEERS = ("mfa", *FACTORIES)
# What each option left out defaults to, per backend (the table in the package docstring).
# seq, head_dims and window are the readme grid's; the other grids name their own shapes.
# metal-sim simulates every GPU thread on the CPU: small shapes, one repeat, and a window
# narrower than N so that its block skipping runs.
DEFAULTS = {
    "cpu": dict(
        seq=[1024, 2048, 4096],
        head_dims=[64, 128],
        dtypes=["f32", "bf16"],
        window=[(256, 0)],
        repeats=5,
        dispatches=1,
        peers=["mfa", "torch", "numpy"],
        naive_max_seq=2048,
        roof=True,
        memory=True,
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
        roof=False,
        memory=True,
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
        roof=False,
        memory=True,
        memory_check=False,
    ),
}
# --quick: what it changes besides each grid's own trims (Grid.quick). The naive numpy peer is
# by far the slowest (N x N scores through BLAS): up to N = 512 it runs where quick shapes are
# small (metal-sim), not at the readme grid's N >= 1024.
_QUICK = dict(memory=False, memory_check=False, naive_max_seq=512)
_CAUSAL = {"both": (False, True), "yes": (True,), "no": (False,)}
# Command-line option -> grid axis, for the options that shape the grids.
_AXIS_OPTIONS = {
    "dtypes": "dtype",
    "head_dims": "dim",
    "seq": "seq",
    "seq_q": "seq_q",
    "batch": "batch",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "causal": "causal",
    "window": "windows",
}


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
    """Help text ending with the per-backend defaults of an option, read from DEFAULTS."""
    defaults = "; ".join(
        f"{backend}: {_show(values[name])}" for backend, values in DEFAULTS.items()
    )
    return f"{text} (default {defaults})" if text else f"default {defaults}"


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m mfa_native bench",
        description="Time mfa against PyTorch SDPA, MLX SDPA and naive numpy attention, beside "
        "the machine's measured roofs. Several defaults depend on the backend (auto: the one "
        "it resolves to).",
        epilog="grids: "
        + "; ".join(f"{grid.name}: {grid.summary}" for grid in grids.GRIDS.values())
        + "; studies: "
        + "; ".join(f"{study.name}: {study.summary}" for study in features.STUDIES.values()),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="each grid's first shapes (readme: the first N and D), the naive numpy "
        "peer only up to N 512, no memory measurements; the same repeats",
    )
    parser.add_argument("--backend", default="cpu", choices=["cpu", "auto", "metal", "metal-sim"])
    parser.add_argument(
        "--grid",
        nargs="+",
        default=["readme"],
        choices=list(grids.GRIDS) + list(features.STUDIES),
        help="named grids of shapes and studies of features to run, in order (default "
        "readme; see below)",
    )
    parser.add_argument(
        "--flex",
        action="store_true",
        help="add torch.compile'd FlexAttention to the modifiers and block-mask studies "
        "(compiles a kernel per case: minutes)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for mfa, torch and the roof probes (default: every usable core)",
    )
    parser.add_argument("--peers", nargs="+", choices=_PEERS, help=_by_backend("peers"))
    parser.add_argument("--dtypes", nargs="+", choices=_DTYPES, help=_by_backend("dtypes"))
    parser.add_argument(
        "--seq", nargs="+", type=int, help=_by_backend("seq", "N: key rows, and query rows")
    )
    parser.add_argument(
        "--seq-q", nargs="+", type=int, help="query rows, where they differ from N (decoding)"
    )
    parser.add_argument("--head-dims", nargs="+", type=int, help=_by_backend("head_dims"))
    parser.add_argument("--batch", nargs="+", type=int, help="batch sizes (default 1)")
    parser.add_argument("--heads", nargs="+", type=int, help="query heads (default 8)")
    parser.add_argument(
        "--kv-heads", nargs="+", type=int, help="key/value heads, dividing --heads (default: =)"
    )
    parser.add_argument("--causal", choices=list(_CAUSAL), help="unmasked and/or causal (both)")
    parser.add_argument(
        "--window",
        nargs="*",
        type=_parse_window,
        help=_by_backend(
            "window", "sliding windows LEFT,RIGHT to add per shape; --window alone adds none"
        ),
    )
    parser.add_argument(
        "--passes", nargs="+", choices=grids.PASSES, help="default: each grid's (decode: fwd)"
    )
    parser.add_argument("--repeats", type=int, help=_by_backend("repeats", "timed rounds"))
    parser.add_argument(
        "--warmups", type=int, default=1, help="untimed calls per peer before the rounds (1)"
    )
    parser.add_argument(
        "--dispatches", type=int, help=_by_backend("dispatches", "calls in a row per trial")
    )
    parser.add_argument(
        "--naive-max-seq",
        type=int,
        help=_by_backend(
            "naive_max_seq",
            "the naive numpy peer runs where Nq x Nk is at most this squared (it stores the "
            "scores)",
        ),
    )
    parser.add_argument(
        "--build",
        metavar="LIBRARY",
        help="also time another libmfa build (the path of its shared library) as the peer "
        "'build', through its C ABI in this process: a change against its baseline, "
        "interleaved call by call (grids only; the studies time mfa_native's library alone)",
    )
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        help="measure every row's peak extra memory (default: on, off with --quick)",
    )
    parser.add_argument(
        "--memory-check",
        action=argparse.BooleanOptionalAction,
        help=_by_backend("memory_check", "run mfa alone at the memory targets, N=16384"),
    )
    parser.add_argument(
        "--roof",
        action=argparse.BooleanOptionalAction,
        help=_by_backend("roof", "measure the CPU's FMA, bf16 dot and bandwidth roofs (cpu only)"),
    )
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of GFLOP/s against N")
    return parser


def _overrides(arguments):
    """The grid axes given on the command line (before the defaults fill the rest)."""
    given = {}
    for option, axis in _AXIS_OPTIONS.items():
        value = getattr(arguments, option)
        if value is not None:
            given[axis] = tuple(_CAUSAL[value] if option == "causal" else value)
    return given


def _apply_defaults(arguments, backend):
    """Fill every option left out (None) with the backend's default, changed by --quick."""
    defaults = dict(DEFAULTS[backend])
    if arguments.quick:
        defaults.update(_QUICK)
    for name, value in defaults.items():
        if getattr(arguments, name) is None:
            setattr(arguments, name, value)


def _axis_defaults(arguments):
    """Every grid axis's values where a grid's block names none."""
    return {
        "dtype": tuple(arguments.dtypes),
        "dim": tuple(arguments.head_dims),
        "seq": tuple(arguments.seq),
        "batch": (1,),
        "heads": (8,),
        "kv_heads": (None,),
        "seq_q": (None,),
        "causal": _CAUSAL["both"],
        "windows": tuple(arguments.window),
    }


def _memory_targets(mfa):
    """mfa alone at the project's memory targets (float32, B=1, H=8, N=16384, D=64)."""
    case = grids.Case(1, 8, 16384, 64, "f32", False)
    functions = mfa.prepare(case, *inputs(case))
    limits = {"fwd": 16 * 2**20, "fwd+bwd": 128 * 2**20}
    report_lines = []
    for which in grids.PASSES:
        extra = timing.peak_extra_bytes(functions[which])
        report_lines.append(
            {
                "config_label": case.label(),
                "pass": which,
                "peak_extra_bytes": extra,
                "limit_bytes": limits[which],
                "met": None if extra is None else extra < limits[which],
            }
        )
    return report_lines


def _roofs(arguments, threads):
    """({name: Roof}, {name: why not}); empty where not asked for or unavailable (said)."""
    if not arguments.roof:
        return {}, {}
    try:
        return roof.measure(threads)
    except roof.RoofUnavailable as error:
        print(f"bench: no roofs: {error}", file=sys.stderr)
        return {}, {}


def _add_roofs(rows, roofs):
    """Each result's roof (the roofline's bound) and the fraction of it the result reached."""
    for row in rows:
        case = grids.Case(**row["config"])
        bound = roof.bound(case, row["pass"], roofs)
        if bound is None:
            continue
        name, attainable = bound
        for result in row["results"].values():
            if result.get("gflops") is not None:
                result["roof"] = name
                result["roof_gflops"] = attainable
                result["roof_fraction"] = result["gflops"] / attainable


def main(argv=None):
    """Run the benchmark; returns the process exit status (0, or 2 for bad arguments or a
    backend that cannot run here)."""
    started = time.perf_counter()
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
    overrides = _overrides(arguments)
    _apply_defaults(arguments, mfa.backend)
    if min(arguments.repeats, arguments.dispatches, arguments.warmups) < 1:
        print("bench: --repeats, --warmups and --dispatches must be >= 1", file=sys.stderr)
        return 2
    if "mfa" not in arguments.peers:
        print("bench: mfa must be among --peers", file=sys.stderr)
        return 2
    if arguments.roof and mfa.backend != "cpu":
        print(f"bench: the roofs are the CPU's; none for --backend {mfa.backend}", file=sys.stderr)
        arguments.roof = False
    try:
        plan = []
        studies = [name for name in dict.fromkeys(arguments.grid) if name in features.STUDIES]
        for name in dict.fromkeys(arguments.grid):
            if name in features.STUDIES:
                continue
            grid = grids.GRIDS[name]
            selected = grids.cases(grid, _axis_defaults(arguments), overrides, arguments.quick)
            settings = timing.Settings(
                passes=tuple(arguments.passes or grid.passes),
                repeats=arguments.repeats,
                dispatches=arguments.dispatches,
                warmups=arguments.warmups,
                memory=arguments.memory,
            )
            plan.append((name, selected, settings))
    except ValueError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    threads = arguments.threads or cpu_count()
    others = [name for name in dict.fromkeys(arguments.peers) if name != "mfa"]
    peers = [mfa] + make_peers(others, mfa.backend, threads, naive_max_seq=arguments.naive_max_seq)
    if arguments.build:
        try:
            peers.append(BuildPeer(arguments.build, mfa.backend, threads))
        except (ValueError, RuntimeError) as error:
            print(f"bench: {error}", file=sys.stderr)
            return 2
    model = report.cpu_model()
    print(
        f"{mfa.label} on {mfa.context.device_name}; {model or 'CPU model unknown'} "
        f"({platform.machine()}, {cpu_count()} usable cores); "
        f"peers: {', '.join(peer.label for peer in peers[1:]) or 'none'}"
    )
    settles = ", ".join(
        f"{p.name} {p.settle_seconds * 1e3:.0f} ms" for p in peers if p.settle_seconds
    )
    print(
        f"timing: {arguments.warmups} warm-up call(s), then {arguments.repeats} interleaved "
        f"rounds of {arguments.dispatches} call(s) per peer, the order rotating each round; "
        "medians; x peer = median over the rounds of the peer's time / mfa's; every trial "
        "is followed by the same pause, the longest that a peer's threads spin on after a "
        f"call ({settles or 'none here'})"
    )
    torch_peer = any(peer.name == "torch" for peer in peers)
    print(
        f"process settings: {threads} threads for mfa"
        + (f" and torch (torch.set_num_threads({threads}))" if torch_peer else "")
        + "; numpy's BLAS at its own default; no allocator tuning, no thread pinning"
    )
    sys.stdout.flush()
    roofs_before, missing = _roofs(arguments, threads)

    total = sum(timing.planned_work(selected, peers, settings) for _, selected, settings in plan)
    progress = report.Progress(total)
    rows = []
    try:
        for name, selected, settings in plan:
            rows += timing.run(selected, peers, settings, progress, grid=name)
    finally:
        progress.close()
    study_rows = []
    if studies:
        torch_module = next((peer.torch for peer in peers if peer.name == "torch"), None)
        single = mfa_native.Context(mfa.backend, num_threads=1)
        setup = features.Setup(
            context=mfa.context,
            single_thread=single,
            torch=torch_module,
            roofs=roofs_before,
            repeats=arguments.repeats,
            warmups=arguments.warmups,
            quick=arguments.quick,
            flex=arguments.flex,
            dispatches=arguments.dispatches,
        )
        study_rows = features.run(studies, setup)
        single.close()
    roofs = roof.combine(roofs_before, _roofs(arguments, threads)[0] if roofs_before else {})
    for line in report.roof_lines(roofs, missing, threads):
        print(line)
    _add_roofs(rows, roofs)
    # A peer that ran no row (the naive one under --quick) gets a line instead of its columns.
    shown = []
    for peer in peers:
        entries = [row["results"][peer.name] for row in rows]
        if peer is mfa or any("skipped" not in entry for entry in entries):
            shown.append(peer.name)
        elif entries:
            print(f"{peer.name} ran no row: {entries[0]['skipped']}")
    if rows:
        print(report.table(rows, shown, tera=mfa.backend == "metal"))
    for line in features.table(study_rows):
        print(line)
    for row in rows:
        for name, result in row["results"].items():
            if "error" in result:
                print(f"{name} failed on {row['config_label']} {row['pass']}: {result['error']}")

    memory = _memory_targets(mfa) if arguments.memory_check else []
    for check in memory:
        extra = check["peak_extra_bytes"]
        verdict = "n/a" if extra is None else ("met" if check["met"] else "NOT met")
        shown = "n/a" if extra is None else f"{extra / 2**20:.1f}"
        print(
            f"memory target, {check['config_label']} {check['pass']}: {shown} MiB extra "
            f"(limit {check['limit_bytes'] / 2**20:.0f} MiB): {verdict}"
        )
    print(f"bench: {time.perf_counter() - started:.0f} s")

    if arguments.json:
        document = {
            "mfa_version": mfa_native.__version__,
            "backend": mfa.backend,
            "device": mfa.context.device_name,
            "cpu_model": model,
            "machine": platform.machine(),
            "usable_cores": cpu_count(),
            "threads": threads,
            "peers": {peer.name: peer.label for peer in peers},
            "grids": [name for name, _, _ in plan],
            "repeats": arguments.repeats,
            "warmups": arguments.warmups,
            "dispatches": arguments.dispatches,
            "timing": "interleaved rounds, order rotating; ms: median trial; speedup_of_mfa: "
            "median of per-round ratios",
            "process_settings": {
                "torch_num_threads": threads if torch_peer else None,
                "allocator_tuning": None,
                "thread_pinning": None,
                "free_memory_returned_before_memory_calls": True,
            },
            "roofs": {name: r.as_dict() for name, r in roofs.items()},
            "roofs_missing": missing,
            "rows": rows,
            "studies": study_rows,
            "memory_targets": memory,
        }
        with open(arguments.json, "w") as stream:
            json.dump(document, stream, indent=1)
        print(f"wrote {arguments.json}")
    if arguments.plot and report.plot(rows, arguments.plot):
        print(f"wrote {arguments.plot}")
    return 0
