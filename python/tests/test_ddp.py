"""lockstep's modules in data-parallel training, on 2 real processes (torch.distributed with Gloo on CPU, a
file rendezvous, a hard time limit each):
- inside torch.nn.parallel.DistributedDataParallel, with and without its buffer broadcast, rank 0 validating
  alone mid-training: every rank ends with the same parameters and buffers, those of one process trained on
  the whole batches;
- what DDP's own wrapper does when one rank evaluates through it (it broadcasts buffers: a collective), and
  that lockstep's modules in evaluation issue none;
- a rank with no tokens, and ranks with unequal batches, against one process;
- modules that disagree between ranks: lockstep.CollectiveMismatch on every rank, naming both calls."""
import datetime
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lockstep
from ranks import loadable, run_ranks, state_with_steps

TIMEOUT = 10.0  # collective_timeout: a rank left waiting by another fails its test in seconds, not minutes
STEPS, EVALUATE_AT = 4, 2  # training steps; rank 0 alone validates before this one
LR = 0.1

QUANTIZERS = {
    "VectorQuantize": lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9, collective_timeout=TIMEOUT),
    "LFQ": lambda: lockstep.LFQ(dim=8, codebook_size=2**4, commitment_loss_weight=0.25, collective_timeout=TIMEOUT),
    "FSQ": lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8, collective_timeout=TIMEOUT),
    "ResidualVQ": lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, decay=0.9,
                                              collective_timeout=TIMEOUT),
    "ResidualFSQ": lambda: lockstep.ResidualFSQ(levels=[5, 5, 5], num_quantizers=2, dim=8, collective_timeout=TIMEOUT),
    "ResidualLFQ": lambda: lockstep.ResidualLFQ(dim=8, codebook_size=2**4, num_quantizers=2,
                                                commitment_loss_weight=0.25, collective_timeout=TIMEOUT),
}
# The grouped modules (two residual modules side by side), in the DDP tests only.
GROUPED = {
    "GroupedResidualVQ": lambda: lockstep.GroupedResidualVQ(dim=8, groups=2, num_quantizers=2, codebook_size=16,
                                                            decay=0.9, collective_timeout=TIMEOUT),
    "GroupedResidualLFQ": lambda: lockstep.GroupedResidualLFQ(dim=8, groups=2, codebook_size=2**4, num_quantizers=2,
                                                              commitment_loss_weight=0.25, collective_timeout=TIMEOUT),
}
# SimVQ reduces nothing (its map is a parameter, its codebook frozen): DDP's gradient average is all it needs.
class _ChannelFirst(nn.Module):
    """Tokens (b, n, d) through a module that takes (b, d, n), as LatentQuantize does."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        out, indices, loss = self.inner(x.transpose(1, 2))
        return out.transpose(1, 2), indices, loss


OTHERS = {"SimVQ": lambda: lockstep.SimVQ(dim=8, codebook_size=16, collective_timeout=TIMEOUT),
          # A module of the user's that the codebook passes through (a learnable codebook): the module's
          # parameters and the codebook are the model's, averaged by DDP as any.
          "VectorQuantize(vq_bridge)": lambda: lockstep.VectorQuantize(
              dim=8, codebook_size=16, vq_bridge=nn.Sequential(nn.Linear(8, 8), nn.Tanh()), collective_timeout=TIMEOUT),
          # A map of the user's: its parameters are the model's, averaged by DDP as any.
          "SimVQ(codebook_transform)": lambda: lockstep.SimVQ(
              dim=8, codebook_size=16, codebook_transform=nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 8)),
              collective_timeout=TIMEOUT),
          "LatentQuantize": lambda: _ChannelFirst(lockstep.LatentQuantize(levels=[5, 4, 3], dim=8,
                                                                          collective_timeout=TIMEOUT)),
          "ResidualSimVQ": lambda: lockstep.ResidualSimVQ(dim=8, num_quantizers=2, codebook_size=16,
                                                          collective_timeout=TIMEOUT),
          # A learnable codebook is a parameter: DDP averages its gradient; the cluster sizes that dead-code
          # replacement reads are lockstep's to reduce.
          # An optimizer of the codebook stepped on the in-place loss in backward, its gradient the global
          # batch's (lockstep's reduce); the model's optimizer steps the codebook too, DDP averaging its gradient.
          "VectorQuantize(in_place_codebook_optimizer)": lambda: lockstep.VectorQuantize(
              dim=8, codebook_size=16, learnable_codebook=True, ema_update=False,
              in_place_codebook_optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5),
              collective_timeout=TIMEOUT),
          "VectorQuantize(learnable_codebook)": lambda: lockstep.VectorQuantize(
              dim=8, codebook_size=16, learnable_codebook=True, ema_update=False, threshold_ema_dead_code=0.5,
              decay=0.9, collective_timeout=TIMEOUT)}
IN_DDP = {**QUANTIZERS, **GROUPED, **OTHERS}


def _aux_loss(out):
    """The quantizer's auxiliary loss as one number: the FSQ modules have none, the residual ones one per layer."""
    return out[2].sum() if len(out) == 3 else out[0].new_zeros(())


