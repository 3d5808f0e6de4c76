"""Ring attention on MLX (mfa_native.mlx.ring_attention, defined in mfa_native.mlx_ring) over
mx.distributed's ring backend (TCP on 127.0.0.1) with 2 and 4 processes, against the float64
reference of the whole sequence.

One launch of a ring of 2 and a ring of 4, at the same time, runs every case of _ring_cases
(forward, then mx.vjp with a given output gradient) on MLX's CPU device; this file is the
processes' program too (python test_ring_mlx.py DIRECTORY, with MLX_RANK and MLX_HOSTFILE set
as mlx.launch sets them). Each rank saves its out, lse, dq, dk and dv; the tests put the ranks'
parts back together and judge them as test_ring.py judges torch's ring. The ports are ones the
system had free a moment before (a collision fails the launch, never gives a wrong result); a
hung ring fails after half of MFA_TEST_TIMEOUT."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _ring_cases import RING_CASES, case_id, case_inputs, check_ring_result, seq_axis

mx = pytest.importorskip("mlx.core")
if not mx.distributed.is_available():
    pytest.skip("this MLX has no mx.distributed backend", allow_module_level=True)

import mfa_native.mlx as mfa_mlx  # noqa: E402

RING_TIMEOUT = max(30, int(os.environ.get("MFA_TEST_TIMEOUT", "900")) // 2)
WORLDS = (2, 4)


def _split(array, rank, world, split, axis):
    if split == "zigzag":
        return mfa_mlx.zigzag_shard(array, rank, world, dim=axis)
    return mx.split(array, world, axis=axis)[rank]


def _join(parts, split, axis):
    if split == "zigzag":
        return mfa_mlx.zigzag_unshard(parts, dim=axis)
    return mx.concatenate(parts, axis=axis)


def _in_layout(array, layout):
    """[B, H, N, D] <-> [B, N, H, D] (its own inverse)."""
    return array if layout == "bhsd" else array.swapaxes(1, 2)


def _run_cases(group, ring_cases):
    """This rank's out, lse, dq, dk and dv (float32 numpy) of every case, forward and vjp, by
    "{case id}-{index}"."""
    rank, world = group.rank(), group.size()
    results = {}
    for ring_case in ring_cases:
        case, layout, split = ring_case
        name, axis = case_id(ring_case), seq_axis(layout)
        dtype = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[case.dtype]
        q, k, v, dout = (  # float32 holds the storage dtype's values: the casts are exact
            _split(
                _in_layout(mx.array(x.astype(np.float32)), layout), rank, world, split, axis
            ).astype(dtype)
            for x in case_inputs(case)
        )

        def ring(q, k, v, case=case, layout=layout):
            return mfa_mlx.ring_attention(
                q, k, v, causal=case.causal, scale=case.scale, layout=layout, return_lse=True,
                group=group,
            )  # fmt: skip

        lse_shape = (q.shape[0], q.shape[3 - axis], q.shape[axis])  # [B, Hq, N]
        (out, lse), gradients = mx.vjp(ring, [q, k, v], [dout, mx.zeros(lse_shape)])
        for index, array in enumerate((out, lse, *gradients)):
            results[f"{name}-{index}"] = np.array(array.astype(mx.float32))
    return results


def _run_rank(directory):
    """One rank (MLX_RANK and MLX_HOSTFILE from the launch): its parts of every case saved to
    world{W}-rank{r}.npz."""
    group = mx.distributed.init(strict=True, backend="ring")
    results = _run_cases(group, RING_CASES)
    np.savez(directory / f"world{group.size()}-rank{group.rank()}.npz", **results)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for listener in sockets:
        listener.bind(("127.0.0.1", 0))
    ports = [listener.getsockname()[1] for listener in sockets]
    for listener in sockets:
        listener.close()
    return ports


def _wait_for(processes):
    """Wait for every process; fail as soon as one fails (its neighbours would wait in a
    receipt for ever) or at the deadline."""
    deadline = time.monotonic() + RING_TIMEOUT
    while any(process.poll() is None for process in processes):
        failed = [process.returncode for process in processes if process.returncode]
        if failed:
            pytest.fail(f"an MLX ring process failed, status {failed[0]} (output above)")
        if time.monotonic() > deadline:
            pytest.fail(f"the MLX ring processes did not finish within {RING_TIMEOUT} s")
        time.sleep(0.02)
    assert [process.returncode for process in processes] == [0] * len(processes)


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory):
    """{(world, case id): (out, lse, dq, dk, dv)} of the whole sequence, [B, H, N, D] float64
    numpy, put together from the ranks of the ring of each size."""
    directory = tmp_path_factory.mktemp("mlx_ring")
    processes = []
    for world in WORLDS:
        hostfile = directory / f"hosts{world}.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in _free_ports(world)]))
        for rank in range(world):
            environment = {**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
            command = [sys.executable, __file__, str(directory)]
            processes.append(subprocess.Popen(command, env=environment))
    try:
        _wait_for(processes)
    finally:
        for process in processes:
            process.kill()
    results = {}
    for world in WORLDS:
        ranks = [np.load(directory / f"world{world}-rank{rank}.npz") for rank in range(world)]
        for ring_case in RING_CASES:
            _, layout, split = ring_case
            name, axis = case_id(ring_case), seq_axis(layout)
            out, lse, dq, dk, dv = (
                _join([mx.array(part[f"{name}-{index}"]) for part in ranks], split, dim)
                for index, dim in enumerate((axis, 2, axis, axis, axis))
            )  # lse is [B, H, N] whatever the layout
            out, dq, dk, dv = (np.array(_in_layout(x, layout)) for x in (out, dq, dk, dv))
            results[world, name] = (out, np.array(lse), dq, dk, dv)
    return results


@pytest.mark.parametrize("ring_case", RING_CASES, ids=case_id)
@pytest.mark.parametrize("world", WORLDS)
def test_mlx_ring_matches_one_process(ring_results, world, ring_case):
    check_ring_result(ring_case[0], world, *ring_results[world, case_id(ring_case)])


def test_mlx_ring_of_one_process_is_attention():
    """A process launched without a ring is a group of one (mx.distributed.init's singleton):
    the ring is one step, its own block, forward and backward."""
    ring_case = RING_CASES[0]
    results = _run_cases(mx.distributed.init(), [ring_case])
    out, lse, dq, dk, dv = (results[f"{case_id(ring_case)}-{index}"] for index in range(5))
    check_ring_result(ring_case[0], 1, out, lse, dq, dk, dv)


def test_mlx_ring_refuses_what_the_ring_cannot_take():
    """Each before the ring starts."""
    q = mx.zeros((1, 2, 6, 4))
    odd = q[:, :, :5]
    refused = [
        ((odd, odd, odd), {"causal": True}, ValueError, "local sequence length must be even"),
        ((q, q[:, :, :4], q[:, :, :4]), {}, ValueError, "k must hold the keys of q's positions"),
        ((q, q, q.astype(mx.bfloat16)), {}, TypeError, "one dtype"),
        ((np.zeros(q.shape), q, q), {}, TypeError, "q must be an mx.array"),
        ((q, q, q), {"group": "world"}, TypeError, "group must be an mx.distributed.Group"),
        ((q, q, q), {"layout": "bhds"}, ValueError, "layout must be 'bhsd' or 'bshd'"),
    ]
    for arrays, options, error, message in refused:
        with pytest.raises(error, match=message):
            mfa_mlx.ring_attention(*arrays, **options)


if __name__ == "__main__":
    _run_rank(Path(sys.argv[1]))
