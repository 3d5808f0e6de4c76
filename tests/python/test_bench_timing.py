"""How the benchmark times (mfa_native.bench.timing): interleaved rounds, paired ratios, the
memory measurement, the SDPA backend torch ran, and the progress line. No test asserts on a
time."""

import ctypes
import gc
import io
import re
import sys
import time

import numpy as np
import pytest
from mfa_native import _measure
from mfa_native.bench import peers, report, timing
from mfa_native.bench.cases import Case

_CASE = Case(1, 2, 16, 8, "f32", False)


class _LoggingPeer(peers.Peer):
    """Appends its name to a shared log at every call; returns a fixed output."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def prepare(self, case, q, k, v, dout):
        def run():
            self.log.append(self.name)
            return np.ones(4, np.float32)

        return {"fwd": run, "fwd+bwd": run}


def _settings(**values):
    return timing.Settings(**{"passes": ("fwd",), "memory": False, **values})


def test_rounds_interleave_the_peers_in_a_rotating_order():
    log = []
    trio = [_LoggingPeer(name, log) for name in ("mfa", "b", "c")]
    timing.run([_CASE], trio, _settings(repeats=4, warmups=2), report.Progress(1, io.StringIO()))
    warmups, rounds = log[:6], log[6:]
    assert warmups == ["mfa", "mfa", "b", "b", "c", "c"]
    assert rounds == ["mfa", "b", "c", "b", "c", "mfa", "c", "mfa", "b", "mfa", "b", "c"]


def test_the_ratio_is_the_median_of_the_rounds_ratios(monkeypatch):
    # Scripted trial times: mfa 1, 2, 3 s; the peer 1.5, 1, 6 s. Per round the peer takes 1.5,
    # 0.5 and 2 times mfa's time: the median ratio is 1.5, while the ratio of the medians
    # (2 / 2 = 1) would hide that the peer was slower in two rounds out of three.
    times = {"mfa": iter([1.0, 2.0, 3.0]), "b": iter([1.5, 1.0, 6.0])}
    monkeypatch.setattr(timing, "_trial", lambda peer, function, n: (next(times[peer.name]), None))
    log = []
    pair = [_LoggingPeer("mfa", log), _LoggingPeer("b", log)]
    [row] = timing.run([_CASE], pair, _settings(repeats=3), report.Progress(1, io.StringIO()))
    result = row["results"]["b"]
    assert result["ms"] == pytest.approx(1.5e3) and row["results"]["mfa"]["ms"] == 2e3
    assert result["speedup_of_mfa"] == pytest.approx(1.5)
    assert result["speedup_range"] == pytest.approx([0.5, 2.0])


def test_a_peer_failing_in_a_round_is_reported_and_the_others_go_on():
    log = []

    class Flaky(_LoggingPeer):
        def prepare(self, case, q, k, v, dout):
            def run():
                log.append(self.name)
                if log.count(self.name) == 3:  # warm-up and round 1 pass, round 2 fails
                    raise RuntimeError("device lost")
                return np.ones(4, np.float32)

            return {"fwd": run}

    pair = [_LoggingPeer("mfa", log), Flaky("flaky", log)]
    [row] = timing.run([_CASE], pair, _settings(repeats=3), report.Progress(1, io.StringIO()))
    assert row["results"]["flaky"] == {"error": "RuntimeError: device lost"}
    assert log.count("mfa") == 4 and log.count("flaky") == 3
    assert row["results"]["mfa"]["ms"] > 0


def _glibc():
    try:
        return bool(ctypes.CDLL(None).gnu_get_libc_version)
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc(), reason="glibc only")
def test_memory_the_allocator_kept_does_not_hide_a_peak():
    # glibc raises its mmap threshold when a large mmapped block is freed; later blocks below
    # it come from the heap, and a freed heap block stays resident. A call that allocates such
    # a block again then raises the resident set by nothing: its peak hides. The benchmark used
    # to pin the threshold for the whole process instead (mallopt), which slowed torch.
    size = 8 * 2**20
    del_me = np.ones(2 * size // 8)  # 16 MiB, mmapped; freeing it raises the threshold
    del del_me
    kept = np.ones(size // 8)  # now from the heap
    del kept

    def call():
        block = np.empty(size // 8)
        block.fill(1.0)  # touches every page

    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    baseline = _measure._status_kib("VmRSS") * 1024
    call()
    hidden = _measure.resident_rise(baseline)
    if hidden > size // 2:
        pytest.skip("the allocator returned the block by itself; nothing to hide here")
    baseline = _measure.reset_resident_peak()
    call()
    assert _measure.resident_rise(baseline) >= 0.9 * size


def test_sdpa_kernel_names():
    flash = ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    assert peers.torch_sdpa_kernel(flash) == "flash"
    assert peers.torch_sdpa_kernel(flash + [flash[0] + "_backward"]) == "flash"
    assert peers.torch_sdpa_kernel(["aten::bmm", "aten::_safe_softmax", "aten::bmm"]) == "math"
    mixed = ["aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_x.out"]
    assert peers.torch_sdpa_kernel(mixed) == "efficient+_scaled_dot_product_x"
    assert peers.torch_sdpa_kernel(["aten::add.Tensor"]) == "unknown"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_torch_kernel_reported_is_the_one_torch_chose(dtype):
    torch = pytest.importorskip("torch")
    peer = peers.TorchPeer(torch, "cpu", 1)
    case = Case(1, 4, 32, 16, dtype, True, kv_heads=2, seq_k=32)
    functions = peer.prepare(case, *peers.inputs(case))
    q, k, v = (torch.zeros(1, h, 32, 16, dtype=torch.float32) for h in (4, 2, 2))
    # torch's own choice function (0: math, 1: flash), an independent view of the same decision.
    chosen = {0: "math", 1: "flash"}[
        torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True)
    ]
    for which in ("fwd", "fwd+bwd"):
        assert peer.observe(functions[which])[1] == chosen
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        assert peer.observe(functions["fwd"])[1] == "math"


def _elapsed(text):
    return [float(seconds) for seconds in re.findall(r"%\s+([0-9.]+)s", text)]


def test_a_live_progress_line_keeps_moving_during_a_long_call():
    stream = io.StringIO()
    progress = report.Progress(10, stream, live=True)
    progress.step("a long call", 1)
    time.sleep(1.2)  # the call: no step, yet the line is redrawn with the clock running
    progress.close()
    redraws = stream.getvalue().split("\r")[1:]
    assert len(redraws) >= 3 and all("a long call" in line for line in redraws)
    elapsed = _elapsed(stream.getvalue())
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]


def test_a_logged_progress_line_reports_each_finished_case():
    stream = io.StringIO()
    progress = report.Progress(4, stream, live=False)
    for index in range(4):
        progress.step(f"call {index}", 1)
        if index % 2:
            progress.finished(f"case {index // 2}")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert [line.split()[-2:] for line in lines] == [["case", "0"], ["case", "1"]]
    assert " 50% " in lines[0] and "100% " in lines[1]
