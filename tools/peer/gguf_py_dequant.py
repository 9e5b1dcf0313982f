#!/usr/bin/env python3
"""gguf_py_dequant.py: dhsa's dequantization against a peer, llama.cpp's
gguf-py (the `gguf` Python package, numpy), bit for bit.

For each block type both support: 64 random blocks (random codes, random
finite f16 scales, every fifth block's scales subnormal or zero), decoded by
gguf.quants.dequantize and by dhsa__dequantize_row on every ISA this machine
has (scalar, AVX2, AVX-512); prints the number of differing values and exits
1 if any differ. A one-off peer check (docs/quant.md), not part of make test.

  python3 -m venv /tmp/gguf-env && /tmp/gguf-env/bin/pip install gguf==0.19.0
  make build/libdhsa.a && /tmp/gguf-env/bin/python tools/peer/gguf_py_dequant.py
"""
import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "build", "peer_deq")

# byte offsets of each block's f16 scales (docs/quant.md)
SCALES = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.IQ4_NL: (0,),
          T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_XS: (0,)}


def main():
    subprocess.run(["cc", "-std=c11", "-O1", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src"),
                    os.path.join(ROOT, "tools", "peer", "deq.c"), os.path.join(ROOT, "build", "libdhsa.a"),
                    "-lpthread", "-lm", "-o", BIN], check=True)
    rng = np.random.default_rng(1)
    bad = 0
    for t, offs in SCALES.items():
        blk, bb = GGML_QUANT_SIZES[t]
        nb = 64
        raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        for o in offs:
            h = raw[:, o].astype(np.uint16) | (raw[:, o + 1].astype(np.uint16) << 8)
            h = np.where(((h >> 10) & 31) == 31, h & 0xBFFF, h)  # Inf/NaN -> finite
            h = np.where(np.arange(nb) % 5 == 4, h & 0x83FF, h)  # subnormal or zero now and then
            raw[:, o] = h & 0xFF
            raw[:, o + 1] = h >> 8
        ref = dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
        for isa, name in ((0, "scalar"), (1, "avx2"), (2, "avx512")):
            r = subprocess.run([BIN, str(int(t)), str(nb * blk), str(isa)], input=raw.tobytes(), capture_output=True)
            if r.returncode != 0:
                print(f"{t.name:7s} {name:7s} not run: {r.stderr.decode().strip()}")
                continue
            got = np.frombuffer(r.stdout, dtype=np.float32)
            nd = int(np.sum(got.view(np.uint32) != ref.view(np.uint32))) if got.size == ref.size else ref.size
            bad += nd
            print(f"{t.name:7s} {name:7s} {nd} of {ref.size} values differ from gguf-py")
    print("gguf_py_dequant: " + ("all bitwise equal" if bad == 0 else f"{bad} values differ"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
