"""The CLI trainer beside research-style PyTorch code of the same architecture.

Trains the demo's tokenizer (`lockstep train` defaults: the conv autoencoder with channels 16,32,64 and one
residual block, FSQ levels 8,5,5,5, MSE, Adam at lr 2e-3, batch 64) for the same number of steps on the same
Fashion-MNIST images twice: once with the CLI, once as a plain PyTorch loop (nn.Module, a shuffled tensor
of images, zero_grad / backward / step) with vector-quantize-pytorch's FSQ (lockstep's when the reference is
not installed). The CLI checkpoint's parameter names and shapes must equal the loop's model's. Prints one
table: images/s (median of the logged windows after the first, each side timed the same way) and the last
window's mean loss.

    python3 python/bench/trainer_vs_pytorch.py --lockstep build/bin/lockstep [--device cuda:0] [--steps 300]
"""
import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

LEVELS = [8, 5, 5, 5]
CHANNELS = [16, 32, 64]


def read_images(data_dir, limit):
    """Fashion-MNIST's training images as float (n, 1, 28, 28) in [-1, 1], as the CLI scales them."""
    path = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    count, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    images = np.frombuffer(raw, np.uint8, offset=16).reshape(count, 1, rows, cols)
    if limit:
        images = images[:limit]
    return torch.from_numpy(images.astype(np.float32)) / 127.5 - 1


class ResBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(nn.functional.silu(self.conv1(nn.functional.silu(x))))


class Autoencoder(nn.Module):
    """The CLI's conv architecture (src/model/autoencoder.cpp), layer for layer."""

    def __init__(self, quantizer, dim, in_channels=1, channels=CHANNELS):
        super().__init__()
        enc = [nn.Conv2d(in_channels, channels[0], 3, padding=1)]
        for a, b in zip(channels, channels[1:]):
            enc += [nn.SiLU(), nn.Conv2d(a, b, 3, stride=2, padding=1)]
        self.encoder = nn.Sequential(*enc, ResBlock(channels[-1]), nn.SiLU())
        self.to_latent = nn.Conv2d(channels[-1], dim, 1)
        self.quantizer = quantizer
        self.from_latent = nn.Conv2d(dim, channels[-1], 1)
        dec = [ResBlock(channels[-1])]
        for a, b in zip(reversed(channels), list(reversed(channels))[1:]):
            dec += [nn.SiLU(), nn.ConvTranspose2d(a, b, 4, stride=2, padding=1)]
        self.decoder = nn.Sequential(*dec, nn.SiLU(), nn.Conv2d(channels[0], in_channels, 3, padding=1))

    def forward(self, x):
        z = self.to_latent(self.encoder(x))
        b, d, h, w = z.shape
        tokens = z.permute(0, 2, 3, 1).reshape(b, h * w, d)
        quantized = self.quantizer(tokens)[0]
        q = quantized.reshape(b, h, w, d).permute(0, 3, 1, 2)
        return self.decoder(self.from_latent(q))


