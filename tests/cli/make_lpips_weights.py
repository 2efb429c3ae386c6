#!/usr/bin/env python3
"""Writes random LPIPS-VGG weights as a safetensors file without NumPy or torch, for CLI tests:
make_lpips_weights.py OUT [SEED]. He-scaled convolutions, non-negative heads (docs/losses.md)."""
import json
import math
import random
import struct
import sys

CONVS = [(1, 0, 3, 64), (1, 2, 64, 64), (2, 5, 64, 128), (2, 7, 128, 128), (3, 10, 128, 256), (3, 12, 256, 256),
         (3, 14, 256, 256), (4, 17, 256, 512), (4, 19, 512, 512), (4, 21, 512, 512), (5, 24, 512, 512),
         (5, 26, 512, 512), (5, 28, 512, 512)]
HEADS = [64, 128, 256, 512, 512]


def main():
    out, seed = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rng = random.Random(seed)
    tensors = []
    for s, i, cin, cout in CONVS:
        std = math.sqrt(2 / (9 * cin))
        tensors.append((f"net.slice{s}.{i}.weight", [cout, cin, 3, 3], lambda: rng.gauss(0, std)))
        tensors.append((f"net.slice{s}.{i}.bias", [cout], lambda: 0.0))
    for k, c in enumerate(HEADS):
        tensors.append((f"lin{k}.model.1.weight", [1, c, 1, 1], lambda: abs(rng.gauss(0, 1))))
    header, blobs, offset = {}, [], 0
    for name, shape, draw in tensors:
        count = math.prod(shape)
        blob = struct.pack(f"<{count}f", *(draw() for _ in range(count)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main()
