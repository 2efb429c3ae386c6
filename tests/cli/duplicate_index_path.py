#!/usr/bin/env python3
"""Damages a token index for a CLI test: the second path of the first bucket with two or more
becomes a copy of the first. duplicate_index_path.py TOKENS_DIR"""
import json
import sys

path = sys.argv[1] + "/index.json"
with open(path) as f:
    index = json.load(f)
bucket = next(b for b in index["buckets"] if len(b["paths"]) > 1)
bucket["paths"][1] = bucket["paths"][0]
with open(path, "w") as f:
    json.dump(index, f)