class Tokenizer(nn.Module):
    """A tiny tokenizer: linear encoder -> quantizer -> linear decoder; forward(x) -> (reconstruction, aux loss)."""

    def __init__(self, quantizer):
        super().__init__()
        self.encoder = nn.Linear(6, 8)
        self.quantizer = IN_DDP[quantizer]()
        self.decoder = nn.Linear(8, 6)

    def forward(self, x):
        out = self.quantizer(self.encoder(x))
        return self.decoder(out[0]), _aux_loss(out)


def _train_step(net, optimizer, x):
    reconstruction, aux = net(x)
    loss = nn.functional.mse_loss(reconstruction, x) + aux
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _evaluate(module, x):
    """An evaluation forward, as a validation loop runs it."""
    module.eval()
    with torch.no_grad():
        module(x)
    module.train()




def _train_in_ddp(rank, world, initial, data):
    states = {}
    for quantizer, start in initial.items():
        for broadcast_buffers in (True, False):
            model = Tokenizer(quantizer)
            # The same start on every rank: DDP with broadcast_buffers=False does not sync buffers at construction.
            model.load_state_dict(loadable(start))
            ddp = DistributedDataParallel(model, broadcast_buffers=broadcast_buffers)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
            for step, batch in enumerate(data):
                if rank == 0 and step == EVALUATE_AT:
                    _evaluate(model, batch)  # rank 0 alone validates, through the module DDP wraps
                _train_step(ddp, optimizer, batch.chunk(world)[rank])
            states[quantizer, broadcast_buffers] = state_with_steps(model)
    return states


