#!/usr/bin/env python3
"""Compares two runs' metrics.jsonl: exits 1 when a logged step's loss differs by more than the
tolerance (relative), so a distributed run can be checked against one process.
Names after the tolerance compare those figures instead, each in every record of its kind: `name`
for training records ("kind": "train"), `KIND:name` for another kind (e.g. `eval_ema:psnr_db`)."""
import json
import sys


def figures(path, kind, name):
    out = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == kind:
                out[record["step"]] = record[name]
    return out


def main():
    tolerance = float(sys.argv[3])
    failed = False
    for spec in sys.argv[4:] or ["loss"]:
        kind, name = spec.split(":", 1) if ":" in spec else ("train", spec)
        a, b = figures(sys.argv[1], kind, name), figures(sys.argv[2], kind, name)
        if not a or sorted(a) != sorted(b):
            print(f"{kind} steps differ: {sorted(a)} vs {sorted(b)}")
            return 1
        worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in a)
        print(f"{len(a)} {kind} steps, largest relative {name} difference {worst:.2e} (tolerance {tolerance:.0e})")
        failed |= worst > tolerance
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
