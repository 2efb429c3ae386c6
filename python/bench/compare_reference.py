#!/usr/bin/env python3
"""Forward+backward of lockstep's modules beside vector-quantize-pytorch's, in one Python process,
at the shapes of docs/performance.md: prints each median time and the ratio (issue #11, item 7).

    PYTHONPATH=build/python python python/bench/compare_reference.py [--threads N] [--min-time S]

Each case: training mode, random input of the case's shape, output times a fixed weight summed plus
the auxiliary loss, backward; the median of at least 5 runs over at least --min-time seconds, after
a warm-up. Both modules run the same input with the same torch thread count.
"""
import argparse
import importlib.metadata
import statistics
import time

import torch
import vector_quantize_pytorch as vqp

import lockstep


def step(module, x, weights):
    x = x.detach().requires_grad_(True)
    result = module(x)
    loss = (result[0] * weights).sum()
    if len(result) > 2 and torch.is_tensor(result[2]):
        loss = loss + result[2].sum()  # per layer for the residual modules
    loss.backward()


def median_seconds(module, x, min_time):
    weights = torch.randn_like(x)  # the output has the input's shape
    for _ in range(2):
        step(module, x, weights)
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        step(module, x, weights)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


CASES = [
    ("FSQ", "16x1024, levels 8,5,5,5", lambda: (vqp.FSQ(levels=[8, 5, 5, 5]), lockstep.FSQ(levels=[8, 5, 5, 5])),
     (16, 1024, 4)),
    ("FSQ with projections", "16x1024, dim 64 -> levels 8,5,5,5",
     lambda: (vqp.FSQ(levels=[8, 5, 5, 5], dim=64), lockstep.FSQ(levels=[8, 5, 5, 5], dim=64)), (16, 1024, 64)),
    ("LFQ", "16x1024, K 2^10", lambda: (vqp.LFQ(codebook_size=2**10), lockstep.LFQ(codebook_size=2**10)),
     (16, 1024, 10)),
    ("LFQ", "16x1024, K 2^14", lambda: (vqp.LFQ(codebook_size=2**14), lockstep.LFQ(codebook_size=2**14)),
     (16, 1024, 14)),
    ("VectorQuantize", "16x1024, d 64, K 512",
     lambda: (vqp.VectorQuantize(dim=64, codebook_size=512), lockstep.VectorQuantize(dim=64, codebook_size=512)),
     (16, 1024, 64)),
    ("ResidualVQ", "16x1024, d 64, 4 x K 512",
     lambda: (vqp.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4),
              lockstep.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4)), (16, 1024, 64)),
    ("ResidualFSQ", "16x1024, 4 x levels 8,5,5,5",
     lambda: (vqp.ResidualFSQ(levels=[8, 5, 5, 5], num_quantizers=4),
              lockstep.ResidualFSQ(levels=[8, 5, 5, 5], num_quantizers=4)), (16, 1024, 4)),
    ("ResidualLFQ", "16x1024, 4 x K 2^10",
     lambda: (vqp.ResidualLFQ(dim=10, codebook_size=2**10, num_quantizers=4),
              lockstep.ResidualLFQ(dim=10, codebook_size=2**10, num_quantizers=4)), (16, 1024, 10)),
    # The options issue #38 added (the reference updates only the first layer under beam search).
    ("ResidualVQ beam 2", "16x1024, d 64, 4 x K 512",
     lambda: (vqp.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4, beam_size=2),
              lockstep.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4, beam_size=2)), (16, 1024, 64)),
    ("ResidualVQ beam 4", "16x1024, d 64, 4 x K 512",
     lambda: (vqp.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4, beam_size=4),
              lockstep.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4, beam_size=4)), (16, 1024, 64)),
    ("ResidualVQ shared codebook", "16x1024, d 64, 4 x K 512",
     lambda: (vqp.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4, shared_codebook=True),
              lockstep.ResidualVQ(dim=64, codebook_size=512, num_quantizers=4, shared_codebook=True)),
     (16, 1024, 64)),
    ("ResidualVQ implicit codebook", "4x256, d 32, 4 x K 256",
     lambda: (vqp.ResidualVQ(dim=32, codebook_size=256, num_quantizers=4, implicit_neural_codebook=True),
              lockstep.ResidualVQ(dim=32, codebook_size=256, num_quantizers=4, implicit_neural_codebook=True)),
     (4, 256, 32)),
    ("LFQ masked", "16x1024, K 2^10, half the items",
     lambda: (_Masked(vqp.LFQ(codebook_size=2**10)), _Masked(lockstep.LFQ(codebook_size=2**10))), (16, 1024, 10)),
]


class _Masked(torch.nn.Module):
    """An LFQ called with a mask of the items (b,): the first half count."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        mask = torch.arange(x.shape[0]) < x.shape[0] // 2
        return self.inner(x, mask=mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per case and module (default 1)")
    parser.add_argument("--filter", default="", help="only the cases whose module name contains this")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, vector-quantize-pytorch {importlib.metadata.version('vector-quantize-pytorch')}, "
          f"{args.threads} thread(s)")
    print("| module | shape | vector-quantize-pytorch | lockstep | lockstep is |")
    print("| --- | --- | --- | --- | --- |")
    for name, shape_text, make, shape in CASES:
        if args.filter not in name:
            continue
        reference, ours = make()
        reference.train()
        ours.train()
        x = torch.randn(*shape)
        t_ref = median_seconds(reference, x, args.min_time)
        t_ours = median_seconds(ours, x, args.min_time)
        print(f"| {name} | {shape_text} | {t_ref * 1e3:.2f} ms | {t_ours * 1e3:.2f} ms | "
              f"{t_ref / t_ours:.1f}x as fast |", flush=True)


if __name__ == "__main__":
    main()
