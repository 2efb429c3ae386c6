"""Modules on overlapping subgroups of a backend that is not torch's built-in Gloo (issue #37, item 0).

3 processes; a backend registered with torch.distributed.Backend.register_backend (one that wraps Gloo
under its own name, standing in for NCCL or a vendor's library), so lockstep makes a Gloo group of its own
beside each subgroup; A = new_group([0, 1]) and B = new_group([1, 2]) on it; a VectorQuantize on A on
ranks 0 and 1, one on B on ranks 1 and 2. Rank 1 takes part in both, making A's module's channel first or
B's. Each module must reduce with its own group's ranks alone (ranks 0 and 2 share no group) and end
where one process holding its group's whole batches ends; a rank killed mid-run is named by the others."""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import lockstep
from ranks import run_ranks

STEPS = 3
GROUPS = {"A": [0, 1], "B": [1, 2]}
TIMEOUT = 20.0  # collective_timeout: far above the few seconds a dead rank takes to be named
DEAD = 15  # seconds: a rank that died is named once its heartbeat has been silent for ~2 s


def _registered_gloo(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _module(group=None):
    return lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9, seed=7, process_group=group,
                                   collective_timeout=TIMEOUT)


def _state(vq):
    return {key: value.detach().clone() for key, value in vq.state_dict().items()}


def _step(vq, x):
    x = x.clone().requires_grad_(True)
    out, _, loss = vq(x)
    (out.square().mean() + loss).backward()


def _subgroups():
    """A and B on the registered backend: every rank creates both, in the same order, as new_group requires."""
    if "LOCKSTEP_SUBGROUP_TEST" not in dist.Backend._plugins:
        dist.Backend.register_backend("lockstep_subgroup_test", _registered_gloo, devices=["cpu"])
    timeout = datetime.timedelta(seconds=30)
    return {name: dist.new_group(ranks, backend="lockstep_subgroup_test", timeout=timeout)
            for name, ranks in GROUPS.items()}


def _train_in_subgroups(rank, world, data, order, die_after=None):
    """Each rank trains the modules of its groups, in `order` (rank 1 is in both): their states, or for a
    rank left by a dead one, the error it stopped with and how long that took."""
    groups = _subgroups()
    mine = [name for name in order if rank in GROUPS[name]]
    modules = {name: _module(groups[name]) for name in mine}
    for step in range(STEPS):
        if step == die_after and rank == 1:
            os._exit(0)  # gone without a word, as a killed process
        for name in mine:
            part = data[name][step].chunk(len(GROUPS[name]))[GROUPS[name].index(rank)]
            start = time.monotonic()
            try:
                _step(modules[name], part)
            except lockstep.CollectiveFailure as e:
                return {"error": str(e), "seconds": time.monotonic() - start}
    return {name: _state(vq) for name, vq in modules.items()}


def _one_process_per_group(data):
    states = {}
    for name in GROUPS:
        vq = _module()
        for step in range(STEPS):
            _step(vq, data[name][step])
        states[name] = _state(vq)
    return states


@pytest.mark.parametrize("order", [("A", "B"), ("B", "A")], ids=["A-first", "B-first"])
def test_overlapping_subgroups_of_a_registered_backend_reduce_within_their_groups(order):
    data = {name: torch.randn(STEPS, 8, 4, 8) for name in GROUPS}
    one = _one_process_per_group(data)
    assert not torch.equal(one["A"]["_codebook.embed"], one["B"]["_codebook.embed"])  # the groups' runs differ
    ranks = run_ranks(3, _train_in_subgroups, data, order)
    for name, members in GROUPS.items():
        for rank in members:
            for key, value in one[name].items():
                torch.testing.assert_close(ranks[rank][name][key], value, atol=1e-5, rtol=1e-5,
                                           msg=lambda m, key=key, rank=rank, name=name: f"{name} on rank {rank}: {key}: {m}")
    assert set(ranks[0]) == {"A"} and set(ranks[2]) == {"B"}


def test_a_rank_killed_in_overlapping_subgroups_is_named_by_the_others():
    data = {name: torch.randn(STEPS, 8, 4, 8) for name in GROUPS}
    ranks = run_ranks(3, _train_in_subgroups, data, ("A", "B"), 1)
    assert ranks[1] is None  # it died before returning anything
    # rank 1 is A's rank 1 and B's rank 0: B's numbering is not the job's, so B's error names both
    for rank, peer in ((0, "1"), (2, "0 (global rank 1)")):
        record = ranks[rank]
        assert "error" in record, f"rank {rank} went on without rank 1: {sorted(record)}"
        assert f"rank(s) {peer} died" in record["error"], record["error"]
        members = GROUPS["A"] if rank == 0 else GROUPS["B"]
        assert f"global ranks {members}" in record["error"], record["error"]
        assert record["seconds"] < DEAD, record
