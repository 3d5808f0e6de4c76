"""The benchmark, ``python -m mfa_native bench``: it runs end to end at tiny sizes, counts work
as MFA does, times every peer the same way and reports each peer's failures without stopping.
No test asserts on a time. (Grids and the naive peer: test_bench_cases.py; interleaving, ratios
and memory: test_bench_timing.py; the roof probes: test_bench_roof.py.)"""

import io
import json
import shutil
import subprocess
import sys
import types

import _backends
import mfa_native
import numpy as np
import pytest
import reference
from _errors import raises
from mfa_native import MFAError, bench
from mfa_native._library import library_path
from mfa_native.bench import cli, peers, report, timing
from mfa_native.bench.cases import GRIDS, Case, cases

_BACKENDS = [name for name in ("cpu", "metal-sim") if name in mfa_native.available_backends()]


def _run_bench(tmp_path, *arguments):
    path = tmp_path / "out.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mfa_native",
            "bench",
            "--seq",
            "64",
            "--head-dims",
            "8",
            "--window",
            "16,0",
            "--repeats",
            "1",
            "--no-roof",
            "--no-memory-check",
            "--peers",
            "mfa",
            "numpy",
            "--dtypes",
            "f32",
            "--json",
            str(path),
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, json.loads(path.read_text())


@pytest.mark.parametrize("backend", _BACKENDS)
def test_runs_end_to_end_and_agrees_with_numpy(tmp_path, backend):
    stdout, document = _run_bench(tmp_path, "--backend", backend)
    assert document["backend"] == backend
    assert [(row["config_label"], row["pass"]) for row in document["rows"]] == [
        (f"f32 B1 H8 N64 D8 {mask}", which)
        for mask in ("full", "causal", "full window16,0")
        for which in ("fwd", "fwd+bwd")
    ]
    for row in document["rows"]:
        mfa, numpy = row["results"]["mfa"], row["results"]["numpy"]
        assert mfa["ms"] > 0 and mfa["gflops"] > 0 and mfa["ginstrs"] > 0
        assert mfa["gpu_ms"] is None  # recorded by the metal backend only
        assert mfa["threads_busy"] > 0  # the calls' CPU time over their wall time
        assert numpy["max_relative_difference_to_mfa"] < 1e-4 and not numpy["disagrees"]
        assert numpy["speedup_of_mfa"] > 0
    assert "GINSTRS" in stdout and "busy" in stdout and "GPU ms" not in stdout
    assert " !" not in stdout
    assert document["roofs"] == {} and "roof" not in document["rows"][0]["results"]["mfa"]


def test_another_build_is_timed_beside_mfa_through_its_c_abi(tmp_path):
    # A copy of this libmfa is a library of its own to the loader, as a baseline build is.
    copy = tmp_path / f"baseline-{library_path.name}"
    shutil.copyfile(library_path, copy)
    stdout, document = _run_bench(tmp_path, "--build", str(copy), "--dtypes", "bf16", "--no-memory")
    assert f"build {copy} (libmfa {mfa_native.__version__})" in stdout
    assert "build ms" in stdout and "x build" in stdout
    assert len(document["rows"]) == 6
    for row in document["rows"]:
        build = row["results"]["build"]
        # The same kernels on the same arrays: the same results, bit for bit.
        assert build["max_relative_difference_to_mfa"] == 0.0 and not build["disagrees"]
        assert build["ms"] > 0 and build["speedup_of_mfa"] > 0


