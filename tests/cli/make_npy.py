#!/usr/bin/env python3
"""Writes a .npy file without NumPy, for CLI tests: make_npy.py OUT DESCR SHAPE FILL_BYTE
e.g. make_npy.py f.npy '<f4' 1,14,14 0  ->  float32 zeros of shape (1, 14, 14)."""
import struct
import sys

out, descr, shape, fill = sys.argv[1], sys.argv[2], tuple(int(s) for s in sys.argv[3].split(",")), int(sys.argv[4])
itemsize = int(descr[2:])
count = 1
for d in shape:
    count *= d
header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(shape))
pad = 64 - (10 + len(header) + 1) % 64
header = header + " " * (pad % 64) + "\n"
with open(out, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
    f.write(bytes([fill]) * (count * itemsize))
