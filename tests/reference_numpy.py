#!/usr/bin/env python3
"""NumPy reads the .npy files vit writes (tests/test_npy.cpp, tests/test_attention_export.cpp).

  roundtrip OURS:THEIRS:SHAPE ...   float32 arange(n) * 0.5 of SHAPE ("2,3,4"; "" for a scalar), saved again to THEIRS
  check PATH:SHAPE ...              little-endian float32 of SHAPE ("2x5x5"), C order, finite; prints each header
  resave IN OUT                     numpy.save(OUT, numpy.load(IN)): NumPy's own bytes for the same array
"""
import sys

import numpy


def roundtrip(items):
    for item in items:
        ours, theirs, shape = item.rsplit(":", 2)
        a = numpy.load(ours)
        want = tuple(int(d) for d in shape.split(",") if d)
        assert a.dtype == numpy.float32, (ours, a.dtype)
        assert a.shape == want, (ours, a.shape, want)
        assert (a.ravel() == numpy.arange(a.size, dtype=numpy.float32) * 0.5).all(), (ours, a)
        numpy.save(theirs, a)


def check(items):
    for item in items:
        path, shape = item.rsplit(":", 1)
        with open(path, "rb") as f:
            major, minor = numpy.lib.format.read_magic(f)
            read = numpy.lib.format.read_array_header_1_0 if major == 1 else numpy.lib.format.read_array_header_2_0
            header = read(f)  # (shape, fortran_order, dtype)
        a = numpy.load(path, allow_pickle=False)
        want = tuple(int(x) for x in shape.split("x"))
        assert a.dtype == numpy.float32 and a.dtype.byteorder in "<=", (path, a.dtype)
        assert a.shape == want and header[0] == want and not header[1], (path, a.shape, want, header)
        assert numpy.isfinite(a).all(), path
        print(path, (major, minor), a.dtype, a.shape)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("roundtrip", "check", "resave"):
        sys.exit(__doc__)
    command, items = sys.argv[1], sys.argv[2:]
    if command == "resave":
        numpy.save(items[1], numpy.load(items[0]))
    else:
        {"roundtrip": roundtrip, "check": check}[command](items)


if __name__ == "__main__":
    main()