def test_the_build_peer_matches_the_float64_reference(tmp_path):
    copy = tmp_path / f"baseline-{library_path.name}"
    shutil.copyfile(library_path, copy)
    peer = peers.BuildPeer(str(copy), "cpu", 2)
    case = Case(1, 4, 96, 32, "bf16", causal=True, window=(40, 0), kv_heads=2)
    q, k, v, dout = peers.inputs(case)
    runners = peer.prepare(case, q, k, v, dout)
    # The same problem as the test suite states it: top-left, as the peers call mfa.
    expected = _backends.Case(
        96, 96, 32, 32, query_heads=4, kv_heads=2, causal=True, window=(40, 0),
        causal_alignment="top_left", dtype="bf16",
    )  # fmt: skip
    out = runners["fwd"]()
    want, _ = reference.attention_forward(q, k, v, **expected.options)
    magnitude, scores = reference.forward_magnitudes(q, k, v, **expected.options)
    allowed = _backends.allowed_error("bf16", want, magnitude, 32 + 96, np.max(scores))
    _backends.assert_close("out", out.astype(np.float64), want, allowed)
    _backends.check_backward(expected, runners["fwd+bwd"](), dout, q, k, v, out)


def test_a_build_that_cannot_be_loaded_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "libmfa-missing.so"
    assert bench.main(["--build", str(missing), "--no-roof", "--no-memory-check"]) == 2
    assert f"bench: --build {missing}: " in capsys.readouterr().err


def test_decode_runs_forward_only_against_the_bandwidth_roof(tmp_path):
    stdout, document = _run_bench(
        tmp_path,
        "--grid",
        "decode",
        "--seq-q",
        "1",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--batch",
        "1",
        "--window",
        "--roof",
    )
    assert set(document["roofs"]) >= {"fma_f32", "read"}
    assert all(document["roofs"][name]["rate"] > 0 for name in document["roofs"])
    [row] = document["rows"]
    assert (row["config_label"], row["pass"], row["grid"]) == (
        "f32 B1 H4/2 Nq1 Nk64 D8 full",
        "fwd",
        "decode",
    )
    mfa, numpy = row["results"]["mfa"], row["results"]["numpy"]
    assert mfa["roof"] == numpy["roof"] == "read" and 0 < mfa["roof_fraction"]
    assert not numpy["disagrees"]  # the naive peer's grouped heads agree with mfa's
    assert "fp32 FMA" in stdout and "read bandwidth" in stdout and "% roof" in stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seq", "0"], "sizes must be >= 1: seq 0"),
        (["--heads", "8", "--kv-heads", "3"], "kv_heads 3 does not divide heads 8"),
        (["--repeats", "0"], "--repeats, --warmups and --dispatches must be >= 1"),
    ],
)
def test_bad_sizes_are_a_clear_error_before_anything_runs(capsys, argv, message):
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_backend_that_cannot_run_here_is_a_clear_error(capsys):
    if "metal" in mfa_native.available_backends():
        pytest.skip("metal runs here")
    assert bench.main(["--backend", "metal"]) == 2
    assert "bench: backend metal cannot run here" in capsys.readouterr().err


# ---- Counting work --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "causal, window, pairs",
    [
        (False, None, 16),  # N^2
        (True, None, 10),  # 1 + 2 + 3 + 4
        (False, (1, 0), 7),  # 1 + 2 + 2 + 2
        (False, (1, 1), 10),  # 2 + 3 + 3 + 2
        (True, (2, -1), 9),  # 1 + 2 + 3 + 3: a negative side is unbounded
    ],
)
def test_visible_pairs_are_counted_exactly(causal, window, pairs):
    assert Case(2, 3, 4, 8, "f32", causal, window).visible_pairs() == pairs


def test_flops_and_instructions_follow_the_documented_formulas():
    config = Case(2, 3, 4, 8, "f32", False)  # B*H = 6 heads of 16 pairs, D = 8
    assert config.flops("fwd") == 4 * 6 * 16 * 8 == 3072
    assert config.flops("fwd+bwd") == 3.5 * 3072
    # MFA: forward (2D+5) = 21, dQ (3D+5) = 29, dK and dV (4D+5) = 37 per pair and head.
    assert config.instructions("fwd") == 6 * 16 * 21 == 2016
    assert config.instructions("fwd+bwd") == 6 * 16 * (21 + 29 + 37) == 8352
    causal = Case(1, 1, 4, 8, "f32", True)
    assert causal.instructions("fwd") == 10 * 21


# ---- Defaults per backend -------------------------------------------------------------------


