"""The benchmark's studies of features (``bench.features``): each runs at tiny sizes, its
variants that must agree do, every ratio is a paired median, and the command line runs them
beside the shape grids. No test asserts on a time."""

from types import SimpleNamespace

import mfa_native
import numpy as np
import pytest
from mfa_native.bench import cli, features

pytestmark = pytest.mark.skipif(
    "cpu" not in mfa_native.available_backends(), reason="the studies time the cpu backend"
)


def _setup(context, single, torch=None):
    # shrink 32: N 64, Nk 128 and 8 sequences of 8 to 64 tokens; the shapes' other sizes stay.
    return features.Setup(
        context=context,
        single_thread=single,
        torch=torch,
        roofs={},
        repeats=2,
        warmups=1,
        quick=True,
        flex=False,
        shrink=32,
    )


@pytest.fixture(scope="module")
def contexts():
    with mfa_native.Context("cpu", num_threads=2) as context:
        with mfa_native.Context("cpu", num_threads=1) as single:
            yield context, single


def test_interleave_rotates_and_ratios_are_paired():
    order = []
    functions = {name: (lambda name=name: order.append(name) or name) for name in "abc"}
    rounds = SimpleNamespace(repeats=3, warmups=1, dispatches=1)
    seconds, results = features.interleave(functions, rounds, keep=("b",))
    assert order == list("abc") + list("abc") + list("bca") + list("cab")
    assert results == {"b": "b"} and all(len(times) == 3 for times in seconds.values())
    # A trial of 2 dispatches is 2 calls in a row: a a b b, then b b a a.
    order.clear()
    rounds = SimpleNamespace(repeats=2, warmups=1, dispatches=2)
    seconds, _ = features.interleave({name: functions[name] for name in "ab"}, rounds)
    assert order == list("ab") + list("aabb") + list("bbaa")
    assert all(len(times) == 2 for times in seconds.values())
    paired = {"x": [2.0, 9.0, 4.0], "y": [1.0, 1.0, 4.0]}
    assert features.paired_ratio(paired, "x", "y") == 2.0  # median of 2, 9, 1


@pytest.mark.parametrize("name", list(features.STUDIES))
def test_every_study_runs_and_its_equal_variants_agree(contexts, name):
    rows = features.run([name], _setup(*contexts))
    assert rows and all(row["study"] == name for row in rows)
    for row in rows:
        assert all(ms > 0 for ms in row["ms"].values())
        for measure_name, measure in row["measures"].items():
            # An adapter's overhead over the numpy call may be below 0 (torch's tensors are
            # read faster than numpy's arrays); every other measure is a time, ratio or error.
            assert np.isfinite(measure["value"])
            assert measure["value"] >= 0 or measure_name.endswith("overhead us")
            if " = " in measure_name or "changes nothing" in measure_name:
                assert measure["met"], (row["label"], measure_name, measure["value"])
    lines = features.table(rows)
    assert lines[0].startswith(f"study {name}:") and any("target" in line for line in lines)


def test_the_block_mask_study_masks_documents():
    mask = features._documents_mask(16, 4)
    assert mask.sum() == 4 * 4 * 4 and mask[3, 3] and not mask[3, 4] and mask[15, 12]


def test_studies_run_beside_torch_where_it_is_installed(contexts):
    torch = pytest.importorskip("torch")
    rows = features.run(["modifiers", "block-mask", "varlen"], _setup(*contexts, torch))
    names = {name for row in rows for name in row["measures"]}
    assert {"x torch alibi (attn_mask)", "x torch documents", "x torch separate"} <= names


def test_the_command_line_names_the_studies():
    help_text = cli._parser().format_help()
    assert all(name in help_text for name in features.STUDIES)


def test_the_adapters_study_times_rounds_by_its_clock_and_restores_the_library():
    from mfa_native.bench import adapters

    order, ticks = [], iter(range(0, 10**6, 1000))
    functions = {name: (lambda name=name: order.append(name)) for name in "ab"}
    seconds = adapters.timed_rounds(functions, 2, 4, clock=lambda: next(ticks), warmups=1)
    # One warm-up trial of 4 calls each, then rounds a b and b a of 4 calls each, every trial
    # 1000 ns long on this clock: 250 ns a call.
    assert order == ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 8 + ["a"] * 4
    assert seconds == {"a": [pytest.approx(250e-9)] * 2, "b": [pytest.approx(250e-9)] * 2}
    assert adapters.paired_difference({"x": [3.0, 9.0, 5.0], "y": [1.0, 1.0, 4.0]}, "x", "y") == 2
    call = mfa_native.Context._call
    with pytest.raises(RuntimeError), adapters._kernels_skipped():
        assert mfa_native.Context._call is not call
        raise RuntimeError
    assert mfa_native.Context._call is call
