#!/usr/bin/env python3
"""Forward+backward of lockstep's modules beside vector-quantize-pytorch's, in one Python process,
at the shapes of docs/performance.md: prints each median time and the ratio (issue #11, item 7).

    PYTHONPATH=build/python python python/bench/compare_reference.py [--threads N] [--min-time S]
        [--device cuda] [--compile] [--tokenizer] [--filter NAME]

Each case: training mode, random input of the case's shape, output times a fixed weight summed plus
the auxiliary loss, backward; the median of at least 5 runs over at least --min-time seconds, after
a warm-up. Both modules run the same input with the same torch thread count, on the same device.
On CUDA each run ends with a synchronize, and the table adds each module's peak memory of a step
(torch.cuda.max_memory_allocated above what was allocated before it); a module that runs out of
memory is reported so. --tokenizer: the shapes of an image tokenizer (32 images of 32 x 32 tokens;
d 8, 32 and 256; K up to 2^18; residual stacks of 8) instead of docs/performance.md's.
--compile: both modules through torch.compile (the warm-up compiles).
"""
import argparse
import importlib.metadata
import statistics
import time

import torch
import vector_quantize_pytorch as vqp

import lockstep


def synchronize(x):
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def step(module, x, weights):
    x = x.detach().requires_grad_(True)
    result = module(x)
    loss = (result[0] * weights).sum()
    if len(result) > 2 and torch.is_tensor(result[2]):
        loss = loss + result[2].sum()  # per layer for the residual modules
    loss.backward()


def median_seconds(module, x, min_time):
    """The median seconds of a step, and on CUDA the peak bytes one step allocated beyond what was
    allocated before it (None on the CPU)."""
    weights = torch.randn_like(x)  # the output has the input's shape
    for _ in range(2):
        step(module, x, weights)
    synchronize(x)
    peak = None
    if x.is_cuda:
        module.zero_grad(set_to_none=True)
        before = torch.cuda.memory_allocated(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
        step(module, x, weights)
        synchronize(x)
        peak = torch.cuda.max_memory_allocated(x.device) - before
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        step(module, x, weights)
        synchronize(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times), peak


def measure(module, x, min_time):
    """(milliseconds text, memory text) of one module, or 'out of memory'."""
    try:
        seconds, peak = median_seconds(module, x, min_time)
    except torch.OutOfMemoryError:
        module.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return None, "out of memory", "-"
    memory = "-" if peak is None else f"{peak / 2**20:.0f} MiB"
    return seconds, f"{seconds * 1e3:.2f} ms", memory


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
    # The reference's implicit beam search takes one item alone (its shapes disagree for more).
    ("ResidualVQ implicit beam 2", "1x1024, d 32, 4 x K 256",
     lambda: (vqp.ResidualVQ(dim=32, codebook_size=256, num_quantizers=4, implicit_neural_codebook=True, beam_size=2),
              lockstep.ResidualVQ(dim=32, codebook_size=256, num_quantizers=4, implicit_neural_codebook=True,
                                  beam_size=2)), (1, 1024, 32)),
    ("VectorQuantize in-place optimizer", "16x1024, d 64, K 512, Adam",
     lambda: (vqp.VectorQuantize(dim=64, codebook_size=512, learnable_codebook=True, ema_update=False,
                                 in_place_codebook_optimizer=_adam),
              lockstep.VectorQuantize(dim=64, codebook_size=512, learnable_codebook=True, ema_update=False,
                                      in_place_codebook_optimizer=_adam)), (16, 1024, 64)),
    ("LFQ masked", "16x1024, K 2^10, half the items",
     lambda: (_Masked(vqp.LFQ(codebook_size=2**10)), _Masked(lockstep.LFQ(codebook_size=2**10))), (16, 1024, 10)),
]


def _adam(parameters):
    return torch.optim.Adam(parameters, lr=1e-3)


def _vq_pair(d, k):
    return lambda: (vqp.VectorQuantize(dim=d, codebook_size=k), lockstep.VectorQuantize(dim=d, codebook_size=k))


