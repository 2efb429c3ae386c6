#!/usr/bin/env python3
"""Malformed input of every kind lockstep reads, as a table (issue #12, section 7).

Each case damages one input (a checkpoint, a run's config.toml, an IDX data set, a token .npy, an
image folder, a command line), runs the real binary on it, and checks the outcome is a clean one:
the expected exit status (1 bad input, 2 bad command line, 0 where the damage is harmless or the
input is meant to be skipped), "lockstep: error:" on failure, an expected message where the case
names one, no LibTorch stack frames, no signal, no hang (each run has a time limit). Mutations are
seeded, so every run of the test tries the same inputs.

    mutations.py LOCKSTEP        (works in ./mutations-work, made afresh)
"""
import gzip
import array
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib

LS = os.path.abspath(sys.argv[1])
shutil.rmtree("mutations-work", ignore_errors=True)
os.makedirs("mutations-work")
os.chdir("mutations-work")
TIME_LIMIT = 60  # seconds per run: any hang fails the case
failures = []
counts = {}


def run(kind, label, args, allowed, pattern=None):
    """Runs lockstep ARGS; records a failure unless the outcome is clean and as expected."""
    counts[kind] = counts.get(kind, 0) + 1
    start = time.time()
    try:
        p = subprocess.run([LS] + args, capture_output=True, timeout=TIME_LIMIT)
    except subprocess.TimeoutExpired:
        failures.append(f"{kind}/{label}: no answer within {TIME_LIMIT} s (a hang)")
        return
    out = (p.stdout + p.stderr).decode("utf-8", "replace")
    problems = []
    if p.returncode < 0:
        problems.append(f"killed by signal {-p.returncode}")
    elif p.returncode not in allowed:
        problems.append(f"exit {p.returncode}, expected one of {sorted(allowed)}")
    if p.returncode != 0 and "lockstep: error:" not in out and p.returncode != 2:
        problems.append("failed without a 'lockstep: error:' line")
    for bad in ("frame #", "terminate called", "Segmentation fault", "runtime error:", "Aborted", "Sanitizer"):
        if bad in out:
            problems.append(f"output shows '{bad}'")
    if pattern and p.returncode != 0 and not re.search(pattern, out):
        problems.append(f"message does not match '{pattern}'")
    if len(out) > 20000:
        problems.append(f"{len(out)} characters of output")
    if problems:
        tail = out.strip().splitlines()[-3:]
        failures.append(f"{kind}/{label}: {'; '.join(problems)} ({time.time() - start:.1f} s): {tail}")
    return out


# ---- inputs: a small Fashion-MNIST-shaped data set and a trained run ----

