#!/usr/bin/env python3
"""Compares the training losses of two runs' metrics.jsonl: exits 1 when a logged step's loss differs
by more than the tolerance (relative), so a distributed run can be checked against one process."""
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == "train":
                out[record["step"]] = record["loss"]
    return out


def main():
    a, b, tolerance = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
    if not a or sorted(a) != sorted(b):
        print(f"logged steps differ: {sorted(a)} vs {sorted(b)}")
        return 1
    worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in a)
    print(f"{len(a)} logged steps, largest relative loss difference {worst:.2e} (tolerance {tolerance:.0e})")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
