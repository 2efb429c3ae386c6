"""lockstep.data.BucketBatchSampler: one global plan, sliced by rank."""
import pytest

from lockstep.data import BucketBatchSampler

# Uneven buckets: 37, 21 and 9 items (the last too small for a global batch of 12 with drop_last).
BUCKETS = [0] * 37 + [1] * 21 + [2] * 14


def samplers(world, **kwargs):
    return [BucketBatchSampler(BUCKETS, global_batch_size=12, num_replicas=world, rank=r, **kwargs)
            for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_as_many_batches_each_step_from_one_bucket(world):
    one = samplers(1)[0]
    ranks = samplers(world)
    for epoch in range(3):
        for s in ranks + [one]:
            s.set_epoch(epoch)
        whole = list(one)
        parts = [list(s) for s in ranks]
        assert all(len(p) == len(whole) == len(s) for p, s in zip(parts, ranks))
        for step, batch in enumerate(whole):
            # the ranks' parts, in rank order, are one process's global batch; all from one bucket
            assert [i for p in parts for i in p[step]] == batch
            assert len({BUCKETS[i] for i in batch}) == 1
            assert max(len(p[step]) for p in parts) - min(len(p[step]) for p in parts) <= 1


def test_epochs_shuffle_differently_and_the_same_seed_repeats():
    a, b = samplers(1)[0], samplers(1)[0]
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b)
    b.set_epoch(2)
    assert list(a) != list(b)
    c = BucketBatchSampler(BUCKETS, global_batch_size=12, num_replicas=1, rank=0, seed=5)
    c.set_epoch(1)
    assert list(c) != list(a)


def test_padding_completes_each_bucket_s_last_batch():
    dropped = samplers(1, drop_last=True)[0]
    padded = samplers(1, drop_last=False)[0]
    assert len(dropped) == 3 + 1 + 1  # 37 // 12, 21 // 12, 14 // 12
    assert len(padded) == 4 + 2 + 2
    assert all(len(b) == 12 for b in padded)


def test_resume_mid_epoch_onto_another_world_size_continues_the_sequence():
    one = samplers(1)[0]
    one.set_epoch(4)
    whole = list(one)
    two = samplers(2)
    for s in two:
        s.set_epoch(4)
    iterators = [iter(s) for s in two]
    for _ in range(2):
        for it in iterators:
            next(it)
    state = two[0].state_dict()
    assert state["epoch"] == 4 and state["step"] == 2
    three = samplers(3)
    for s in three:
        s.load_state_dict(state)
    assert all(len(s) == len(whole) - 2 for s in three)
    rest = [list(s) for s in three]
    for k, batch in enumerate(whole[2:]):
        assert [i for p in rest for i in p[k]] == batch


def test_sizes_go_to_the_bucket_nearest_their_aspect_ratio():
    table = [(256, 256), (320, 192), (192, 320)]
    sizes = [(500, 500)] * 8 + [(800, 480)] * 8 + [(300, 520)] * 8
    s = BucketBatchSampler(sizes=sizes, buckets=table, global_batch_size=8, num_replicas=1, rank=0)
    assert s.bucket_of == [0] * 8 + [1] * 8 + [2] * 8
    assert sorted(len(b) for b in s) == [8, 8, 8]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="rank 2"):
        BucketBatchSampler(BUCKETS, global_batch_size=12, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="global batch of 2"):
        BucketBatchSampler(BUCKETS, global_batch_size=2, num_replicas=3, rank=0)
    s = samplers(1)[0]
    other = BucketBatchSampler(BUCKETS, global_batch_size=12, num_replicas=1, rank=0, seed=9)
    with pytest.raises(ValueError, match="seed"):
        s.load_state_dict(other.state_dict())
    with pytest.raises(ValueError):
        list(BucketBatchSampler([0] * 5, global_batch_size=12, num_replicas=1, rank=0))  # no bucket fills one
