#!/usr/bin/env python3
"""Writes the Sobol data of shardes-hlo from SciPy (run in a throw-away venv with scipy):

- crates/shardes-hlo/data/sobol_joe_kuo_6_21201.bin: the Joe-Kuo direction numbers
  `new-joe-kuo-6.21201` (S. Joe and F. Y. Kuo, "Constructing Sobol sequences with better
  two-dimensional projections", SIAM J. Sci. Comput. 30, 2635-2654 (2008);
  https://web.maths.unsw.edu.au/~fkuo/sobol/), as SciPy ships them in
  scipy/stats/_sobol_direction_numbers.npz, bit-packed (format in prng/sobol.rs);
- crates/shardes-hlo/tests/fixtures/sobol_scipy.json: unshifted Sobol points of
  scipy.stats.qmc.Sobol(scramble=False, bits=32) as exact 32-bit integers.

Usage: python tools/sobol_tables.py (from the repository root).
"""
import json
import os

import numpy as np
import scipy
from scipy.stats import qmc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
npz = np.load(os.path.join(os.path.dirname(scipy.stats.__file__), "_sobol_direction_numbers.npz"))
poly, vinit = npz["poly"], npz["vinit"]
assert poly.shape == (21201,) and poly[0] == 1


class Bits:
    def __init__(self):
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def put(self, value, width):
        assert 0 <= value < (1 << width) or width == 0
        self.acc |= value << self.n
        self.n += width
        while self.n >= 8:
            self.out.append(self.acc & 0xFF)
            self.acc >>= 8
            self.n -= 8

    def finish(self):
        if self.n:
            self.out.append(self.acc & 0xFF)
        return bytes(self.out)


bits = Bits()
dims = len(poly) - 1  # dimension 0 (van der Corput) has no entry
for d in range(1, len(poly)):
    p = int(poly[d])
    s = p.bit_length() - 1
    a = (p >> 1) & ((1 << (s - 1)) - 1)
    assert p == (1 << s) | (a << 1) | 1, d
    bits.put(s, 5)
    bits.put(a, s - 1)
    for i in range(1, s + 1):
        m = int(vinit[d, i - 1])
        assert m % 2 == 1 and m < (1 << i), (d, i, m)
        bits.put(m >> 1, i - 1)
blob = b"SOBOLJK1" + dims.to_bytes(4, "little") + bits.finish()
with open(os.path.join(ROOT, "crates/shardes-hlo/data/sobol_joe_kuo_6_21201.bin"), "wb") as f:
    f.write(blob)

INDICES = 300
DIMS = [0, 1, 2, 3, 4, 5, 6, 7, 17, 100, 1000, 5000, 21200]
top = max(DIMS) + 1
pts = qmc.Sobol(top, scramble=False, bits=32).random(INDICES)
ints = np.round(pts * 2.0**32).astype(np.uint64)
assert np.all(ints.astype(np.float64) == pts * 2.0**32)
fixture = {
    "source": f"scipy.stats.qmc.Sobol(d={top}, scramble=False, bits=32).random({INDICES}), "
    f"times 2^32; scipy {scipy.__version__}",
    "indices": INDICES,
    "dims": DIMS,
    "points": [[int(ints[i, d]) for d in DIMS] for i in range(INDICES)],
}
with open(os.path.join(ROOT, "crates/shardes-hlo/tests/fixtures/sobol_scipy.json"), "w") as f:
    json.dump(fixture, f, separators=(",", ":"))
    f.write("\n")
print(len(blob), "bytes of direction numbers,", INDICES, "points in", len(DIMS), "dimensions")