def _defaults(backend, *argv):
    arguments = cli._parser().parse_args(list(argv))
    cli._apply_defaults(arguments, backend)
    return arguments


def _readme_cases(backend, *argv):
    arguments = cli._parser().parse_args(list(argv))
    overrides = cli._overrides(arguments)
    cli._apply_defaults(arguments, backend)
    return arguments, cases(
        GRIDS["readme"], cli._axis_defaults(arguments), overrides, arguments.quick
    )


def test_metal_defaults_reach_the_issue_sizes_with_mfa_dispatches():
    arguments = _defaults("metal")
    assert max(arguments.seq) == 16384 and max(arguments.head_dims) == 256
    assert arguments.dispatches == 5 and arguments.repeats == 5
    assert arguments.peers == ["mfa", "mlx", "torch", "numpy"]
    assert not arguments.roof and not arguments.memory_check


def test_metal_sim_defaults_are_a_smoke_test():
    arguments = _defaults("metal-sim")
    assert max(arguments.seq) <= 256 and max(arguments.head_dims) <= 64
    assert arguments.repeats == 1 and arguments.dispatches == 1
    assert all(window[0] < max(arguments.seq) for window in arguments.window)


def test_quick_trims_and_explicit_options_win():
    quick, selected = _readme_cases("cpu", "--quick")
    assert {(case.seq, case.dim) for case in selected} == {(1024, 64)}
    # --quick keeps the full run's repeats: its medians are of as many rounds.
    assert quick.repeats == 5 and not quick.memory_check
    given, selected = _readme_cases(
        "metal", "--quick", "--seq", "32", "--repeats", "7", "--window", "--no-roof"
    )
    assert (given.repeats, given.window, given.roof) == (7, [], False)
    assert {case.seq for case in selected} == {32} and {case.dim for case in selected} == {64}
    assert all(case.window is None for case in selected) and given.dispatches == 5


# ---- Peers ----------------------------------------------------------------------------------


class _FakePeer(peers.Peer):
    """Returns a fixed result; optionally records GPU time, raises (when run or when prepared)
    or skips."""

    def __init__(self, name, result=None, gpu_step=None, error=None, skip=None, prepare_error=None):
        self.name, self.result, self.error, self.skip = name, result, error, skip
        self.prepare_error = prepare_error
        self.gpu_step = gpu_step
        self.gpu_total = None if gpu_step is None else 0.0
        self.calls = 0

    def skip_reason(self, config):
        return self.skip

    def gpu_seconds(self):
        return self.gpu_total

    def prepare(self, config, q, k, v, dout):
        if self.prepare_error is not None:
            raise self.prepare_error

        def run():
            self.calls += 1
            if self.error is not None:
                raise self.error
            if self.gpu_step is not None:
                self.gpu_total += self.gpu_step
            return self.result

        return {"fwd": run, "fwd+bwd": run}


def _arguments(**overrides):
    values = dict(passes=("fwd",), repeats=2, dispatches=3, memory=False)
    values.update(overrides)
    return timing.Settings(**values)


def _run(configs, peers, arguments):
    return timing.run(configs, peers, arguments, report.Progress(1, io.StringIO()))


