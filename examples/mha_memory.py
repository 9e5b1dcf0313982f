#!/usr/bin/env python3
"""mha_memory.py: the seed experiment end to end. A multi-head attention
layer's forward (E = 1024, 16 heads, fp32, batch 1, batch_first) with a
key_padding_mask that masks the last P/8 keys, computed two ways:

  dhsa P     project-written numpy code (in-projection from W_q, W_k, W_v
             [E, E] with biases, split heads, dhsa.attention with the
             key_padding_mask, merge heads, out-projection). No PyTorch.
  torch P    torch.nn.MultiheadAttention(E, 16, batch_first=True) in eval()
             and torch.inference_mode(): PyTorch's fast path.
  compare P  both on the same weights and input; prints max-abs-diff.

dhsa/torch run ONE forward and print the process's peak RSS, so that

  build/dhsa memprobe --sizes 512,1024,2048,4096,8192 -- python3 examples/mha_memory.py dhsa {n}

measures how peak memory grows with P. Without PyTorch, torch and compare
exit with status 3 and say so; usage errors exit with 2.

Run from the repository root after `make` (the dhsa package is found under
python/ and finds build/libdhsa.so itself).
"""

import resource
import sys
import time
from pathlib import Path

E, HEADS = 1024, 16
USAGE = "usage: mha_memory.py dhsa|torch|compare P   (P: sequence length, a positive integer)"

# ------------------------------------------------------------- helpers ---


def peak_rss_bytes():
    """VmHWM from /proc (Linux), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def report(mode, P, out_shape, seconds):
    peak = peak_rss_bytes()
    print("mode %s P %d E %d heads %d: output %s in %.3f s" % (mode, P, E, HEADS, list(out_shape),
                                                              seconds))
    print("peak_rss_bytes %d (%.1f MiB)" % (peak, peak / 2**20))


def import_dhsa():
    try:
        import dhsa
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
        import dhsa
    return dhsa


def import_torch():
    try:
        import torch
    except Exception as e:  # not installed, or installed but broken
        sys.stderr.write("mha_memory.py: this mode needs PyTorch, which is not importable here "
                         "(%s); install it with `pip install torch`\n" % e)
        sys.exit(3)
    return torch


def padding_mask(P):
    """[1, P] bool, True = padding (PyTorch key_padding_mask): the last P/8 keys."""
    import numpy as np
    m = np.zeros((1, P), dtype=bool)
    m[:, P - P // 8:] = True
    return m

# ------------------------------------------------------- dhsa forward ---


def random_weights(rng):
    """W_q, W_k, W_v, W_o [E, E] and biases [E], float32 (PyTorch-like scale)."""
    import numpy as np
    s = np.float32(1.0 / np.sqrt(E))
    w = {n: rng.standard_normal((E, E), dtype=np.float32) * s for n in ("W_q", "W_k", "W_v", "W_o")}
    w.update({n: rng.standard_normal(E, dtype=np.float32) * np.float32(0.1)
              for n in ("b_q", "b_k", "b_v", "b_o")})
    return w


def mha_forward_dhsa(dhsa, x, key_padding_mask, w):
    """Multi-head attention forward, batch_first.

    x [B, P, E] float32; key_padding_mask [B, P] bool (True = ignore the
    key); w: W_q, W_k, W_v, W_o [E, E] (y = x W^T + b, as nn.Linear), b_q,
    b_k, b_v, b_o [E]. Returns [B, P, E] float32. Extra memory: the
    projections q, k, v, the attention output and the result, each [B, P, E];
    the attention itself adds only dhsa's fixed workspace."""
    B, P, _ = x.shape
    d = E // HEADS
    x2 = x.reshape(B * P, E)
    heads = []
    for W, b in (("W_q", "b_q"), ("W_k", "b_k"), ("W_v", "b_v")):
        y = x2 @ w[W].T          # [B*P, E]
        y += w[b]
        heads.append(y.reshape(B, P, HEADS, d))  # split heads: a BLHD view, no copy
    q, k, v = heads
    o = dhsa.attention(q, k, v, key_padding_mask=key_padding_mask, layout="BLHD")  # [B, P, H, d]
    del q, k, v, heads
    out = o.reshape(B * P, E) @ w["W_o"].T  # merge heads: a view, no copy
    out += w["b_o"]
    return out.reshape(B, P, E)


def run_dhsa(P):
    import numpy as np
    dhsa = import_dhsa()
    rng = np.random.default_rng(0)
    w = random_weights(rng)
    x = rng.standard_normal((1, P, E), dtype=np.float32)
    m = padding_mask(P)
    t0 = time.perf_counter()
    out = mha_forward_dhsa(dhsa, x, m, w)
    report("dhsa", P, out.shape, time.perf_counter() - t0)

# ------------------------------------------------------ torch forward ---


def torch_module(torch):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, HEADS, batch_first=True).eval()
    with torch.no_grad():  # non-zero biases, so the comparison checks them too
        mha.in_proj_bias.normal_(std=0.1)
        mha.out_proj.bias.normal_(std=0.1)
    return mha


def torch_forward(torch, mha, x, kpm):
    with torch.inference_mode():
        out, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    return out


def run_torch(P):
    torch = import_torch()
    mha = torch_module(torch)
    x = torch.randn(1, P, E)
    kpm = torch.from_numpy(padding_mask(P))
    t0 = time.perf_counter()
    out = torch_forward(torch, mha, x, kpm)
    report("torch", P, tuple(out.shape), time.perf_counter() - t0)


def run_compare(P):
    torch = import_torch()
    import numpy as np
    dhsa = import_dhsa()
    mha = torch_module(torch)
    W = mha.in_proj_weight.detach().numpy()
    b = mha.in_proj_bias.detach().numpy()
    w = {"W_q": W[:E], "W_k": W[E:2 * E], "W_v": W[2 * E:],
         "b_q": b[:E], "b_k": b[E:2 * E], "b_v": b[2 * E:],
         "W_o": mha.out_proj.weight.detach().numpy(), "b_o": mha.out_proj.bias.detach().numpy()}
    x = np.random.default_rng(1).standard_normal((1, P, E), dtype=np.float32)
    m = padding_mask(P)
    t0 = time.perf_counter()
    ref = torch_forward(torch, mha, torch.from_numpy(x), torch.from_numpy(m)).numpy()
    t1 = time.perf_counter()
    out = mha_forward_dhsa(dhsa, x, m, w)
    t2 = time.perf_counter()
    keep_rows = P - P // 8
    diff = np.abs(out.astype(np.float64) - ref)
    print("compare P %d E %d heads %d, key_padding_mask on the last %d keys (no query row is "
          "fully masked)" % (P, E, HEADS, P // 8))
    print("torch %s: %.3f s; dhsa: %.3f s" % (torch.__version__, t1 - t0, t2 - t1))
    print("max_abs_diff %.3g (all rows), %.3g (rows of non-padding positions), max |torch| %.3g"
          % (diff.max(), diff[:, :keep_rows].max(), np.abs(ref).max()))
    print("torch output has NaN: %s; rows of padding positions all zero in torch: %s"
          % (bool(np.isnan(ref).any()), bool(np.all(ref[:, keep_rows:] == 0))))


def main(argv):
    if len(argv) != 3 or argv[1] not in ("dhsa", "torch", "compare"):
        sys.stderr.write(USAGE + "\n")
        return 2
    try:
        P = int(argv[2])
    except ValueError:
        P = 0
    if P < 1:
        sys.stderr.write(USAGE + "\n")
        return 2
    {"dhsa": run_dhsa, "torch": run_torch, "compare": run_compare}[argv[1]](P)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
