#!/usr/bin/env python3
"""What checking every collective costs (lockstep.distributed, issues #24 and #51): per collective and
per DDP step, with no checking, with lockstep's wrapper and with torch's own
TORCH_DISTRIBUTED_DEBUG=DETAIL, on Gloo (CPU) or NCCL (--cuda), at each --ranks; then, with
--simulate, the checked channel's own exchange at up to 64 ranks as threads (`lockstep bench collectives`).

    PYTHONPATH=$PWD/build/python python python/bench/checked_collectives.py [--ranks 2 4] [--cuda]
        [--simulate build/bin/lockstep]

Each mode runs in fresh processes (torch.multiprocessing.spawn, 127.0.0.1); rank 0 prints the median
of --repeats timed runs of --calls collectives (a 4-byte and a 25 MB all_reduce, a barrier) and of
--steps DDP steps (forward, backward with DDP's gradient all_reduce in 1 MB buckets, SGD step) of a
1M-parameter convolutional net on 4 images of 32x32 per rank: several buckets a step, each of which
DDP all-reduces while backward goes on, so a check that holds up each bucket shows. On the CPU it then
times plain Gloo, lockstep.distributed.wrap() and wrap(predict=False) (every collective exchanges its
fingerprint) in turn in one job (the fairer comparison on a loaded or shared machine, whose speed drifts
between separate runs), with the CPU time each takes (every thread of every rank; of it the callers' threads and
the wrapper's own: its channel's worker, heartbeat and Gloo), which a machine with fewer cores than ranks turns
into the others' wall time; --interleaved-only skips the separate runs, --interleaved-modes none lockstep leaves
the exchange wrapper (and its threads) out of that job.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODES = tuple(os.environ.get("BENCH_MODES", "none,lockstep,torch DETAIL").split(","))
ROWS = ("all_reduce 4 B", "all_reduce 25 MB", "barrier", "DDP step, 1 MB buckets")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conv_net():
    """About 1M parameters (963,466) for 3x32x32 images, in 10 tensors of 40 B to 2.4 MB."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(64, 128, 3, stride=2, padding=1),
        torch.nn.SiLU(), torch.nn.Conv2d(128, 256, 3, stride=2, padding=1), torch.nn.SiLU(),
        torch.nn.Conv2d(256, 256, 3, padding=1), torch.nn.SiLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(256, 10))


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


