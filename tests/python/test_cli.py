"""``python -m mfa_native``: info, demo and the bench delegation."""

import json
import re
import subprocess
import sys
import types

import mfa_native
import numpy as np
import pytest
from mfa_native.__main__ import main


def _run(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "mfa_native", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_info_prints_version_and_backends():
    result = _run("info")
    assert result.returncode == 0, result.stderr
    assert re.search(rf"^version\s+{re.escape(mfa_native.__version__)}$", result.stdout, re.M)
    assert re.search(
        rf"^backends\s+{', '.join(mfa_native.available_backends())}$", result.stdout, re.M
    )


def test_info_json_is_info():
    result = _run("info", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == mfa_native.info()


@pytest.mark.parametrize("backend", mfa_native.available_backends())
@pytest.mark.parametrize("options", [[], ["--causal"]])
def test_demo_small_passes_and_reports_time_memory_and_errors(backend, options):
    result = _run("demo", "--size", "small", "--backend", backend, *options)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "B=1 H=2 N=128 D=32 float32" in result.stdout
    assert f"backend {backend} (" in result.stdout
    for label in ("mfa forward", "naive forward", "mfa backward", "naive backward"):
        assert re.search(
            rf"^{label}\s+\d+\.\d+s\s+[\d.]+ MiB\s+([\d.]+ MiB|n/a)$", result.stdout, re.M
        ), label
    errors = re.findall(r"^max abs error (\w+)\s+(\S+)\s+\(tolerance (\S+)\)$", result.stdout, re.M)
    assert [name for name, _, _ in errors] == ["out", "lse", "dq", "dk", "dv"]
    assert all(float(error) <= float(bound) for _, error, bound in errors)


def test_demo_defaults_to_the_best_real_backend_never_the_simulator():
    result = _run("demo", "--size", "small")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = "metal" if "metal" in mfa_native.available_backends() else "cpu"
    assert f"backend {expected} (" in result.stdout


def test_demo_fails_when_results_are_out_of_tolerance(monkeypatch, capsys):
    exact = mfa_native.attention

    def off_by_a_little(*args, return_lse=False, **kwargs):
        out, lse = exact(*args, return_lse=True, **kwargs)
        out += np.float32(1e-2)
        return (out, lse) if return_lse else out

    monkeypatch.setattr(mfa_native, "attention", off_by_a_little)
    assert main(["demo", "--size", "small", "--backend", "cpu"]) == 1
    printed = capsys.readouterr().out
    assert re.search(r"^max abs error out .*FAILED$", printed, re.M)


def test_demo_rejects_unknown_backends():
    result = _run("demo", "--backend", "gpu")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_a_command_is_required():
    result = _run()
    assert result.returncode == 2 and "usage" in result.stderr


def test_bench_arguments_go_to_bench_main(monkeypatch):
    received = []
    fake = types.ModuleType("mfa_native.bench")
    fake.main = lambda argv: received.append(argv) or 7
    monkeypatch.setitem(sys.modules, "mfa_native.bench", fake)
    monkeypatch.setattr(mfa_native, "bench", fake, raising=False)
    assert main(["bench", "--size", "3", "--help"]) == 7
    assert received == [["--size", "3", "--help"]]


def test_bench_help_reaches_the_real_benchmark():
    result = _run("bench", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m mfa_native bench")


def test_missing_bench_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.delattr(mfa_native, "bench", raising=False)
    monkeypatch.setitem(sys.modules, "mfa_native.bench", None)  # makes the import fail
    assert main(["bench"]) == 2
    assert "benchmark module is not available" in capsys.readouterr().err


def test_importing_the_package_does_not_import_bench():
    result = subprocess.run(
        [sys.executable, "-c", "import sys, mfa_native; print('mfa_native.bench' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
