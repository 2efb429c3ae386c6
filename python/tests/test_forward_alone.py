"""A forward never communicates (docs/python/distributed.md, G3): an extra forward on some ranks only (a preview, a
metric pass, validation in training mode) runs alone and changes nothing shared. For each of the six
modules, on 2 and 3 real processes with a hard time limit, inside DistributedDataParallel and without it,
before the first step and mid-training, in training mode with gradients, in training mode under no_grad
and in evaluation mode: every parameter and buffer ends bit-identical across the ranks, and bit-identical
to the same training without the extra forward."""
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lockstep
from ranks import run_ranks, state_with_steps
from test_ddp import QUANTIZERS, Tokenizer

STEPS = 4
MODES = ("train", "train_no_grad", "eval")
WHEN = {"before_first_step": 0, "mid_training": STEPS // 2}
NOISY = {  # modules whose forward draws random numbers, with the options that make it draw
    "FSQ with noise dropout": lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8, preserve_symmetry=True,
                                                   noise_dropout=0.5, collective_timeout=10.0),
    "ResidualFSQ with quantize dropout": lambda: lockstep.ResidualFSQ(
        levels=[5, 5, 5], num_quantizers=3, dim=8, quantize_dropout=True, collective_timeout=10.0),
    "VectorQuantize with sampled codes and dead codes": lambda: lockstep.VectorQuantize(
        dim=8, codebook_size=16, stochastic_sample_codes=True, threshold_ema_dead_code=2,
        collective_timeout=10.0),
    "VectorQuantize with a learnable codebook and dead codes": lambda: lockstep.VectorQuantize(
        dim=8, codebook_size=16, learnable_codebook=True, ema_update=False, threshold_ema_dead_code=2,
        collective_timeout=10.0),
}
BUILDERS = {**QUANTIZERS, **NOISY}


def _extra_ranks(world):
    return {0} if world == 2 else {0, 2}  # a proper subset of the ranks


def _extra_forward(module, x, mode):
    """What a preview, a metric pass or a validation loop runs on some ranks only; never backwarded."""
    if mode == "eval":
        module.eval()
        with torch.no_grad():
            module(x)
        module.train()
    elif mode == "train_no_grad":
        with torch.no_grad():
            module(x)
    else:
        reconstruction, aux = module(x)  # with gradients: a graph that is dropped
        float((reconstruction.sum() + aux).detach())


def _train(rank, world, name, ddp, extra):
    torch.manual_seed(0)
    net = Tokenizer("FSQ")
    net.quantizer = BUILDERS[name]()  # the same start on every rank: the same seed
    model = DistributedDataParallel(net) if ddp else net
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.randn(STEPS, world * 2, 5, 6, generator=torch.Generator().manual_seed(1))
    for step in range(STEPS):
        if extra is not None and rank in _extra_ranks(world) and step == WHEN[extra[1]]:
            _extra_forward(net, data[step].chunk(world)[rank] + 1, extra[0])  # the module DDP wraps
        reconstruction, aux = model(data[step].chunk(world)[rank])
        loss = nn.functional.mse_loss(reconstruction, data[step].chunk(world)[rank]) + aux
        optimizer.zero_grad()
        loss.backward()
        if not ddp:  # the user's own gradient average
            for p in net.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
    return state_with_steps(net)


def _scenarios(rank, world):
    results = {}
    for name in BUILDERS:
        for ddp in (False, True):
            results[name, ddp, None] = _train(rank, world, name, ddp, None)
            for mode in MODES:
                for when in WHEN:
                    results[name, ddp, (mode, when)] = _train(rank, world, name, ddp, (mode, when))
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_an_extra_forward_on_some_ranks_runs_alone_and_changes_nothing(world):
    ranks = run_ranks(world, _scenarios)  # fails at the harness's time limit if any rank waits
    for (name, ddp, extra), state in ranks[0].items():
        baseline = ranks[0][name, ddp, None]
        where = f"{name}, {'in DDP' if ddp else 'without DDP'}, extra forward {extra}"
        for key, value in state.items():
            for r in range(1, world):
                assert torch.equal(value, ranks[r][name, ddp, extra][key]), f"{where}: {key} differs on rank {r}"
            assert torch.equal(value, baseline[key]), f"{where}: {key} differs from the run without it"
        assert any(not torch.equal(v, ranks[0][name, ddp, None][k]) for k, v in _initial(name).items()), where


_INITIAL = {}


def _initial(name):
    """The state training starts from (to check that training changed it)."""
    if name not in _INITIAL:
        torch.manual_seed(0)
        net = Tokenizer("FSQ")
        net.quantizer = BUILDERS[name]()
        _INITIAL[name] = {k: v.detach().clone() for k, v in net.state_dict().items()}
    return _INITIAL[name]


def _forward_only(rank, world, name):
    torch.manual_seed(0)
    module = BUILDERS[name]()
    if rank == 0:  # rank 0 alone runs a training forward with gradients; the others do nothing at all
        out = module(torch.randn(2, 5, 8, requires_grad=True))
        return tuple(out[0].shape)
    return None


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_training_forward_on_one_rank_returns_at_once(name):
    # Before, this forward gathered every rank's batch size and rank 0 waited for rank 1 until the timeout.
    assert run_ranks(2, _forward_only, name)[0] == (2, 5, 8)
