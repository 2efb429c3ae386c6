#!/usr/bin/env python3
"""lockstep's modules over an NCCL-only process group (bench/gpu_check.sh runs this under torchrun on 2
GPUs; pytest does not collect it). The default group is NCCL alone: lockstep makes its own Gloo group
for fingerprints and carries the statistics on the group's NCCL backend, on the device. Each module
trains 3 steps on cuda:<rank> (gradients averaged over NCCL) while rank 0 alone runs a training-mode preview; the ranks must end
identical. Exit 0 when they do, 1 otherwise, 77 with fewer than 2 GPUs.

    torchrun --standalone --nproc-per-node 2 python/tests/nccl_check.py
"""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import lockstep

MODULES = {
    "VectorQuantize": lambda: lockstep.VectorQuantize(dim=16, codebook_size=64, threshold_ema_dead_code=1,
                                                      collective_timeout=60.0),
    "LFQ": lambda: lockstep.LFQ(dim=16, codebook_size=2**10, collective_timeout=60.0),
    "ResidualVQ": lambda: lockstep.ResidualVQ(dim=16, codebook_size=32, num_quantizers=3, collective_timeout=60.0),
    "FSQ": lambda: lockstep.FSQ(levels=[8, 5, 5, 5], dim=16, collective_timeout=60.0),
}


def main():
    if torch.cuda.device_count() < 2:
        print("SKIP: fewer than 2 GPUs")
        return 77
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")  # NCCL alone: no Gloo backend in the group
    device = torch.device("cuda", rank)
    failures = []
    for name, make in MODULES.items():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16)).to(device)
        quantizer = make().to(device)
        head = nn.Linear(16, 8).to(device)
        params = list(net.parameters()) + list(quantizer.parameters()) + list(head.parameters())
        optimizer = torch.optim.SGD(params, lr=0.1)
        for step in range(3):
            x = torch.randn(4, 32, 8, device=device, generator=torch.Generator(device).manual_seed(step * 2 + rank))
            if rank == 0 and step == 1:
                quantizer(net(x))  # a preview on rank 0 alone: a training forward never backwarded
            out = quantizer(net(x))
            loss = nn.functional.mse_loss(head(out[0]), x) + (out[2].sum() if len(out) == 3 else 0)
            optimizer.zero_grad()
            loss.backward()
            for p in params:  # the user's own gradient average, over NCCL
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
            optimizer.step()
        state = torch.cat([v.detach().float().flatten() for v in quantizer.state_dict().values()
                           if torch.is_tensor(v) and v.is_floating_point()])
        gathered = [torch.empty_like(state) for _ in range(2)]
        dist.all_gather(gathered, state)
        same = torch.equal(gathered[0], gathered[1])
        print(f"{'PASS' if same else 'FAIL'} {name}: state on cuda:{rank} {'identical' if same else 'differs'} "
              f"across ranks after 3 steps over NCCL alone")
        if not same:
            failures.append(name)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