@pytest.fixture(scope="module")
def trained_in_ddp():
    """{quantizer: (initial state, one process's state after training on the whole batches, each rank's
    {broadcast_buffers: state} after training in DDP on half of each batch)}: one run of the ranks for all."""
    torch.manual_seed(0)
    data = torch.randn(STEPS, 4, 5, 6)  # each step a batch of 4 sequences of 5 tokens; rank r takes 2
    initial, one = {}, {}
    for quantizer in IN_DDP:
        model = Tokenizer(quantizer)
        initial[quantizer] = state_with_steps(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for batch in data:
            _train_step(model, optimizer, batch)
        one[quantizer] = state_with_steps(model)
    ranks = run_ranks(2, _train_in_ddp, initial, data)
    return {q: (initial[q], one[q], [{b: r[q, b] for b in (True, False)} for r in ranks]) for q in IN_DDP}


@pytest.mark.parametrize("quantizer", list(IN_DDP))
@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_quantizers_in_ddp_keep_ranks_identical_and_equal_to_one_process(trained_in_ddp, quantizer,
                                                                          broadcast_buffers):
    initial, one, ranks = trained_in_ddp[quantizer]
    states = [r[broadcast_buffers] for r in ranks]
    assert states[0].keys() == states[1].keys() == one.keys()
    assert any(not torch.equal(one[k], initial[k]) for k in one if k.startswith("quantizer."))  # it learned
    for key in one:
        assert torch.equal(states[0][key], states[1][key]), f"{key} differs between the ranks"
        # DDP averages the ranks' gradients and lockstep reduces the quantizer's statistics over them:
        # two halves train as the whole batch does
        torch.testing.assert_close(states[0][key], one[key], atol=1e-5, rtol=1e-5, msg=key)
        # the buffers DDP broadcasts from rank 0 are the ones every rank already holds
        torch.testing.assert_close(states[0][key], ranks[0][False][key], atol=1e-6, rtol=0, msg=key)


def _evaluate_through_ddp_on_rank0(rank, world, initial, data):
    model = Tokenizer("VectorQuantize")
    model.load_state_dict(loadable(initial))
    ddp = DistributedDataParallel(model, broadcast_buffers=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    store = dist.distributed_c10d._get_default_store()
    part = data.chunk(world, dim=1)[rank]
    _train_step(ddp, optimizer, part[0])

    # The module DDP wraps, in evaluation on rank 0 alone: rank 1 only waits for its word through the store.
    if rank == 0:
        _evaluate(model, part[1])
        store.set("module evaluated", "1")
    else:
        store.wait(["module evaluated"], datetime.timedelta(seconds=3 * TIMEOUT))
    _train_step(ddp, optimizer, part[1])

    # DDP's wrapper in evaluation on rank 0 alone. If rank 0 has not finished after 2 s, it waits for rank 1:
    # rank 1 then makes the same call, which takes part in whatever collective rank 0 is in.
    blocked = None
    if rank == 0:
        _evaluate(ddp, part[2])
        store.set("wrapper evaluated", "1")
    else:
        try:
            store.wait(["wrapper evaluated"], datetime.timedelta(seconds=2))
            blocked = False
        except RuntimeError:  # the store's timeout
            blocked = True
            _evaluate(ddp, part[2])
            store.wait(["wrapper evaluated"], datetime.timedelta(seconds=3 * TIMEOUT))
    _train_step(ddp, optimizer, part[2])
    return blocked, state_with_steps(model)


def test_evaluating_through_ddp_on_one_rank_is_a_collective_and_the_quantizer_alone_is_not():
    torch.manual_seed(0)
    initial = state_with_steps(Tokenizer("VectorQuantize"))
    (_, state0), (blocked, state1) = run_ranks(2, _evaluate_through_ddp_on_rank0, initial, torch.randn(3, 4, 5, 6))
    # torch's DDP (2.x) broadcasts buffers before a forward whenever the previous forward ran with gradients,
    # in evaluation mode and under no_grad too: rank 0 could not finish alone. Evaluate on one rank through
    # ddp.module, which reached the store above while rank 1 waited.
    assert blocked is True
    for key in state0:
        assert torch.equal(state0[key], state1[key]), key


def _zero_tokens_on_rank1(rank, world, quantizer, state, x):
    module = QUANTIZERS[quantizer]()
    module.load_state_dict(loadable(state))
    part = (x if rank == 0 else x[:0]).clone().requires_grad_(True)
    out = module(part)
    loss = _aux_loss(out)
    (out[0].sum() + loss).backward()
    # every parameter gets a gradient (DDP waits for each), finite, and so does the empty input
    gradients = [p.grad for p in module.parameters()] + [part.grad]
    finite = all(g is not None and torch.isfinite(g).all() for g in gradients)
    return out[0].detach(), out[1], state_with_steps(module), loss.item(), finite


@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
def test_a_rank_with_no_tokens_trains_with_the_others(quantizer):
    one = QUANTIZERS[quantizer]()
    state = state_with_steps(one)
    x = torch.randn(2, 5, 8)
    out = one(x.clone().requires_grad_(True))
    (out[0].sum() + _aux_loss(out)).backward()  # one process's step: the state updates in backward
    expected_out, expected_indices = out[:2]
    ranks = run_ranks(2, _zero_tokens_on_rank1, quantizer, state, x)
    assert ranks[1][0].shape == (0, 5, 8) and ranks[1][1].shape[0] == 0
    # no NaN from a mean over no tokens, which DDP would average into the other ranks' gradients
    assert all(math.isfinite(r[3]) and r[4] for r in ranks), [r[3:] for r in ranks]
    # the step is one process's step on rank 0's batch, with the same seed and initial state
    torch.testing.assert_close(ranks[0][0], expected_out.detach(), atol=1e-5, rtol=1e-5)
    assert torch.equal(ranks[0][1], expected_indices)
    for key, value in state_with_steps(one).items():
        assert torch.equal(ranks[0][2][key], ranks[1][2][key]), key
        torch.testing.assert_close(ranks[0][2][key], value, atol=1e-5, rtol=1e-5, msg=key)


def _lfq_unequal_parts(rank, world, x, items_on_rank0):
    # with and without the codebook entropy, to tell its gradient apart
    modules = [lockstep.LFQ(codebook_size=2**6, diversity_gamma=gamma, collective_timeout=TIMEOUT)
               for gamma in (1.0, 0.0)]
    parts = [(x[:items_on_rank0] if rank == 0 else x[items_on_rank0:]).clone().requires_grad_(True) for _ in modules]
    outputs = [lfq(part) for lfq, part in zip(modules, parts)]
    for _, _, aux in outputs:
        aux.backward()
    return [(out.detach(), indices, aux.item(), part.grad) for (out, indices, aux), part in zip(outputs, parts)]


def test_lfq_on_unequal_batches_gives_one_process_s_rows_and_gradients():
    x = torch.randn(4, 30, 6)
    one, alone = [], []
    for diversity_gamma in (1.0, 0.0):
        whole = x.clone().requires_grad_(True)
        lfq = lockstep.LFQ(codebook_size=2**6, diversity_gamma=diversity_gamma)
        out, indices, aux = lfq(whole)
        aux.backward()
        one.append((out.detach(), indices, aux.item(), whole.grad))
        alone.append([lfq(part)[2].item() for part in (x[:3], x[3:])])
    ranks = run_ranks(2, _lfq_unequal_parts, x, 3)  # rank 0: items 0-2, rank 1: item 3
    rows = [slice(0, 3), slice(3, 4)]
    for (out, indices, _, grad), losses_alone, parts in zip(one, alone, zip(*ranks)):
        for r in range(2):
            torch.testing.assert_close(parts[r][0], out[rows[r]])
            assert torch.equal(parts[r][1], indices[rows[r]])
            # A forward never communicates: the loss a rank sees is its own batch's (docs/python/distributed.md) ...
            assert parts[r][2] == pytest.approx(losses_alone[r], rel=1e-5, abs=1e-6)
            # ... and backward gives it the global batch's gradient, the world size times one process's
            # rows whatever the shares, so that DDP's average of the ranks' gradients is one process's.
            torch.testing.assert_close(parts[r][3], 2 * grad[rows[r]], atol=1e-6, rtol=1e-5)


def _disagreeing_vq(rank, world, rank0_options):
    options = dict(dim=8, codebook_size=16, collective_timeout=TIMEOUT)
    vq = lockstep.VectorQuantize(**(dict(options, **rank0_options) if rank == 0 else options))
    try:
        out, _, loss = vq(torch.randn(2, 5, 8))  # k-means initialisation is the one collective in a forward
        (out.sum() + loss).backward()  # the EMA statistics' reduction
    except lockstep.CollectiveMismatch as e:
        return str(e)
    return None


@pytest.mark.parametrize("rank0_options, rank0_call, rank1_call", [
    (dict(kmeans_init=True), "at vq.kmeans", "all_reduce(sum) of [float64 (16), float64 (16, 8)] at vq.ema"),
    (dict(codebook_size=32), "all_reduce(sum) of [float64 (32), float64 (32, 8)] at vq.ema",
     "all_reduce(sum) of [float64 (16), float64 (16, 8)] at vq.ema"),
])
def test_modules_that_disagree_raise_collective_mismatch_on_every_rank(rank0_options, rank0_call, rank1_call):
    messages = run_ranks(2, _disagreeing_vq, rank0_options)
    for rank, message in enumerate(messages):
        assert message is not None, f"rank {rank} raised no CollectiveMismatch"
        assert f"seen by rank {rank} of 2" in message, message
        # both ranks' calls, with their call sites
        rank0_part, rank1_part = message.split("; rank 0: ")[1].split("; rank 1: ")
        assert rank0_call in rank0_part and "vq_updates.cpp:" in rank0_part, message
        assert rank1_call in rank1_part and "vq_updates.cpp:" in rank1_part, message