def checkpoint_shapes(path):
    """The model's parameter shapes in a CLI checkpoint (safetensors: its JSON header), the quantizer's left out."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return {k[len("model/"):]: v["shape"] for k, v in header.items()
            if k.startswith("model/") and not k.startswith("model/quantizer")}


def check_same_architecture(cli_shapes, model):
    ours = {k: list(p.shape) for k, p in model.named_parameters() if not k.startswith("quantizer")}
    if ours != cli_shapes:
        differ = sorted(k for k in set(ours) | set(cli_shapes) if ours.get(k) != cli_shapes.get(k))
        sys.exit("trainer_vs_pytorch: the PyTorch model is not the CLI's: "
                 + "; ".join(f"{k}: CLI {cli_shapes.get(k)}, PyTorch {ours.get(k)}" for k in differ))


def make_fsq(which):
    if which == "reference":
        from vector_quantize_pytorch import FSQ
        return FSQ(levels=LEVELS)
    import lockstep
    return lockstep.FSQ(levels=LEVELS)


def pytorch_run(args, images, device, which, cli_shapes):
    torch.manual_seed(0)
    model = Autoencoder(make_fsq(which), len(LEVELS)).to(device)
    check_same_architecture(cli_shapes, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    images = images.to(device)
    order = torch.randperm(len(images), device=device)
    steps_per_epoch = len(images) // args.batch
    rates, losses, window_loss = [], [], 0.0

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sync()
    window_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        at = (step - 1) % steps_per_epoch
        if at == 0 and step > 1:
            order = torch.randperm(len(images), device=device)
        x = images[order[at * args.batch:(at + 1) * args.batch]]
        loss = nn.functional.mse_loss(model(x), x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        window_loss = window_loss + loss.detach()
        if step % args.log_every == 0:
            losses.append(float(window_loss) / args.log_every)  # a host read, as the CLI's logged windows make
            window_loss = 0.0
            sync()
            now = time.perf_counter()
            rates.append(args.log_every * args.batch / (now - window_start))
            window_start = now
    return rates, losses


def cli_run(args, work):
    run_dir = os.path.join(work, "cli")
    command = [args.lockstep, "train", "--run-dir", run_dir, "--data", args.data, "--steps", str(args.steps),
               "--batch-size", str(args.batch), "--lr", str(args.lr), "--set", f"train.device={args.device}",
               "--set", f"train.log_every={args.log_every}", "--set", "train.eval_every=0",
               "--set", "train.checkpoint_every=0", "--set", "data.test_subset=64"]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.train_subset:
        command += ["--set", f"data.train_subset={args.train_subset}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        sys.exit(f"trainer_vs_pytorch: `{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    train = [r for r in records if r["kind"] == "train"]
    return [r["images_per_s"] for r in train], [r["loss"] for r in train], checkpoint_shapes(
        os.path.join(run_dir, "checkpoint.safetensors"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lockstep", required=True, help="the lockstep program (build/bin/lockstep)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST's .gz files")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N, for both sides")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of each side")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--log-every", type=int, default=25, help="steps per timed window (the first is left out)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads of both sides; 0: their defaults")
    parser.add_argument("--train-subset", type=int, default=0, help="only the first N training images (0: all)")
    parser.add_argument("--quantizer", choices=["reference", "lockstep", "auto"], default="auto",
                        help="the PyTorch side's FSQ: vector-quantize-pytorch's, lockstep's, or the reference "
                             "when it is installed")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds the CLI may take")
    args = parser.parse_args()
    if args.steps < 2 * args.log_every:
        parser.error(f"--steps {args.steps} gives fewer than two windows of --log-every {args.log_every}")
    which = args.quantizer
    if which == "auto":
        try:
            import vector_quantize_pytorch  # noqa: F401
            which = "reference"
        except ImportError:
            which = "lockstep"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    images = read_images(args.data, args.train_subset)
    with tempfile.TemporaryDirectory() as work:
        cli_rates, cli_losses, cli_shapes = cli_run(args, work)
    torch_rates, torch_losses = pytorch_run(args, images, device, which, cli_shapes)
    rows = [("lockstep train (CLI)", cli_rates, cli_losses),
            (f"PyTorch loop, {'vector-quantize-pytorch' if which == 'reference' else 'lockstep'} FSQ",
             torch_rates, torch_losses)]
    print(f"# {args.steps} steps of batch {args.batch} on {args.device}, {len(images)} Fashion-MNIST images, "
          f"torch {torch.__version__}")
    print("| trainer | images/s (median of windows after the first) | last window's loss |")
    print("| --- | --- | --- |")
    for name, rates, losses in rows:
        print(f"| {name} | {statistics.median(rates[1:]):.0f} | {losses[-1]:.4f} |")
    print(f"ratio CLI / PyTorch: {statistics.median(cli_rates[1:]) / statistics.median(torch_rates[1:]):.2f}x")


if __name__ == "__main__":
    main()