def test_every_peer_is_timed_alike_and_checked_against_the_first():
    config = Case(1, 2, 16, 8, "f32", False)
    out = np.linspace(1, 2, 10)
    reference = _FakePeer("mfa", out, gpu_step=0.002)
    close = _FakePeer("close", out * (1 + 1e-6))
    far = _FakePeer("far", out + 0.1)
    broken = _FakePeer("broken", error=RuntimeError("out of memory"))
    absent = _FakePeer("absent", skip="no sliding window")
    unprepared = _FakePeer("unprepared", prepare_error=MemoryError("no room"))
    [row] = _run([config], [reference, close, far, broken, absent, unprepared], _arguments())

    # One warm-up call, then 2 trials of 3 dispatches; the GPU time is per call.
    assert reference.calls == close.calls == far.calls == 1 + 2 * 3
    results = row["results"]
    assert results["mfa"]["gpu_ms"] == pytest.approx(2.0)
    assert results["mfa"]["gpu_ginstrs"] == pytest.approx(config.instructions("fwd") / 2e-3 / 1e9)
    assert results["close"]["gpu_ms"] is None and not results["close"]["disagrees"]
    assert results["far"]["disagrees"]
    assert results["far"]["max_relative_difference_to_mfa"] == pytest.approx(0.05)
    assert results["broken"] == {"error": "RuntimeError: out of memory"}
    assert results["absent"] == {"skipped": "no sliding window"}
    assert results["unprepared"] == {"error": "MemoryError: no room"}
    assert results["far"]["speedup_of_mfa"] > 0 and "speedup_of_mfa" not in results["broken"]

    table = report.table([row], ["mfa", "close", "far", "broken", "absent"], tera=True)
    header, line = table.splitlines()
    assert header.split()[2:7] == ["mfa", "ms", "GPU", "ms", "GPU"]
    assert "GPU TFLOPS" in header and "GPU GINSTRS" in header and "MiB" not in header
    cells = line.split("  ")
    assert any(cell.strip().endswith(" !") for cell in cells)
    assert "err" in cells and "n/a" in cells


def test_errors_of_mfa_itself_stop_the_run(monkeypatch):
    def failing(*args, **kwargs):
        raise MFAError(1, "broken on purpose")

    peer = peers.MfaPeer("cpu", 1)
    monkeypatch.setattr(mfa_native, "attention", failing)
    with raises(MFAError, "broken on purpose", status="INVALID_ARGUMENT"):
        _run([Case(1, 1, 8, 8, "f32", False)], [peer], _arguments(repeats=1))


def test_mfa_gpu_time_adds_forward_and_backward(monkeypatch):
    # A cpu context that says it is metal and reports 0.25 s of GPU time per call.
    monkeypatch.setattr(mfa_native.Context, "backend", property(lambda self: "metal"))
    monkeypatch.setattr(mfa_native.Context, "last_gpu_time", lambda self: 0.25)
    peer = peers.MfaPeer("cpu", 1)
    functions = peer.prepare(
        Case(1, 1, 8, 8, "f32", False),
        *peers.inputs(Case(1, 1, 8, 8, "f32", False)),
    )
    assert peer.gpu_seconds() == 0.0
    functions["fwd"]()
    assert peer.gpu_seconds() == 0.25
    functions["fwd+bwd"]()
    assert peer.gpu_seconds() == 0.75


@pytest.mark.parametrize("backend", _BACKENDS)
def test_mfa_records_no_gpu_time_off_metal(backend):
    assert peers.MfaPeer(backend, 1).gpu_seconds() is None
    with mfa_native.Context(backend) as context:
        with raises(MFAError, status="UNSUPPORTED"):
            context.last_gpu_time()


def test_last_gpu_time_of_a_closed_context_raises():
    context = mfa_native.Context("cpu")
    context.close()
    with raises(ValueError, "the Context is closed"):
        context.last_gpu_time()


def _fake_torch(mps_available):
    synchronize = types.SimpleNamespace(synchronize=lambda: None)
    return types.SimpleNamespace(
        __version__="0.fake",
        set_num_threads=lambda count: None,
        cpu=synchronize,
        mps=synchronize,
        backends=types.SimpleNamespace(
            mps=types.SimpleNamespace(is_available=lambda: mps_available)
        ),
    )


def _fake_mlx():
    return types.SimpleNamespace(
        __version__="0.fake",
        float32="f32",
        float16="f16",
        bfloat16="bf16",
        default_device=lambda: "gpu",
    )


