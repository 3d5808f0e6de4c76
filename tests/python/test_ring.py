"""Ring attention (mfa_native.torch.ring_attention) on 2 and 4 processes over gloo, against the
float64 reference of the whole sequence in one process.

One spawn of 4 processes runs every case (forward, then backward with a given output gradient)
on a ring of the 4 and on two rings of 2 (process groups of their own) and saves each rank's
out, lse, dq, dk and dv; the tests put the ranks' parts back
together (zigzag_unshard, or concatenation for the contiguous split) and compare them with
reference.attention_forward/attention_backward on the global q, k and v. A hung ring fails
after half of MFA_TEST_TIMEOUT (default 900 s) rather than stopping the suite."""

import datetime
import os
import time
from pathlib import Path

import pytest
from _ring_cases import RING_CASES, case_id, case_inputs, check_ring_result, seq_axis

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed has no gloo backend here", allow_module_level=True)

import mfa_native.torch as mfa_torch  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402
from _torch_support import to_numpy, to_torch  # noqa: E402

RING_TIMEOUT = max(30, int(os.environ.get("MFA_TEST_TIMEOUT", "900")) // 2)
WORLD = 4
# The rings, by the global ranks of their members in ring order: all four processes (the
# default group), and two rings of two run at the same time on groups of their own (group=),
# one of them of ranks other than its group ranks.
RINGS = {"world4": [0, 1, 2, 3], "ranks01": [0, 1], "ranks23": [2, 3]}


def _to_layout(tensor, layout):
    """[B, H, N, D] <-> [B, N, H, D] (its own inverse)."""
    return tensor if layout == "bhsd" else tensor.transpose(1, 2)


def _shard(tensor, rank, world, split, dim):
    if split == "zigzag":
        return mfa_torch.zigzag_shard(tensor, rank, world, dim=dim)
    return tensor.chunk(world, dim=dim)[rank].clone()


def _unshard(parts, split, dim):
    if split == "zigzag":
        return mfa_torch.zigzag_unshard(parts, dim=dim)
    return torch.cat(parts, dim=dim)


def _run_rank(rank, directory):
    """One of the WORLD processes: every case on each ring it belongs to, forward and backward;
    its parts saved to rank{rank}.pt."""
    torch.set_num_threads(1)  # 4 ranks share the 2 cores of CI
    directory = Path(directory)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{directory / 'store'}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=RING_TIMEOUT),
    )
    try:
        # Every process creates every group, in the same order, as torch.distributed requires.
        groups = {
            name: None if len(members) == WORLD else dist.new_group(members)
            for name, members in RINGS.items()
        }
        inputs = torch.load(directory / "inputs.pt")
        results = {}
        for ring, members in RINGS.items():
            if rank not in members:
                continue
            position, size = members.index(rank), len(members)
            for ring_case in RING_CASES:
                case, layout, split = ring_case
                name = case_id(ring_case)
                axis = seq_axis(layout)
                q, k, v, dout = (_shard(x, position, size, split, axis) for x in inputs[name])
                for leaf in (q, k, v):
                    leaf.requires_grad_()
                out, lse = mfa_torch.ring_attention(
                    q,
                    k,
                    v,
                    causal=case.causal,
                    scale=case.scale,
                    layout=layout,
                    return_lse=True,
                    group=groups[ring],
                )
                out.backward(dout)
                results[ring, name] = (out.detach(), lse, q.grad, k.grad, v.grad)
        torch.save(results, directory / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory):
    """{(ring, case id): (out, lse, dq, dk, dv)} of the whole sequence, [B, H, N, D] as float64
    numpy, put together from the ring's ranks after one run of every case on every ring."""
    directory = tmp_path_factory.mktemp("ring")
    inputs = {}
    for ring_case in RING_CASES:
        case, layout, split = ring_case
        inputs[case_id(ring_case)] = [_to_layout(to_torch(x), layout) for x in case_inputs(case)]
    torch.save(inputs, directory / "inputs.pt")
    context = torch_mp.start_processes(
        _run_rank, args=(str(directory),), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + RING_TIMEOUT
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {WORLD} gloo processes did not finish within {RING_TIMEOUT} s")
    ranks = [torch.load(directory / f"rank{rank}.pt") for rank in range(WORLD)]
    results = {}
    for ring, members in RINGS.items():
        for ring_case in RING_CASES:
            _, layout, split = ring_case
            name = case_id(ring_case)
            axis = seq_axis(layout)
            parts = [ranks[member][ring, name] for member in members]
            out, lse, dq, dk, dv = (
                _unshard([part[index] for part in parts], split, axis if index != 1 else 2)
                for index in range(5)
            )  # lse is [B, H, N] whatever the layout
            out, dq, dk, dv = (to_numpy(_to_layout(x, layout)) for x in (out, dq, dk, dv))
            results[ring, name] = (out, to_numpy(lse), dq, dk, dv)
    return results


@pytest.mark.parametrize("ring_case", RING_CASES, ids=case_id)
@pytest.mark.parametrize("ring", RINGS)
def test_ring_matches_one_process(ring_results, ring, ring_case):
    case = ring_case[0]
    check_ring_result(case, len(RINGS[ring]), *ring_results[ring, case_id(ring_case)])


def test_zigzag_split_holds_chunks_r_and_2w_minus_1_minus_r():
    sequence = torch.arange(2 * 3 * 12).reshape(2, 3, 12)  # 12 positions along dim 2
    world = 3
    shards = [mfa_torch.zigzag_shard(sequence, rank, world) for rank in range(world)]
    # 6 chunks of 2 positions: rank 0 holds 0 and 5, rank 1 holds 1 and 4, rank 2 holds 2, 3.
    assert shards[0][0, 0].tolist() == [0, 1, 10, 11]
    assert shards[1][0, 0].tolist() == [2, 3, 8, 9]
    assert shards[2][0, 0].tolist() == [4, 5, 6, 7]
    for rank, shard in enumerate(shards):
        indices = mfa_torch.zigzag_indices(12, rank, world)
        assert torch.equal(shard, sequence.index_select(2, indices))
    assert torch.equal(mfa_torch.zigzag_unshard(shards), sequence)
    along_1 = [mfa_torch.zigzag_shard(sequence.transpose(1, 2), r, world, dim=1) for r in range(3)]
    assert torch.equal(mfa_torch.zigzag_unshard(along_1, dim=1), sequence.transpose(1, 2))


def test_zigzag_split_rejects_lengths_it_cannot_split():
    with pytest.raises(ValueError, match="multiple of 2 \\* world_size = 4"):
        mfa_torch.zigzag_shard(torch.zeros(1, 1, 6, 2), 0, 2)
    with pytest.raises(ValueError, match="rank must be in"):
        mfa_torch.zigzag_indices(8, 2, 2)
    with pytest.raises(ValueError, match="same even length"):
        mfa_torch.zigzag_unshard([torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 2, 2)])


def test_ring_attention_refuses_what_the_ring_cannot_take():
    q = torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match="local sequence length must be even"):
        mfa_torch.ring_attention(q[:, :, :5], q[:, :, :5], q[:, :, :5], causal=True)
    with pytest.raises(ValueError, match="k must hold the keys of q's positions"):
        mfa_torch.ring_attention(q, q[:, :, :4], q[:, :, :4])
    with pytest.raises(TypeError, match="one dtype"):
        mfa_torch.ring_attention(q, q, q.to(torch.bfloat16))
    with pytest.raises(ValueError, match="rank 4"):
        mfa_torch.ring_attention(q[0], q[0], q[0])
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            mfa_torch.ring_attention(q, q, q)