def idx(dims, payload):
    return struct.pack(">BBBB", 0, 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + payload


def write_fashion(directory, train=64, test=16, side=28):
    os.makedirs(directory, exist_ok=True)
    for split, n in (("train", train), ("t10k", test)):
        pixels = bytes((i * 7 + n) % 251 for i in range(n * side * side))
        with gzip.open(f"{directory}/{split}-images-idx3-ubyte.gz", "wb") as f:
            f.write(idx([n, side, side], pixels))
        with gzip.open(f"{directory}/{split}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(idx([n], bytes(i % 10 for i in range(n))))


SMALL = ["--threads", "1", "--batch-size", "8", "--set", "model.channels=[8,8]", "--set", "data.test_subset=16"]
write_fashion("data")
subprocess.run([LS, "train", "--data", "data", "--run-dir", "base", "--steps", "2"] + SMALL, check=True,
               capture_output=True)
subprocess.run([LS, "encode", "base", "--data", "data", "-o", "tokens.npy", "--threads", "1"], check=True,
               capture_output=True)
rng = random.Random(12)
case_id = [0]


def fresh_run():
    case_id[0] += 1
    target = f"case{case_id[0]}"
    shutil.copytree("base", target)
    return target


def flip(data, lo, hi, count=1):
    data = bytearray(data)
    for _ in range(count):
        at = rng.randrange(lo, max(lo + 1, hi))
        data[at] ^= 1 << rng.randrange(8)
    return bytes(data)


# ---- checkpoints: eval loads every tensor and the metadata ----

ckpt = open("base/checkpoint.safetensors", "rb").read()
header_len = struct.unpack("<Q", ckpt[:8])[0]
header = json.loads(ckpt[8:8 + header_len])
payload = ckpt[8 + header_len:]


def with_header(h, raw=None):
    text = raw if raw is not None else json.dumps(h).encode()
    return struct.pack("<Q", len(text)) + text + payload


def eval_checkpoint(label, data, allowed=frozenset({1}), pattern=None):
    run_dir = fresh_run()
    with open(f"{run_dir}/checkpoint.safetensors", "wb") as f:
        f.write(data)
    run("checkpoint", label, ["eval", run_dir, "--data", "data", "--threads", "1"], allowed, pattern)


for cut in (0, 4, 8, 9, 8 + header_len // 2, 8 + header_len, len(ckpt) - 1):
    eval_checkpoint(f"cut at {cut}", ckpt[:cut])
eval_checkpoint("header length 2^63", struct.pack("<Q", 1 << 63) + ckpt[8:])
eval_checkpoint("header not JSON", with_header(None, b"{not json" + b" " * 40))
weights = [k for k in header if k != "__metadata__"]
first = weights[0]
for label, change in (
        ("dtype I32", lambda h: h[first].update(dtype="I32")),
        ("dtype unknown", lambda h: h[first].update(dtype="Q7")),
        ("shape doubled", lambda h: h[first].update(shape=[2 * s for s in h[first]["shape"]] or [2])),
        ("offsets past the end", lambda h: h[first].update(data_offsets=[0, len(payload) + 4])),
        ("offsets reversed", lambda h: h[first].update(data_offsets=list(reversed(h[first]["data_offsets"])))),
        ("a tensor missing", lambda h: h.pop(first)),
        ("step negative", lambda h: h["__metadata__"].update(step="-1")),
        ("step with a space", lambda h: h["__metadata__"].update(step=" 10")),
        ("optimizer steps 2^63-1", lambda h: h["__metadata__"].update(optimizer_steps="9223372036854775807")),
        ("metadata not strings", lambda h: h["__metadata__"].update(step=[1, 2])),
):
    h = json.loads(json.dumps(header))
    change(h)
    eval_checkpoint(label, with_header(h))
eval_checkpoint("metadata nested 100,000 deep",
                with_header(None, b'{"__metadata__":{"x":' + b"[" * 100000 + b"]" * 100000 + b"}}"))
dup = json.dumps(header)[:-1] + ', "__metadata__": {"step": "1"}}'
eval_checkpoint("a key twice", with_header(None, dup.encode()))
# Finite weights whose reconstructions overflow float32 (each model weight times 1e30): eval used to print
# "mse -nan psnr inf dB" and exit 0.
huge = bytearray(payload)
for name, info in header.items():
    if name != "__metadata__" and name.startswith("model") and info["dtype"] == "F32":
        begin, end = info["data_offsets"]
        values = array.array("f", bytes(huge[begin:end]))
        huge[begin:end] = array.array("f", (v * 1e30 for v in values)).tobytes()
eval_checkpoint("weights times 1e30", ckpt[:8 + header_len] + bytes(huge), pattern="are not finite")
for n in range(12):  # damage anywhere in the header: refused, or (inside a name or text) harmless
    eval_checkpoint(f"header bit flip {n}", flip(ckpt, 8, 8 + header_len), frozenset({0, 1}))
for n in range(6):  # a weight's bits: undetectable unless they make NaN or infinity
    eval_checkpoint(f"payload bit flip {n}", flip(ckpt, 8 + header_len, len(ckpt), 50), frozenset({0, 1}))

# ---- config.toml of a run, read on resume ----

config = open("base/config.toml", "rb").read()


def resume_with(label, text, allowed=frozenset({1}), pattern=None):
    run_dir = fresh_run()
    with open(f"{run_dir}/config.toml", "wb") as f:
        f.write(text)
    run("config", label, ["train", "--resume", run_dir, "--steps", "3", "--threads", "1"], allowed, pattern)


resume_with("empty", b"", frozenset({1}))
resume_with("unknown key", config.replace(b"[train]\n", b"[train]\nno_such_key = 1\n"), pattern="no_such_key")
resume_with("wrong type", config.replace(b"batch_size = 8", b'batch_size = "eight"'), pattern="batch_size")
resume_with("huge integer", config.replace(b"batch_size = 8", b"batch_size = 99999999999999999999999"))
resume_with("20,000-part table name", b"[" + b".".join([b"a"] * 20000) + b"]\n", pattern="nests")
resume_with("not UTF-8", config.replace(b"[train]", b"[train]\nx\xff = 1"))
resume_with("non-ASCII bare key", config + b"\nrate\xcf\xba = 1\n", pattern="invalid TOML")
lines = config.split(b"\n")
for n in range(8):  # whole lines dropped or repeated: a refused file or (a comment) harmless
    mutated = list(lines)
    at = rng.randrange(len(mutated))
    mutated.insert(at, mutated[at]) if n % 2 else mutated.pop(at)
    resume_with(f"line {at} {'repeated' if n % 2 else 'dropped'}", b"\n".join(mutated), frozenset({0, 1}))

# ---- token files for decode ----

tokens = open("tokens.npy", "rb").read()
npy_header_end = tokens.index(b"\n") + 1
npy_dict = tokens[10:npy_header_end]


def decode_tokens(label, data, allowed=frozenset({1}), pattern=None):
    case_id[0] += 1
    path = f"tokens{case_id[0]}.npy"
    with open(path, "wb") as f:
        f.write(data)
    run("tokens", label, ["decode", "base", "--tokens", path, "--grid", f"grid{case_id[0]}.png", "--threads", "1"],
        allowed, pattern)


def npy_with(header_text, body):
    text = header_text.encode()
    text += b" " * ((64 - (10 + len(text) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


body = tokens[npy_header_end:]
shape = re.search(rb"'shape': \(([^)]*)\)", npy_dict).group(1).decode()
for cut in (0, 6, 9, npy_header_end - 1, npy_header_end + 3, len(tokens) - 1):
    decode_tokens(f"cut at {cut}", tokens[:cut])
for label, header_text in (
        ("float tokens", "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % shape),
        ("Fortran order", "{'descr': '<i4', 'fortran_order': True, 'shape': (%s), }" % shape),
        ("negative shape", "{'descr': '<i4', 'fortran_order': False, 'shape': (-2, 7, 7), }"),
        ("empty grid", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 0, 7), }"),
        ("shape claims 2^40", "{'descr': '<i4', 'fortran_order': False, 'shape': (1099511627776, 7, 7), }"),
        ("not a dict", "[1, 2, 3]"),
):
    decode_tokens(label, npy_with(header_text, body))
for value, label in ((-1, "token -1"), (1 << 20, "token past the codebook")):
    decode_tokens(label, tokens[:npy_header_end] + struct.pack("<i", value) + body[4:], pattern="token|index")
run("tokens", "/dev/zero itself", ["decode", "base", "--tokens", "/dev/zero", "--grid", "z.png"], {1, 2})

# ---- IDX data sets, read by train ----


def train_on(label, directory, allowed=frozenset({1}), pattern=None):
    run("idx", label, ["train", "--data", directory, "--run-dir", f"r_{directory}", "--steps", "1"] + SMALL,
        allowed, pattern)


good = open("data/train-images-idx3-ubyte.gz", "rb").read()
raw = gzip.decompress(good)
for n, (label, data) in enumerate((
        ("gzip cut short", good[:len(good) // 2]),
        ("gzip garbage", good[:10] + bytes(rng.randrange(256) for _ in range(200))),
        ("magic flipped", gzip.compress(b"\x01" + raw[1:])),
        ("element type float", gzip.compress(raw[:2] + b"\x0d" + raw[3:])),
        ("one more image claimed", gzip.compress(raw[:4] + struct.pack(">I", 65) + raw[8:])),
        ("dimension zero", gzip.compress(raw[:8] + struct.pack(">I", 0) + raw[12:])),
        ("dimensions of 2^32-1", gzip.compress(raw[:4] + b"\xff" * 12 + raw[16:])),
        ("trailing bytes", gzip.compress(raw + b"extra")),
)):
    directory = f"idx{n}"
    write_fashion(directory)
    with open(f"{directory}/train-images-idx3-ubyte.gz", "wb") as f:
        f.write(data)
    train_on(label, directory)
write_fashion("idx_labels")
with gzip.open("idx_labels/train-labels-idx1-ubyte.gz", "wb") as f:
    f.write(idx([64], bytes([200] * 64)))
train_on("label 200", "idx_labels", pattern="label")
write_fashion("idx_size")
write_fashion("idx_size_test", side=32)
shutil.copy("idx_size_test/t10k-images-idx3-ubyte.gz", "idx_size/t10k-images-idx3-ubyte.gz")
train_on("test images 32x32", "idx_size", pattern="test images are 32x32")


def doctor_on(label, directory, pattern):
    """doctor --data DIR applies train's checks: a warning matching `pattern`, exit 0 (doctor never fails)."""
    out = run("idx", f"doctor: {label}", ["doctor", "--quick", "--data", directory], {0})
    if out is not None and not re.search(pattern, out, re.S):
        failures.append(f"idx/doctor: {label}: no warning matching '{pattern}'")


doctor_on("test images 32x32", "idx_size", r"default settings refuses it: its test images are 32x32")
for side in (14, 1):
    write_fashion(f"idx_side{side}", train=600, test=200, side=side)
    run("idx", f"images {side}x{side}", ["train", "--data", f"idx_side{side}", "--run-dir", f"r_side{side}",
                                          "--steps", "1", "--threads", "1"], {1}, f"images of {side}x{side} cannot pass")
    doctor_on(f"images {side}x{side}", f"idx_side{side}",
              rf"600 training and 200 test images\), refused by training.*training images of {side}x{side} cannot pass")

# ---- image folders: damaged files are named and left out; the run goes on ----


def png(width, height, seed):
    rows = b"".join(b"\x00" + bytes((x * 7 + y * 3 + seed) % 256 for x in range(width * 3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


os.makedirs("folder", exist_ok=True)
for n in range(24):
    open(f"folder/good{n:02d}.png", "wb").write(png(40, 40, n))
whole = png(40, 40, 99)
for n in range(16):
    damaged = flip(whole, 8, len(whole), 3) if n % 2 else whole[:rng.randrange(1, len(whole))]
    open(f"folder/damaged{n:02d}.png", "wb").write(damaged)
open("folder/claims.png", "wb").write(whole[:16] + struct.pack(">II", 30000, 30000) + whole[24:])
open("folder/empty.jpg", "wb").write(b"")
open("folder/not-really.jpg", "wb").write(b"plain text")
open("folder/caf\xe9.png".encode("latin-1"), "wb").write(whole)
os.symlink("loop.png", "folder/loop.png")
run("folder", "24 good images among 21 damaged or odd ones",
    ["train", "--data", "folder", "--run-dir", "r_folder", "--steps", "1", "--buckets", "32x32", "--threads", "1",
     "--batch-size", "8", "--set", "model.channels=[8,8]"], {0})

# ---- command lines ----

for label, args, allowed in (
        ("threads 100000", ["train", "--threads", "100000"], {1, 2}),
        ("batch size 0", ["train", "--batch-size", "0"], {1, 2}),
        ("batch size of 21 digits", ["train", "--batch-size", "999999999999999999999"], {1, 2}),
        ("steps -1", ["train", "--steps", "-1"], {1, 2}),
        ("lr nan", ["train", "--lr", "nan"], {1, 2}),
        ("lr 1e400", ["train", "--lr", "1e400"], {1, 2}),
        ("channels empty", ["train", "--set", "model.channels=[]"], {1, 2}),
        ("set without a value", ["train", "--set", "train.lr"], {1, 2}),
        ("world size 0", ["train", "--world-size", "0"], {1, 2}),
        ("buckets 0x0", ["train", "--data", "folder", "--buckets", "0x0"], {1, 2}),
        ("eval limit of 20 digits", ["eval", "base", "--limit", "99999999999999999999"], {1, 2}),
        ("an unknown subcommand", ["tokenize"], {1, 2}),
        ("a config that is a directory", ["train", "--config", "base"], {1, 2}),
        ("an empty grid path", ["eval", "base", "--grid", ""], {2}),
        ("an empty decode grid path", ["decode", "base", "--tokens", "base", "--grid", ""], {2}),
):
    run("cli", label, args + ["--run-dir", f"r_cli{case_id[0]}"] if args[0] == "train" else args, allowed)
    case_id[0] += 1

# An empty run directory would silently mean runs/<date-time>.
run("cli", "an empty run directory", ["train", "--run-dir", ""], {2}, "--run-dir.*empty string")

summary = ", ".join(f"{n} {kind}" for kind, n in counts.items())
print(f"mutations: {sum(counts.values())} cases ({summary})")
if failures:
    print(f"{len(failures)} case(s) did not end cleanly:")
    for f in failures:
        print("  " + f)
    sys.exit(1)
print("every case ended cleanly")
