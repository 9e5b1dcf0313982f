"""torch_route_cpu.py: the torch back end's DHSA on the CPU against the C
back end (docs/torch.md, "DHSA in the torch back end"): router times
(median of 3), sparse attention times (one run) and dense SDPA, 8 q / 2 kv
heads, d 128, causal, RouterParams.for_length(L, 0.0625), float32; the
blocks whose layouts agree and the outputs' max |diff|.

Run: DHSA_LIB=build/libdhsa.so PYTHONPATH=python \\
     ~/.cache/dhsa-torch-venv/bin/python bench/torch_route_cpu.py [L ...]
"""
import sys
import time

import torch

import dhsa
from dhsa.torch import _ops, _route


def main(sizes):
    torch.manual_seed(0)
    print("L | torch router s | C router s | blocks equal | gather kernel s | C sparse s | "
          "dense SDPA s | max |diff|")
    for L in sizes:
        q = torch.randn(1, 8, L, 128)
        k = torch.randn(1, 2, L, 128)
        v = torch.randn(1, 2, L, 128)
        p = dhsa.RouterParams.for_length(L, 0.0625)
        ts, tc = [], []
        for _ in range(3):
            t = time.perf_counter()
            lay = _route.route(q, k, causal=True, params=p)
            ts.append(time.perf_counter() - t)
            t = time.perf_counter()
            cl = dhsa.route(q.numpy(), k.numpy(), causal=True, params=p)
            tc.append(time.perf_counter() - t)
        same = sum(int(cl.ranges(0, g, i).shape == lay.ranges(0, g, i).shape
                       and (cl.ranges(0, g, i) == lay.ranges(0, g, i)).all())
                   for g in range(2) for i in range(cl.n_blocks))
        with torch.inference_mode():
            t = time.perf_counter()
            o = _ops.attention(q, k, v, backend="torch", causal=True, sparse=lay)
            tg = time.perf_counter() - t
            t = time.perf_counter()
            oc = _ops.attention(q, k, v, backend="c", causal=True, sparse=cl)
            tcs = time.perf_counter() - t
            t = time.perf_counter()
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)
            td = time.perf_counter() - t
        print("%d | %.3f | %.3f | %d/%d | %.2f | %.2f | %.2f | %.1e" % (
            L, sorted(ts)[1], sorted(tc)[1], same, 2 * cl.n_blocks, tg, tcs, td,
            (o - oc).abs().max()))
        cl.close()


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [8192, 16384])
