"""The failure modes lockstep's Python package must rule out, on real processes (torch.distributed
with Gloo on CPU, a file rendezvous, a hard time limit each)."""
import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIME_LIMIT = 120  # seconds per test: a rank that waits for another fails the test, it never hangs CI


def run_ranks(world, target, *args):
    """Runs target(rank, world, store_file, *args) on `world` processes; returns their results."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        results = mp.get_context("spawn").Manager().dict()
        context = mp.start_processes(_entry, args=(world, store, results, target, args), nprocs=world, join=False,
                                     start_method="spawn")
        deadline = time.time() + TIME_LIMIT
        while not context.join(timeout=max(0.1, deadline - time.time())):
            if time.time() > deadline:
                for p in context.processes:
                    p.kill()
                pytest.fail(f"ranks still running after {TIME_LIMIT} s: one is waiting for another")
        return [results[r] for r in range(world)]


def _entry(rank, world, store, results, target, args):
    # A collective that waits longer than this is a failure of the test (a rank out of step).
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        results[rank] = target(rank, world, *args)
    finally:
        dist.destroy_process_group()


def _bucket_epochs(rank, world, bucket_ids, epochs):
    from lockstep.data import BucketBatchSampler

    sampler = BucketBatchSampler(bucket_ids, global_batch_size=12, seed=3)  # world and rank from torch.distributed
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            # Every step is a collective, as a training step's gradient sync is: a rank with fewer
            # batches would leave the others waiting here. The buckets are compared on the way.
            bucket = torch.tensor([bucket_ids[batch[0]]])
            gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(gathered, bucket)
            assert len({int(g) for g in gathered}) == 1, f"ranks at different buckets: {gathered}"
            assert all(bucket_ids[i] == int(bucket) for i in batch)
            seen.append((epoch, len(batch)))
    return seen


@pytest.mark.parametrize("world", [2, 3])
def test_the_bucket_sampler_keeps_ranks_in_step_over_uneven_buckets(world):
    bucket_ids = [0] * 37 + [1] * 21 + [2] * 14  # 3, 1 and 1 global batches of 12, remainders dropped
    results = run_ranks(world, _bucket_epochs, bucket_ids, 3)
    steps = [len(r) for r in results]
    assert len(set(steps)) == 1 and steps[0] == 3 * (3 + 1 + 1)
    for step in range(steps[0]):
        assert sum(r[step][1] for r in results) == 12  # the ranks' parts make one global batch


def _group_seen_from_cpp(rank, world):
    import lockstep

    return lockstep._C._group_rank_and_size(dist.group.WORLD)


def test_the_user_s_process_group_reaches_liblockstep_as_itself():
    assert run_ranks(2, _group_seen_from_cpp) == [(0, 2), (1, 2)]
