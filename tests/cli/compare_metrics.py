#!/usr/bin/env python3
"""Compares two runs' metrics.jsonl: exits 1 when a logged step's loss differs by more than the
tolerance (relative), so a distributed run can be checked against one process.
Names after the tolerance compare those figures instead, each in every record of its kind: `name`
for training records ("kind": "train"), `KIND:name` for another kind (e.g. `eval_ema:psnr_db`).
`--first N` (before the paths) compares only the first N logged steps: a step's promise (G4, one
step within float32 rounding) holds there on any CPU, before a near-tie flip lets whole runs drift.

    compare_metrics.py [--first N] A/metrics.jsonl B/metrics.jsonl TOLERANCE [NAME...]"""
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
    args = sys.argv[1:]
    first = None
    if args[:1] == ["--first"]:
        first, args = int(args[1]), args[2:]
    tolerance = float(args[2])
    failed = False
    for spec in args[3:] or ["loss"]:
        kind, name = spec.split(":", 1) if ":" in spec else ("train", spec)
        a, b = figures(args[0], kind, name), figures(args[1], kind, name)
        if not a or sorted(a) != sorted(b):
            print(f"{kind} steps differ: {sorted(a)} vs {sorted(b)}")
            return 1
        steps = sorted(a)[:first]
        worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in steps)
        print(f"{len(steps)} {kind} steps, largest relative {name} difference {worst:.2e} (tolerance {tolerance:.0e})")
        failed |= worst > tolerance
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
