#!/usr/bin/env python3
"""route_probe.py: which chunk boundaries and scores would select a
retrieval needle, on the dense keys and queries bench/route_dump.c wrote.

  python3 bench/route_probe.py DUMP [DUMP ...]

Per layer and KV head: the true attention share of the last q_block rows
on the needle (max over the group's heads), and for each routing variant
the share of the needle's keys its selection at the given density would
cover (sinks, local diagonal, then chunks in score order under a budget,
as route.c selects). A development tool (docs/dhsa.md, "Real pretrained
models"): numbers for choosing, not a test.
"""
import sys
import numpy as np


def load(path):
    with open(path, "rb") as f:
        h = np.frombuffer(f.read(9 * 8), dtype=np.int64)
        assert h[0] == 0x44485341
        nl, hq, hkv, d, n, r, lo, hi = (int(x) for x in h[1:])
        scale = float(np.frombuffer(f.read(4), dtype=np.float32)[0])
        layers = []
        for _ in range(nl):
            k = np.frombuffer(f.read(hkv * n * d * 4), dtype=np.float32).reshape(hkv, n, d)
            q = np.frombuffer(f.read(hq * r * d * 4), dtype=np.float32).reshape(hq, r, d)
            layers.append((k.astype(np.float64), q.astype(np.float64)))
    return dict(nl=nl, hq=hq, hkv=hkv, d=d, n=n, r=r, lo=lo, hi=hi, scale=scale, layers=layers)


def sim_scores(k, w, centre):
    """Causal similarity score per position: mean over KV heads of
    1 - cos(k[t], mean k[t-w, t)) (route.c, causal_boundaries)."""
    hkv, n, d = k.shape
    s = np.zeros(n)
    for g in range(hkv):
        kk = k[g] - (k[g].mean(0) if centre else 0)
        cs = np.cumsum(np.vstack([np.zeros((1, d)), kk]), 0)
        for t in range(1, n):
            a = cs[t] - cs[max(0, t - w)]
            b = kk[t]
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            s[t] += (1 - (a @ b) / (na * nb)) / hkv if na > 0 and nb > 0 else 0
    return s


