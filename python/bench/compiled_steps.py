"""Times a compiled training step (forward + backward) of lockstep's modules on the CPU:
`PYTHONPATH=build/python python python/bench/compiled_steps.py [--threads N] [--backend aot_eager|inductor]`.
Prints the mean of 5 steps after 2 for 16 x 1024 tokens of dimension 64 (docs/python/torch.md, "torch.compile")."""
import argparse
import time

import torch

import lockstep

CASES = {
    "ResidualVQ 4 x K 512": lambda: lockstep.ResidualVQ(dim=64, num_quantizers=4, codebook_size=512),
    "VectorQuantize K 1024": lambda: lockstep.VectorQuantize(dim=64, codebook_size=1024),
    "FSQ 8-5-5-5": lambda: lockstep.FSQ(levels=[8, 5, 5, 5], dim=64),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(16, 1024, 64, requires_grad=True)
    for name, make in CASES.items():
        torch._dynamo.reset()
        net = torch.compile(make().train(), fullgraph=True, backend=args.backend)

        def step():
            out = net(x)
            (out[0].square().sum() + (out[2].sum() if len(out) > 2 else 0)).backward()
        for _ in range(2):
            step()
        start, steps = time.perf_counter(), 5
        for _ in range(steps):
            step()
        print(f"{name}: {(time.perf_counter() - start) / steps * 1000:.1f} ms per forward+backward")


if __name__ == "__main__":
    main()
