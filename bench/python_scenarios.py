#!/usr/bin/env python3
"""The extra-forward scenarios of docs/python/distributed.md, run with vector-quantize-pytorch's modules and with
lockstep's, on 2 CPU processes (Gloo); prints one table row per scenario with each library's outcome.

A small tokenizer (linear -> quantizer -> linear) trains 4 steps, gradients averaged by hand, while rank 0
alone runs one extra forward of the quantizer mid-training: in training mode with gradients, in training
mode under no_grad, or in evaluation mode. Outcomes: "completes, ranks identical", "completes, ranks
differ" (a parameter or buffer differs between the ranks), "fails: <error>" (a rank raised), or "hangs"
(a rank still running after the time limit; the processes are killed).

    PYTHONPATH=build/python python3 bench/python_scenarios.py
"""
import datetime
import multiprocessing as mp
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

TIME_LIMIT = 40  # seconds per scenario; the Gloo timeout below is 15 s
MODES = ("train", "train_no_grad", "eval")


def make(library, name):
    if library == "lockstep":
        import lockstep as lib
        extra = dict(collective_timeout=15.0)
    else:
        import vector_quantize_pytorch as lib
        extra = {}
    return {
        "VectorQuantize": lambda: lib.VectorQuantize(dim=8, codebook_size=16, **extra),
        "FSQ": lambda: lib.FSQ(levels=[5, 5, 5], dim=8, **extra),
        "FSQ, noise dropout": lambda: lib.FSQ(levels=[5, 5, 5], dim=8, preserve_symmetry=True, noise_dropout=0.5,
                                              **extra),
        "LFQ": lambda: lib.LFQ(dim=8, codebook_size=2**4, **extra),
        "ResidualVQ": lambda: lib.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, **extra),
        "ResidualFSQ, quantize dropout": lambda: lib.ResidualFSQ(levels=[5, 5, 5], num_quantizers=3, dim=8,
                                                                 quantize_dropout=True, **extra),
        "ResidualLFQ": lambda: lib.ResidualLFQ(dim=8, num_quantizers=2, codebook_size=2**4, **extra),
    }[name]()


def aux(out):
    return out[2].sum() if len(out) == 3 and torch.is_tensor(out[2]) else out[0].new_zeros(())


def rank_main(rank, library, name, mode, store, results):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=15))
    try:
        torch.manual_seed(0)
        encoder, quantizer, decoder = nn.Linear(6, 8), make(library, name), nn.Linear(8, 6)
        params = [p for m in (encoder, quantizer, decoder) for p in m.parameters()]
        optimizer = torch.optim.SGD(params, lr=0.1)
        data = torch.randn(4, 4, 5, 6, generator=torch.Generator().manual_seed(1))
        for step in range(4):
            x = data[step].chunk(2)[rank]
            if rank == 0 and step == 2:
                if mode == "eval":
                    quantizer.eval()
                    with torch.no_grad():
                        quantizer(encoder(x))
                    quantizer.train()
                elif mode == "train_no_grad":
                    with torch.no_grad():
                        quantizer(encoder(x))
                else:
                    quantizer(encoder(x))
            out = quantizer(encoder(x))
            loss = nn.functional.mse_loss(decoder(out[0]), x) + aux(out)
            optimizer.zero_grad()
            loss.backward()
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= 2
            optimizer.step()
        state = torch.cat([t.detach().float().flatten() for m in (encoder, quantizer, decoder)
                           for t in m.state_dict().values() if torch.is_tensor(t) and t.is_floating_point()])
        gathered = [torch.empty_like(state) for _ in range(2)]
        dist.all_gather(gathered, state)
        results[rank] = "identical" if torch.equal(gathered[0], gathered[1]) else "differ"
    except Exception as e:  # noqa: BLE001 - the outcome is the point
        results[rank] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def scenario(library, name, mode):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=rank_main, args=(r, library, name, mode, os.path.join(tmp, "store"), results))
                 for r in range(2)]
        start = time.time()
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.1, TIME_LIMIT - (time.time() - start)))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
        seconds = time.time() - start
        if hung:
            return f"hangs (killed after {TIME_LIMIT} s)"
        outcome = [results.get(r, "no result") for r in range(2)]
        errors = [o for o in outcome if o.startswith("error")]
        if errors:
            return f"fails after {seconds:.0f} s ({errors[0][7:]})"
        return "completes, ranks " + outcome[0]


def main():
    names = sys.argv[1:] or ["VectorQuantize", "FSQ", "FSQ, noise dropout", "LFQ", "ResidualVQ",
                             "ResidualFSQ, quantize dropout", "ResidualLFQ"]
    print("| module | rank 0's extra forward | vector-quantize-pytorch 1.32.0 | lockstep |")
    print("| --- | --- | --- | --- |")
    for name in names:
        for mode in MODES:
            row = [scenario(library, name, mode) for library in ("reference", "lockstep")]
            print(f"| {name} | {mode.replace('_', ' ')} | {row[0]} | {row[1]} |", flush=True)


if __name__ == "__main__":
    main()