@pytest.mark.parametrize(
    "backend, device", [("metal", "mps"), ("cpu", "cpu"), ("metal-sim", "cpu")]
)
def test_torch_runs_on_the_gpu_beside_metal_only(monkeypatch, backend, device):
    modules = {"torch": _fake_torch(True), "mlx.core": _fake_mlx()}
    monkeypatch.setattr(peers, "optional_module", modules.get)
    made = peers.make_peers(["mlx", "torch", "numpy"], backend, 1, naive_max_seq=64)
    assert [type(peer) for peer in made] == [peers.MlxPeer, peers.TorchPeer, peers.NumpyPeer]
    assert made[1].device == device
    assert made[1].label == f"torch 0.fake ({device})"


def test_peers_that_cannot_run_are_left_out(monkeypatch, capsys):
    monkeypatch.setattr(peers, "optional_module", {"torch": _fake_torch(False)}.get)
    assert peers.make_peers(["torch", "mlx"], "metal", 1, naive_max_seq=64) == []
    assert "cannot use the GPU (mps)" in capsys.readouterr().err


def test_a_missing_module_is_said_not_raised(capsys):
    assert peers.optional_module("mfa_native_no_such_module") is None
    assert "mfa_native_no_such_module is not available" in capsys.readouterr().err


def test_torch_on_mps_skips_scores_of_4_gib():
    peer = peers.TorchPeer(_fake_torch(True), "mps", 1)
    assert peer.skip_reason(Case(1, 8, 8192, 64, "f16", False)) is None
    assert "4 GiB" in peer.skip_reason(Case(1, 8, 16384, 64, "f16", False))
    assert (
        peers.TorchPeer(_fake_torch(True), "cpu", 1).skip_reason(
            Case(1, 8, 16384, 64, "f16", False)
        )
        is None
    )


def test_the_naive_peer_skips_what_it_cannot_hold():
    peer = peers.NumpyPeer(2048)
    assert "squared" in peer.skip_reason(Case(1, 8, 4096, 64, "f32", False))
    cache = dict(kv_heads=32, seq_k=32768)  # the decode grid's largest: 8 GiB of f32 k and v
    assert peer.skip_reason(Case(8, 32, 4, 128, "f32", **cache)) is None  # read in place
    assert "2 GiB" in peer.skip_reason(Case(8, 32, 4, 128, "bf16", **cache))
    assert peer.skip_reason(Case(1, 32, 4, 128, "bf16", **cache)) is None


@pytest.mark.parametrize(
    "module, make_peer",
    [
        ("mlx.core", lambda module: peers.MlxPeer(module)),
        ("torch", lambda module: peers.TorchPeer(module, "cpu", 1)),
    ],
)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_installed_peers_agree_with_mfa(module, make_peer, dtype):
    # Where MLX or torch is installed (on Linux: their CPU builds), their code paths run for real.
    peer = make_peer(pytest.importorskip(module))
    configs = [Case(1, 2, 32, 16, dtype, causal) for causal in (False, True)]
    rows = _run(
        configs,
        [peers.MfaPeer("cpu", 1), peer],
        _arguments(passes=["fwd", "fwd+bwd"], repeats=1, dispatches=1),
    )
    for row in rows:
        result = row["results"][peer.name]
        assert not result["disagrees"], (row["config_label"], row["pass"], result)


def test_the_docstring_table_shows_the_defaults():
    table = {}
    for line in bench.__doc__.splitlines():
        backend = line.split(" ", 1)[0]
        if backend in cli.DEFAULTS:
            # Columns: backend, N, D, dtypes, repeats, dispatches, peers (at fixed offsets).
            cells = [
                line[start:end].split()
                for start, end in ((10, 37), (37, 48), (48, 63), (63, 71), (71, 82), (82, None))
            ]
            table[backend] = cells
    assert set(table) == set(cli.DEFAULTS)
    for backend, defaults in cli.DEFAULTS.items():
        seq, dims, dtypes, repeats, dispatches, peer_names = table[backend]
        assert [int(n) for n in seq] == defaults["seq"]
        assert [int(d) for d in dims] == defaults["head_dims"]
        assert dtypes == defaults["dtypes"]
        assert (int(*repeats), int(*dispatches)) == (defaults["repeats"], defaults["dispatches"])
        assert ["mfa", *peer_names] == defaults["peers"]
