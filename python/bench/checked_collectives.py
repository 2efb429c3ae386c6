#!/usr/bin/env python3
"""What checking every collective costs (lockstep.distributed, issue #24): per collective and per DDP
step of the demo's model, with no checking, with lockstep's wrapper and with torch's own
TORCH_DISTRIBUTED_DEBUG=DETAIL, on Gloo (CPU) or NCCL (--cuda).

    PYTHONPATH=$PWD/build/python python python/bench/checked_collectives.py [--ranks 2] [--cuda]

Each mode runs in fresh processes (torch.multiprocessing.spawn, 127.0.0.1); rank 0 prints the median
of --repeats timed runs of --calls collectives (a 1-element and a 1 MiB all_reduce, a barrier) and of
--steps DDP steps (forward, backward with DDP's gradient all_reduce, SGD step) of the model that
`lockstep train` trains by default, with the quantizer left out (its forward communicates nothing).
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODES = tuple(os.environ.get("BENCH_MODES", "none,lockstep,torch DETAIL").split(","))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_model():
    """The default autoencoder's convolutions (docs/configuration.md: channels [32, 64], 28x28 input)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(32, 64, 4, stride=2, padding=1),
        torch.nn.SiLU(), torch.nn.Conv2d(64, 64, 4, stride=2, padding=1), torch.nn.SiLU(),
        torch.nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), torch.nn.SiLU(),
        torch.nn.ConvTranspose2d(32, 1, 4, stride=2, padding=1))


def timed(fn, n, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times) * 1e3


def run(rank, size, port, mode, part, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if mode == "torch DETAIL":  # torch reads the variable when it loads, so set the level here too
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda", rank) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    if mode == "lockstep":
        import lockstep.distributed
        dist.init_process_group(lockstep.distributed.BACKEND, rank=rank, world_size=size)
    else:
        dist.init_process_group("nccl" if args.cuda else "gloo", rank=rank, world_size=size)
    sync = torch.cuda.synchronize if args.cuda else (lambda: None)
    if part == "collectives":
        small = torch.ones(1, device=device)
        large = torch.ones(1 << 18, device=device)  # 1 MiB of float32
        figures = {
            "all_reduce 4 B": timed(lambda: (dist.all_reduce(small), sync()), args.calls, args.repeats),
            "all_reduce 1 MiB": timed(lambda: (dist.all_reduce(large), sync()), args.calls // 4 or 1, args.repeats),
            "barrier": timed(lambda: dist.barrier(), args.calls, args.repeats),
        }
        if rank == 0:
            queue.put(figures)
        dist.destroy_process_group()
        return
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(demo_model().to(device),
                                                      device_ids=[rank] if args.cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 1, 28, 28, device=device)

    def step():
        optimizer.zero_grad()
        (model(x) - x).square().mean().backward()
        optimizer.step()
        sync()

    figures = {"DDP step": timed(step, args.steps, args.repeats)}
    if rank == 0:
        queue.put(figures)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="images per rank per DDP step")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.cuda and torch.cuda.device_count() < args.ranks:
        sys.exit(f"--cuda needs {args.ranks} GPUs, {torch.cuda.device_count()} visible")
    queue = mp.get_context("spawn").SimpleQueue()
    results = {}
    for mode in MODES:
        if mode == "torch DETAIL":
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # the children inherit it
        results[mode] = {}
        for part in ("collectives", "ddp"):  # apart, so that a crash in one leaves the other's figures
            try:
                mp.spawn(run, args=(args.ranks, free_port(), mode, part, args, queue), nprocs=args.ranks, join=True)
                results[mode].update(queue.get())
            except mp.ProcessExitedException as e:
                results[mode][part] = f"failed: {e}"
        os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    backend = "NCCL" if args.cuda else "Gloo"
    print(f"checked collectives, {args.ranks} ranks on {backend}, torch {torch.__version__}: median ms per call")
    print(f"{'':18}" + "".join(f"{m:>14}" for m in MODES) + "".join(f"{m.split()[-1] + ' +':>12}" for m in MODES[1:]))
    for row in ("all_reduce 4 B", "all_reduce 1 MiB", "barrier", "DDP step"):
        values = [results[m].get(row) for m in MODES]
        cells = "".join(f"{v:14.3f}" if v is not None else f"{'-':>14}" for v in values)
        extras = ""
        for v in values[1:]:
            if v is None or values[0] is None:
                extras += f"{'-':>12}"
            elif row == "DDP step":
                extras += f"{100 * (v - values[0]) / values[0]:11.1f}%"
            else:
                extras += f"{v - values[0]:12.3f}"
        print(f"{row:18}{cells}{extras}")
    for mode in MODES:
        for part in ("collectives", "ddp"):
            if part in results[mode]:
                print(f"{mode}, {part}: {results[mode][part]}")


if __name__ == "__main__":
    main()
