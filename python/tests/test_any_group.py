"""lockstep's modules over a process group whose backend is not torch's built-in Gloo: a backend
registered with torch.distributed.Backend.register_backend (here one that wraps Gloo under its own
name, as a vendor's backend would wrap its library). lockstep finds no built-in Gloo in the group and
makes its own Gloo group through the group's store for its fingerprints; DDP and the user's collectives
use the registered backend. On 2 real processes, with a hard time limit."""
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import lockstep
from ranks import loadable, run_ranks, state_with_steps
from test_ddp import Tokenizer, _train_step

STEPS = 3


def _registered_gloo(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _train_over_a_registered_backend(rank, world, initial, data):
    dist.Backend.register_backend("lockstep_test", _registered_gloo, devices=["cpu"])
    group = dist.new_group(backend="lockstep_test", timeout=datetime.timedelta(seconds=30))
    states = {}
    for name, make in (("VectorQuantize", lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9,
                                                                         process_group=group, collective_timeout=10.0)),
                       ("LFQ", lambda: lockstep.LFQ(dim=8, codebook_size=2**4, process_group=group,
                                                    collective_timeout=10.0))):
        model = Tokenizer("FSQ")
        model.quantizer = make()
        model.load_state_dict(loadable(initial[name]))
        ddp = DistributedDataParallel(model, process_group=group)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step, batch in enumerate(data):
            if rank == 0 and step == 1:
                model(batch)  # rank 0 alone: a training forward that is never backwarded
            _train_step(ddp, optimizer, batch.chunk(world)[rank])
        states[name] = state_with_steps(model)
    return states


def test_modules_train_over_a_registered_backend_as_one_process():
    torch.manual_seed(0)
    data = torch.randn(STEPS, 4, 5, 6)
    initial, one = {}, {}
    for name, make in (("VectorQuantize", lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.9)),
                       ("LFQ", lambda: lockstep.LFQ(dim=8, codebook_size=2**4))):
        model = Tokenizer("FSQ")
        model.quantizer = make()
        initial[name] = state_with_steps(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in data:
            _train_step(model, optimizer, batch)
        one[name] = state_with_steps(model)
    ranks = run_ranks(2, _train_over_a_registered_backend, initial, data)
    for name in one:
        for key, value in one[name].items():
            assert torch.equal(ranks[0][name][key], ranks[1][name][key]), f"{name}: {key} differs between ranks"
            torch.testing.assert_close(ranks[0][name][key], value, atol=1e-5, rtol=1e-5, msg=f"{name}: {key}")