# An image tokenizer's shapes: 32 images of 32 x 32 tokens (32,768 tokens a step).
TOKENIZER_CASES = [
    ("FSQ", "32x1024, levels 8,5,5,5", lambda: (vqp.FSQ(levels=[8, 5, 5, 5]), lockstep.FSQ(levels=[8, 5, 5, 5])),
     (32, 1024, 4)),
    ("FSQ with projections", "32x1024, dim 256 -> levels 8,8,8,5,5,5",
     lambda: (vqp.FSQ(levels=[8, 8, 8, 5, 5, 5], dim=256), lockstep.FSQ(levels=[8, 8, 8, 5, 5, 5], dim=256)),
     (32, 1024, 256)),
    ("LFQ", "32x1024, K 2^10", lambda: (vqp.LFQ(codebook_size=2**10), lockstep.LFQ(codebook_size=2**10)),
     (32, 1024, 10)),
    ("LFQ", "32x1024, K 2^14", lambda: (vqp.LFQ(codebook_size=2**14), lockstep.LFQ(codebook_size=2**14)),
     (32, 1024, 14)),
    ("LFQ", "32x1024, K 2^18", lambda: (vqp.LFQ(codebook_size=2**18), lockstep.LFQ(codebook_size=2**18)),
     (32, 1024, 18)),
    ("VectorQuantize", "32x1024, d 8, K 1024", _vq_pair(8, 1024), (32, 1024, 8)),
    ("VectorQuantize", "32x1024, d 32, K 16384", _vq_pair(32, 16384), (32, 1024, 32)),
    ("VectorQuantize", "32x1024, d 256, K 16384", _vq_pair(256, 16384), (32, 1024, 256)),
    ("VectorQuantize", "32x1024, d 8, K 262144", _vq_pair(8, 2**18), (32, 1024, 8)),
    ("VectorQuantize", "32x1024, d 32, K 262144", _vq_pair(32, 2**18), (32, 1024, 32)),
    ("ResidualVQ", "32x1024, d 256, 8 x K 1024",
     lambda: (vqp.ResidualVQ(dim=256, codebook_size=1024, num_quantizers=8),
              lockstep.ResidualVQ(dim=256, codebook_size=1024, num_quantizers=8)), (32, 1024, 256)),
    ("ResidualFSQ", "32x1024, d 256, 8 x levels 8,5,5,5",
     lambda: (vqp.ResidualFSQ(dim=256, levels=[8, 5, 5, 5], num_quantizers=8),
              lockstep.ResidualFSQ(dim=256, levels=[8, 5, 5, 5], num_quantizers=8)), (32, 1024, 256)),
    ("ResidualLFQ", "32x1024, d 256, 8 x K 2^10",
     lambda: (vqp.ResidualLFQ(dim=256, codebook_size=2**10, num_quantizers=8),
              lockstep.ResidualLFQ(dim=256, codebook_size=2**10, num_quantizers=8)), (32, 1024, 256)),
]


class _Masked(torch.nn.Module):
    """An LFQ called with a mask of the items (b,): the first half count."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        mask = torch.arange(x.shape[0], device=x.device) < x.shape[0] // 2
        return self.inner(x, mask=mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per case and module (default 1)")
    parser.add_argument("--filter", default="", help="only the cases whose module name contains this")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: both modules run there")
    parser.add_argument("--compile", action="store_true", help="both modules through torch.compile")
    parser.add_argument("--tokenizer", action="store_true", help="an image tokenizer's shapes (see above)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{args.threads} thread(s)"
    print(f"torch {torch.__version__}, vector-quantize-pytorch {importlib.metadata.version('vector-quantize-pytorch')}, "
          f"{where}{', compiled' if args.compile else ''}")
    on_gpu = device.type == "cuda"
    print("| module | shape | vector-quantize-pytorch | lockstep | lockstep is |" +
          (" memory: reference | lockstep |" if on_gpu else ""))
    print("| --- | --- | --- | --- | --- |" + (" --- | --- |" if on_gpu else ""))
    for name, shape_text, make, shape in TOKENIZER_CASES if args.tokenizer else CASES:
        if args.filter not in name:
            continue
        reference, ours = (m.to(device).train() for m in make())
        if args.compile:
            reference, ours = torch.compile(reference), torch.compile(ours)
        x = torch.randn(*shape, device=device)
        t_ref, ref_text, ref_memory = measure(reference, x, args.min_time)
        t_ours, ours_text, ours_memory = measure(ours, x, args.min_time)
        ratio = f"{t_ref / t_ours:.1f}x as fast" if t_ref and t_ours else "-"
        print(f"| {name} | {shape_text} | {ref_text} | {ours_text} | {ratio} |" +
              (f" {ref_memory} | {ours_memory} |" if on_gpu else ""), flush=True)
        del reference, ours
        if on_gpu:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