def threads():
    """This process's threads (Linux)."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def threads_cpu_ms(tids):
    """The CPU time of these threads of this process, from Linux's per-thread CPU clocks."""
    total = 0.0
    for tid in tids:
        try:
            total += time.clock_gettime((~tid << 3) | 6) * 1e3  # the thread's CPUCLOCK_SCHED
        except OSError:  # the thread has exited
            pass
    return total


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
        large = torch.ones(25 * 1000 * 1000 // 4, device=device)  # 25 MB of float32
        figures = {
            "all_reduce 4 B": timed(lambda: (dist.all_reduce(small), sync()), args.calls, args.repeats),
            "all_reduce 25 MB": timed(lambda: (dist.all_reduce(large), sync()), max(1, args.calls // 50), args.repeats),
            "barrier": timed(lambda: dist.barrier(), args.calls, args.repeats),
        }
        if rank == 0:
            queue.put(figures)
        dist.destroy_process_group()
        return
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(conv_net().to(device), device_ids=[rank] if args.cuda else None,
                                                      bucket_cap_mb=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 3, 32, 32, device=device)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        sync()

    figures = {"DDP step, 1 MB buckets": timed(step, args.steps, args.repeats)}
    if rank == 0:
        queue.put(figures)
    dist.destroy_process_group()


def interleaved(rank, size, port, args, queue):
    """Plain Gloo and lockstep's wrappers over it (checks on the prediction, and every check an exchange)
    in the same processes, their rounds in turn, so that all see the same machine (a loaded or shared one
    drifts between separate runs): medians of a 4-byte all_reduce and of a DDP step, each model trained
    through its own group."""
    import lockstep.distributed
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    makers = {"none": lambda: dist.group.WORLD, "lockstep": lockstep.distributed.wrap,
              "exchange": lambda: lockstep.distributed.wrap(predict=False)}
    groups, own_threads = {}, {}
    for mode in args.interleaved_modes:  # each wrapper's threads: its channel's worker, heartbeat and Gloo
        before = threads()
        groups[mode] = makers[mode]()
        own_threads[mode] = threads() - before
    small = torch.ones(1)
    x = torch.randn(args.batch, 3, 32, 32)
    trained = {}
    for mode, group in groups.items():
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(conv_net(), process_group=group, bucket_cap_mb=1)
        trained[mode] = (model, torch.optim.SGD(model.parameters(), lr=1e-3))

    def step(mode):
        model, optimizer = trained[mode]
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    rows = {"all_reduce 4 B": (lambda mode: dist.all_reduce(small, group=groups[mode]), args.calls),
            "DDP step, 1 MB buckets": (step, args.steps)}
    figures = {}
    for row, (fn, n) in rows.items():
        times = {mode: [] for mode in groups}
        cpu = {mode: [] for mode in groups}
        own_cpu = {mode: 0.0 for mode in groups}
        caller_cpu = {mode: [] for mode in groups}
        for mode in groups:
            fn(mode)  # warm-up
        modes = list(groups)
        for repeat in range(2 * args.repeats):
            for mode in modes[repeat % len(modes):] + modes[:repeat % len(modes)]:
                dist.barrier()
                start, start_cpu, start_caller = time.perf_counter(), time.process_time(), time.thread_time()
                start_own = threads_cpu_ms(own_threads[mode])
                for _ in range(n):
                    fn(mode)
                times[mode].append((time.perf_counter() - start) / n * 1e3)
                cpu[mode].append((time.process_time() - start_cpu) / n * 1e3)
                caller_cpu[mode].append((time.thread_time() - start_caller) / n * 1e3)
                own_cpu[mode] += (threads_cpu_ms(own_threads[mode]) - start_own) / n / (2 * args.repeats)
        figures[row] = {mode: statistics.median(t) for mode, t in times.items()}
        # The CPU time of every thread of every rank (its backward, Gloo's threads, lockstep's): on a machine
        # with fewer cores than ranks, what one mode's extra work takes from the others' steps; and of it, the
        # wrapper's own threads (the mean over rounds: a tenth of a millisecond a step, below /proc's 10 ms ticks).
        # The caller's thread: the training loop, its backward, and what the wrapper does on it.
        total = torch.tensor([[statistics.median(cpu[mode]) for mode in groups],
                              [statistics.median(caller_cpu[mode]) for mode in groups],
                              [own_cpu[mode] for mode in groups]], dtype=torch.float64)
        dist.all_reduce(total)
        figures[f"{row}, CPU of all ranks"] = dict(zip(groups, total[0].tolist()))
        figures[f"{row}, of it the callers' threads"] = dict(zip(groups, total[1].tolist()))
        figures[f"{row}, of it the wrapper's threads"] = dict(zip(groups, total[2].tolist()))
    if rank == 0:
        queue.put(figures)
    dist.destroy_process_group()


def print_interleaved(ranks, figures):
    print(f"\nthe same, {ranks} ranks, plain Gloo, lockstep.distributed.wrap() and wrap(predict=False) in turn "
          "in one job: median ms (CPU: a step's or call's CPU time, every thread of every rank summed)")
    width = max(len(row) for row in figures) + 2
    print(f"{'':{width}}{'none':>12}{'lockstep':>12}{'+':>9}{'exchange':>12}{'+':>9}")
    for row, by_mode in figures.items():
        none = by_mode["none"]
        line = f"{row:{width}}{none:12.3f}" if "wrapper's threads" not in row else f"{row:{width}}{'-':>12}"
        for mode in ("lockstep", "exchange"):
            if mode not in by_mode:
                line += f"{'-':>12}{'-':>9}"
                continue
            value = by_mode[mode]
            if "wrapper's threads" in row:  # none has no wrapper
                change = ""
            elif row.startswith("DDP"):
                change = f"{100 * (value - none) / none:+.1f}%"
            else:
                change = f"{value - none:+.3f}"
            line += f"{value:12.3f}{change:>9}"
        print(line)
    sys.stdout.flush()


def measure(ranks, args):
    """{mode: {row: median ms, or part: why it failed}} for `ranks` processes."""
    queue = mp.get_context("spawn").SimpleQueue()
    results = {}
    for mode in MODES:
        if mode == "torch DETAIL":
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # the children inherit it
        results[mode] = {}
        for part in ("collectives", "ddp"):  # apart, so that a crash in one leaves the other's figures
            try:
                mp.spawn(run, args=(ranks, free_port(), mode, part, args, queue), nprocs=ranks, join=True)
                results[mode].update(queue.get())
            except mp.ProcessExitedException as e:
                results[mode][part] = f"failed: {e}"
        os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    return results


def print_table(ranks, results, args):
    backend = "NCCL" if args.cuda else "Gloo"
    print(f"\nchecked collectives, {ranks} ranks on {backend}, torch {torch.__version__}: median ms per call")
    print(f"{'':24}" + "".join(f"{m:>14}" for m in MODES) + "".join(f"{m.split()[-1] + ' +':>12}" for m in MODES[1:]))
    for row in ROWS:
        values = [results[m].get(row) for m in MODES]
        cells = "".join(f"{v:14.3f}" if v is not None else f"{'-':>14}" for v in values)
        extras = ""
        for v in values[1:]:
            if v is None or values[0] is None:
                extras += f"{'-':>12}"
            elif row.startswith("DDP step"):
                extras += f"{100 * (v - values[0]) / values[0]:11.1f}%"
            else:
                extras += f"{v - values[0]:12.3f}"
        print(f"{row:24}{cells}{extras}")
    for mode in MODES:
        for part in ("collectives", "ddp"):
            if part in results[mode]:
                print(f"{mode}, {part}: {results[mode][part]}")
    sys.stdout.flush()


def simulate(lockstep, ranks_list, iterations):
    """The checked channel's exchange at many ranks: `lockstep bench collectives` (ranks as threads of one
    process on Gloo over 127.0.0.1), its table for each count."""
    for ranks in ranks_list:
        command = [lockstep, "bench", "collectives", "--ranks", str(ranks), "--iterations", str(iterations),
                   "--port", str(20000 + 100 * ranks)]
        print(f"\n$ {' '.join(command)}", flush=True)
        subprocess.run(command, check=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", help="process counts to measure (default 2 4; 2 with --cuda)")
    parser.add_argument("--cuda", action="store_true", help="NCCL on one GPU per rank")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4, help="images per rank per DDP step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--simulate", metavar="LOCKSTEP", help="the lockstep binary: also time its channel at "
                        "--simulate-ranks ranks as threads")
    parser.add_argument("--simulate-ranks", type=int, nargs="+", default=[2, 8, 64])
    parser.add_argument("--simulate-iterations", type=int, default=40)
    parser.add_argument("--interleaved-modes", nargs="+", default=["none", "lockstep", "exchange"],
                        choices=["none", "lockstep", "exchange"],
                        help="the groups the one-job table takes turns with (none: plain Gloo; none first)")
    parser.add_argument("--interleaved-only", action="store_true", help="only the one-job table (CPU)")
    args = parser.parse_args()
    if args.interleaved_modes[0] != "none":
        parser.error("--interleaved-modes starts with none, which the others are compared with")
    ranks_list = args.ranks or ([2] if args.cuda else [2, 4])
    if args.cuda and torch.cuda.device_count() < max(ranks_list):
        sys.exit(f"--cuda needs {max(ranks_list)} GPUs, {torch.cuda.device_count()} visible")
    for ranks in ranks_list:
        if not args.interleaved_only:
            print_table(ranks, measure(ranks, args), args)
        if not args.cuda:
            queue = mp.get_context("spawn").SimpleQueue()
            mp.spawn(interleaved, args=(ranks, free_port(), args, queue), nprocs=ranks, join=True)
            print_interleaved(ranks, queue.get())
    if args.simulate:
        simulate(args.simulate, args.simulate_ranks, args.simulate_iterations)


if __name__ == "__main__":
    main()