def nms_starts(score, n, thr, nms, mn, mx):
    valid = score[1:]
    cut = valid.mean() + thr * valid.std()
    cands = [t for t in range(1, n) if score[t] >= cut and not (t > 1 and score[t - 1] > score[t])
             and not (t + 1 < n and score[t + 1] > score[t])]
    cands.sort(key=lambda t: (-score[t], t))
    gap = max(nms + 1, mn)
    kept = []
    for t in cands:
        if t < mn or n - t < mn:
            continue
        if any(abs(t - x) < gap for x in kept):
            continue
        kept.append(t)
    kept.sort()
    starts, prev = [], 0
    for e in kept + [n]:
        ln = e - prev
        parts = (ln + mx - 1) // mx
        starts += [prev + ln * j // parts for j in range(parts)]
        prev = e
    return starts + [n]


def fixed_starts(n, c):
    return list(range(0, n, c)) + [n]


def chunk_scores(k, q, starts, scale, mode, centre):
    """k [n][d] of one KV head, q [G][R][d] the group's heads' rows."""
    if centre:
        k = k - k.mean(0)
    nc = len(starts) - 1
    mu = np.array([k[starts[c]:starts[c + 1]].mean(0) for c in range(nc)])
    var = np.array([k[starts[c]:starts[c + 1]].var(0) for c in range(nc)])
    ln = np.array([starts[c + 1] - starts[c] for c in range(nc)], dtype=np.float64)
    if mode == "moments":
        qm = q.mean((0, 1))
        q2 = (q * q).mean((0, 1))
        return scale * mu @ qm + 0.5 * scale * scale * var @ q2
    if mode == "mean":
        return scale * mu @ q.mean((0, 1))
    if mode == "pooled":
        return (mu * np.sqrt(ln)[:, None]) @ q.mean((0, 1))
    if mode in ("heads", "maxhead"):
        acc = None
        for h in range(q.shape[0]):
            qm = q[h].mean(0)
            q2 = (q[h] * q[h]).mean(0)
            e = scale * mu @ qm + 0.5 * scale * scale * var @ q2
            if mode == "maxhead":
                m = e.max()
                sh = np.exp(e - m) / (ln * np.exp(e - m)).sum()
                acc = sh if acc is None else np.maximum(acc, sh)
            else:
                m = e.max()
                sh = np.exp(e - m) / (ln * np.exp(e - m)).sum()
                acc = sh if acc is None else acc + sh
        return np.log(acc)
    if mode in ("rowheads", "rowheads1"):
        acc = 0
        for h in range(q.shape[0]):
            for r in range(q.shape[1]):
                qr = q[h, r]
                e = scale * mu @ qr + (0.5 * scale * scale * var @ (qr * qr) if mode == "rowheads" else 0)
                m = e.max()
                acc = acc + np.exp(e - m) / (ln * np.exp(e - m)).sum()
        return np.log(acc)
    if mode == "lse":  # per row and head: exact log-mean-exp over keys (ideal non-oracle?) = oracle-ish per key
        raise ValueError
    raise ValueError(mode)


def true_mass(k, q, starts, scale, n, r):
    """attention mass per chunk of the group's last r rows (sum over heads and rows)."""
    s = scale * np.einsum("hrd,nd->hrn", q, k)
    pos = np.arange(n)
    rows = n - r + np.arange(r)
    s = np.where(pos[None, None, :] <= rows[None, :, None], s, -np.inf)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    per_key = p.sum((0, 1))
    return np.array([per_key[starts[c]:starts[c + 1]].sum() for c in range(len(starts) - 1)]), p


def select(starts, score, n, r, density, sink, local):
    """keys selected for the block of the last r rows (route.c's rule, simplified)."""
    budget = int(np.ceil(density * n))
    sink = min(sink, max(budget // 8, 1))
    local = min(local, budget // 4)
    sel = np.zeros(n, bool)
    sel[:sink] = True
    sel[max(0, n - r - local):] = True
    order = np.argsort(-score, kind="stable")
    for c in order:
        if sel.sum() >= budget:
            break
        a, b = starts[c], starts[c + 1]
        new = (~sel[a:b]).sum()
        if new == 0:
            continue
        if sel.sum() + new > budget + new / 2:
            continue
        sel[a:b] = True
    return sel


def main():
    dens = 0.0625
    variants = [
        ("sim w8 raw / moments", dict(b="sim", centre_b=False, mode="moments")),
        ("sim w8 centred / moments", dict(b="sim", centre_b=True, mode="moments")),
        ("sim w8 centred / heads", dict(b="sim", centre_b=True, mode="heads")),
        ("sim w8 centred / maxhead", dict(b="sim", centre_b=True, mode="maxhead")),
        ("sim w8 centred / mean", dict(b="sim", centre_b=True, mode="mean")),
        ("sim w8 raw / oracle", dict(b="sim", centre_b=False, mode="oracle")),
        ("sim w8 centred / oracle", dict(b="sim", centre_b=True, mode="oracle")),
        ("sim w8 centred / rowheads", dict(b="sim", centre_b=True, mode="rowheads")),
        ("sim w8 centred / rowheads1", dict(b="sim", centre_b=True, mode="rowheads1")),
        ("fixed 16 / moments", dict(b="fixed", mode="moments")),
        ("fixed 16 / rowheads", dict(b="fixed", mode="rowheads")),
        ("fixed 16 / heads", dict(b="fixed", mode="heads")),
        ("fixed 16 / maxhead", dict(b="fixed", mode="maxhead")),
        ("fixed 16 / oracle", dict(b="fixed", mode="oracle")),
    ]
    R = int(sys.argv[1]) if sys.argv[1].isdigit() else 16
    paths = sys.argv[2:] if sys.argv[1].isdigit() else sys.argv[1:]
    tot = {name: [] for name, _ in variants}
    for path in paths:
        D = load(path)
        n, lo, hi, hkv = D["n"], D["lo"], D["hi"], D["hkv"]
        G = D["hq"] // hkv
        r = min(R, D["r"])
        print("%s: n %d needle [%d, %d)" % (path, n, lo, hi))
        starts = {}
        for cb in (False, True):
            sc = sim_scores(np.stack([np.asarray(x[0]) for x in D["layers"]]).reshape(-1, n, D["d"])[:hkv], 8, cb) if False else None
        rows = []
        for li, (k, q) in enumerate(D["layers"]):
            q = q[:, -r:, :]
            st_sim = {cb: nms_starts(sim_scores(k, 8, cb), n, 1.0, 4, 8, 32) for cb in (False, True)}
            st_fix = fixed_starts(n, 16)
            line = []
            for g in range(hkv):
                qg = q[g * G:(g + 1) * G]
                m_fix, p = true_mass(k[g], qg, st_fix, D["scale"], n, r)
                needle = p[:, :, lo:hi].sum(-1).mean(-1).max()  # max over heads of mean-over-rows share
                res = {}
                for name, v in variants:
                    stt = st_fix if v["b"] == "fixed" else st_sim[v["centre_b"]]
                    if v["mode"] == "oracle":
                        s, _ = true_mass(k[g], qg, stt, D["scale"], n, r)
                        s = np.log(s + 1e-30)
                    else:
                        s = chunk_scores(k[g], qg, stt, D["scale"], v["mode"], False)
                    sel = select(stt, s, n, r, dens, 4, 32)
                    res[name] = sel[lo:hi].mean()
                    tot[name].append((needle, res[name]))
                line.append((needle, res))
            rows.append(line)
            print("L%02d " % li + " | ".join("h%d need %.2f " % (g, line[g][0]) + " ".join(
                "%.1f" % line[g][1][nm] for nm, _ in variants) for g in range(hkv)))
    print("variant: mean needle coverage over (layer, head) weighted by needle mass; where mass > 0.1")
    for name, _ in variants:
        a = np.array(tot[name])
        w = a[:, 0]
        big = a[a[:, 0] > 0.1]
        print("%-28s weighted %.3f  mass>0.1: %.3f (%d)  all %.3f" % (
            name, (w * a[:, 1]).sum() / w.sum(), big[:, 1].mean() if len(big) else float("nan"), len(big),
            a[:, 1].mean()))


if __name__ == "__main__":
    main()
