#!/usr/bin/env python3
"""What plain Gloo does when two ranks disagree about a collective: the facts behind the checked
channel's rule that a collective's check must finish before its data moves (docs/distributed.md,
"What the check costs").

    python python/bench/gloo_mismatch.py          # every case, 2 processes each, ~40 s

Each case runs 2 fresh processes (torch.multiprocessing, 127.0.0.1, Gloo with an 8 s timeout) and
prints how each rank ended: its exception, or the signal that killed it, and after how long.
"""
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = {
    "all_reduce of 3 vs 5 floats": lambda r: dist.all_reduce(torch.ones(3 if r == 0 else 5)),
    "all_reduce of float32 vs float64": lambda r: dist.all_reduce(
        torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64)),
    "all_reduce sum vs max": lambda r: _show(dist.all_reduce, torch.tensor([1.0 + r]),
                                             op=dist.ReduceOp.SUM if r == 0 else dist.ReduceOp.MAX),
    "all_reduce vs broadcast": lambda r: dist.all_reduce(torch.ones(4)) if r == 0 else dist.broadcast(torch.ones(4), 0),
    "all_reduce vs all_gather": lambda r: dist.all_reduce(torch.ones(4)) if r == 0 else dist.all_gather(
        [torch.zeros(4), torch.zeros(4)], torch.ones(4)),
}


def _show(collective, tensor, **kwargs):
    collective(tensor, **kwargs)
    return f"got {tensor.tolist()}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, port, case, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=8))
    start = time.monotonic()
    try:
        got = CASES[case](rank)
        queue.put((rank, f"returned after {time.monotonic() - start:.2f} s, no error"
                   + (f": {got}" if isinstance(got, str) else "")))
    except Exception as e:  # noqa: BLE001 (what Gloo raised is the finding)
        queue.put((rank, f"{type(e).__name__} after {time.monotonic() - start:.2f} s: {str(e).splitlines()[0][:110]}"))


def main():
    context = mp.get_context("spawn")
    print(f"plain Gloo, 2 processes, torch {torch.__version__}; each rank: how it ended")
    for case in CASES:
        queue = context.SimpleQueue()
        start = time.monotonic()
        port = free_port()
        processes = [context.Process(target=rank_main, args=(r, port, case, queue)) for r in range(2)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(60)
        ended = {}
        while not queue.empty():
            rank, text = queue.get()
            ended[rank] = text
        print(f"\n{case} ({time.monotonic() - start:.1f} s in all):")
        for rank, p in enumerate(processes):
            if p.exitcode is None:
                p.kill()
            why = ended.get(rank) or (f"killed by signal {-p.exitcode}" if p.exitcode and p.exitcode < 0
                                      else f"exited {p.exitcode} without a word")
            print(f"  rank {rank}: {why}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
