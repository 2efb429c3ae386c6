#!/usr/bin/env python3
"""lockstep's modules on a CUDA device (bench/gpu_check.sh runs this; pytest does not collect it).
Each module is moved with .cuda(): what liblockstep holds must move with it, and training steps on
the GPU must match the same steps on the CPU, eager and (three modules) under torch.compile. Exit 0 when all match, 1 otherwise, 77 with no GPU.

    PYTHONPATH=build/python python3 python/tests/cuda_check.py
"""
import copy
import sys

import torch

import lockstep

CASES = [
    ("VectorQuantize", lambda: lockstep.VectorQuantize(dim=16, codebook_size=64, kmeans_init=True), (4, 64, 16)),
    ("FSQ", lambda: lockstep.FSQ(levels=[8, 5, 5, 5], dim=16), (4, 64, 16)),
    ("LFQ", lambda: lockstep.LFQ(dim=16, codebook_size=2**10, commitment_loss_weight=0.25), (4, 64, 16)),
    ("ResidualVQ", lambda: lockstep.ResidualVQ(dim=16, codebook_size=32, num_quantizers=3), (4, 64, 16)),
    ("ResidualFSQ", lambda: lockstep.ResidualFSQ(levels=[8, 5, 5], num_quantizers=3, dim=16), (4, 64, 16)),
    ("ResidualLFQ", lambda: lockstep.ResidualLFQ(dim=16, codebook_size=2**8, num_quantizers=2), (4, 64, 16)),
]


def train_steps(module, inputs, device):
    """Three training steps; the outputs, indices, input gradients and final state, on the CPU."""
    results = []
    for x in inputs:
        x = x.detach().to(device).requires_grad_(True)  # a fresh leaf on each device
        out, idx, *loss = module(x)
        total = (out * torch.linspace(-1, 1, out.numel(), device=device).reshape(out.shape)).sum()
        if loss:
            total = total + loss[0].sum()
        total.backward()
        results.append((out.detach().cpu(), idx.cpu(), x.grad.cpu()))
    state = getattr(module, "_orig_mod", module).state_dict()  # a compiled module's, unprefixed
    return results, {k: v.detach().cpu() for k, v in state.items() if torch.is_tensor(v)}


def check(name, make, shape, compiled=False):
    torch.manual_seed(0)
    cpu = make()
    gpu = copy.deepcopy(cpu).cuda()
    if compiled:  # the custom op lockstep::quantize on the GPU, inductor's code around it
        gpu = torch.compile(gpu, fullgraph=True)
    module = getattr(gpu, "_orig_mod", gpu)
    held = list(module._core.parameters().values()) + list(module._core.buffers().values())
    if not all(t.is_cuda for t in held):
        return f"liblockstep's tensors stayed on {sorted({str(t.device) for t in held})} after .cuda()"
    off = [k for k, t in module.state_dict().items() if torch.is_tensor(t) and not t.is_cuda]
    if off:
        return f"the state dict's {off} are not on the GPU after .cuda()"
    for attr in ("codebook", "codebooks", "implicit_codebook"):  # computed or held, they follow the module
        if isinstance(getattr(type(module), attr, None), property) and not getattr(module, attr).is_cuda:
            return f"{attr} is not on the GPU after .cuda()"
    inputs = [torch.randn(*shape) for _ in range(3)]
    (want, want_state), (got, got_state) = train_steps(cpu, inputs, "cpu"), train_steps(gpu, inputs, "cuda")
    for step, ((o1, i1, g1), (o2, i2, g2)) in enumerate(zip(want, got)):
        same = (i1 == i2).float().mean().item()
        if same < 0.99:  # a value at a rounding or distance tie may go the other way on another device
            return f"step {step}: only {same:.1%} of the indices equal the CPU's"
        if not torch.allclose(o1, o2, atol=1e-3, rtol=1e-3) and same == 1.0:
            return f"step {step}: outputs differ from the CPU's by {(o1 - o2).abs().max():.2e}"
        if same == 1.0 and not torch.allclose(g1, g2, atol=1e-3, rtol=1e-3):
            return f"step {step}: input gradients differ from the CPU's by {(g1 - g2).abs().max():.2e}"
    for key, value in want_state.items():
        if value.is_floating_point() and not torch.allclose(value, got_state[key], atol=1e-3, rtol=1e-3):
            return f"state {key} differs from the CPU's by {(value - got_state[key]).abs().max():.2e}"
    return None


def main():
    if not torch.cuda.is_available():
        print("cuda_check: no CUDA device")
        return 77
    failures = 0
    runs = [(name, make, shape, False) for name, make, shape in CASES]
    runs += [(name + " compiled", make, shape, True) for name, make, shape in CASES[:3]]
    for name, make, shape, compiled in runs:
        problem = check(name, make, shape, compiled)
        print(f"{'FAIL' if problem else 'PASS'} {name}{': ' + problem if problem else ''}", flush=True)
        failures += problem is not None
    print(f"cuda_check: {len(runs) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
