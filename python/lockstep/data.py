"""lockstep.data.BucketBatchSampler: lockstep's one global plan of batches (G5) as a
torch.utils.data batch sampler, for multi-resolution (bucketed) data on any number of ranks."""
import torch
from torch.utils.data import Sampler

from . import _C


class BucketBatchSampler(Sampler):
    """Batches of item indices for this rank, one global batch per step, every item of a global
    batch from the same bucket (resolution).

    Every rank computes the same plan from (the items' buckets, seed, epoch, global batch size) and
    takes its slice of each global batch, so all ranks get the same number of batches per epoch and
    the same bucket at each step: no rank finishes its epoch early and waits for the others.

    Give each item's bucket (``bucket_ids``), or each item's ``sizes`` ((width, height)) and a
    ``buckets`` table of (width, height): an item goes to the bucket nearest its aspect ratio.
    ``drop_last=False`` completes each bucket's last global batch with samples of the same bucket.
    """

    def __init__(self, bucket_ids=None, *, sizes=None, buckets=None, global_batch_size, num_replicas=None,
                 rank=None, seed=0, drop_last=True):
        if (bucket_ids is None) == (sizes is None):
            raise ValueError("BucketBatchSampler: give bucket_ids, or sizes with a buckets table")
        if sizes is not None:
            if not buckets:
                raise ValueError("BucketBatchSampler: sizes need a buckets table of (width, height)")
            table = [(int(w), int(h)) for w, h in buckets]
            bucket_ids = [_C.nearest_bucket(table, float(w), float(h)) for w, h in sizes]
        if num_replicas is None or rank is None:
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            num_replicas = num_replicas if num_replicas is not None else (
                torch.distributed.get_world_size() if distributed else 1)
            rank = rank if rank is not None else (torch.distributed.get_rank() if distributed else 0)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"BucketBatchSampler: rank {rank} is not in [0, {num_replicas})")
        if global_batch_size < num_replicas:
            raise ValueError(f"BucketBatchSampler: a global batch of {global_batch_size} cannot give each of "
                             f"{num_replicas} ranks an item")
        groups = {}
        for item, bucket in enumerate(bucket_ids):
            groups.setdefault(int(bucket), []).append(item)
        self.bucket_of = [int(b) for b in bucket_ids]
        self._buckets = [groups.get(b, []) for b in range(max(groups) + 1)] if groups else []
        self.global_batch_size = int(global_batch_size)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.start = 0  # the global step this epoch continues from (after load_state_dict)
        self.yielded = 0  # global steps of this epoch handed out so far

    def _plan(self):
        return _C.EpochPlan(self._buckets, self.global_batch_size, self.seed, not self.drop_last, self.epoch)

    def set_epoch(self, epoch):
        """Starts epoch `epoch` (a different shuffle of every bucket); call it before iterating."""
        self.epoch = int(epoch)
        self.start = 0
        self.yielded = 0

    def __iter__(self):
        plan = self._plan()
        start, self.start = self.start, 0
        for step in range(start, plan.steps()):
            self.yielded = step + 1
            yield plan.rank_part(step, self.num_replicas, self.rank)

    def __len__(self):
        return self._plan().steps() - self.start

    def state_dict(self, step=None):
        """Where the epoch is: its number and the global steps done. A DataLoader's workers fetch
        ahead of training, so pass `step` (the steps your loop finished this epoch) when they do."""
        return {"epoch": self.epoch, "step": self.yielded if step is None else int(step), "seed": self.seed,
                "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state):
        """Continues exactly where `state` was saved, on this sampler's number of ranks (which may
        differ from the one that saved it: the plan is global)."""
        for key in ("seed", "global_batch_size"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"BucketBatchSampler: the saved {key} is {state[key]} but this sampler's is "
                                 f"{getattr(self, key)}: the sequence would not continue")
        self.epoch = int(state["epoch"])
        self.start = int(state["step"])
        self.yielded = self.start
