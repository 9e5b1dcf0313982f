#!/usr/bin/env python3
"""ruler_probe.py: on a dump of bench/ruler_dump.c (a RULER prompt run
densely), per layer and KV head: how much of the last row's dense
attention (the row that predicts the answer's first token) falls on the
asked needle sentence and on the other needles, and whether each routing
variant's selection at 6.25% covers them. A development tool (docs/dhsa.md,
"Multi-needle tasks"): numbers for choosing, not a test.

  python3 bench/ruler_probe.py [R] DUMP [DUMP ...]
"""
import sys
import numpy as np
from route_probe import load, sim_scores, nms_starts, fixed_starts, chunk_scores, select


def bound_scores(k, q, starts, scale):
    nc = len(starts) - 1
    mx = np.array([k[starts[c]:starts[c + 1]].max(0) for c in range(nc)])
    mn = np.array([k[starts[c]:starts[c + 1]].min(0) for c in range(nc)])
    ln = np.array([starts[c + 1] - starts[c] for c in range(nc)], dtype=np.float64)
    acc = 0
    for h in range(q.shape[0]):
        qm = q[h].mean(0)
        e = scale * (np.maximum(mx * qm, mn * qm)).sum(1)
        m = e.max()
        acc = acc + np.exp(e - m) / (ln * np.exp(e - m)).sum()
    return np.log(acc)


def oracle_scores(k, q, starts, scale, n, r):
    s = scale * np.einsum("hrd,nd->hrn", q, k)
    rows = n - r + np.arange(r)
    s = np.where(np.arange(n)[None, None, :] <= rows[None, :, None], s, -np.inf)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    per_key = p.sum((0, 1))
    return np.array([per_key[starts[c]:starts[c + 1]].sum() for c in range(len(starts) - 1)]), p


def main():
    args = sys.argv[1:]
    R = int(args[0]) if args[0].isdigit() else 1
    paths = args[1:] if args[0].isdigit() else args
    variants = ["sim/moments", "sim/heads", "sim/bound", "sim/rows1", "sim/oracle", "fix/moments", "fix/bound", "fix/oracle"]
    # per variant: cases, asked covered, wrong (asked missed, another covered), dense asked mass lost
    tot = {v: [0, 0, 0, 0.0] for v in variants}
    for path in paths:
        D = load(path)
        spans = [l.split(None, 5) for l in open(path + ".spans")]
        n, hkv = D["n"], D["hkv"]
        G = D["hq"] // hkv
        asked = [i for i, s in enumerate(spans) if s[0] == "asked"]
        other = [i for i, s in enumerate(spans) if s[0] != "asked"]
        print("%s: n %d, needles %s" % (path, n, " ".join("%s[%s,%s)" % (s[0][0], s[1], s[2]) for s in spans)))
        for li, (k, qa) in enumerate(D["layers"]):
            st = {"sim": nms_starts(sim_scores(k, 8, False), n, 1.0, 4, 8, 32), "fix": fixed_starts(n, 16)}
            for row in range(R):
                q = qa[:, D["r"] - R + row:D["r"] - R + row + 1, :]
                npos = n - R + row + 1  # keys visible to this row
                for g in range(hkv):
                    qg = q[g * G:(g + 1) * G]
                    kk = k[g][:npos]
                    _, p = oracle_scores(kk, qg, fixed_starts(npos, 16), D["scale"], npos, 1)
                    pm = p[:, 0, :]
                    am = [pm[:, int(s[1]):int(s[2])].sum(-1) for s in spans]
                    a_mass = max(am[i].max() for i in asked)
                    o_mass = max(am[i].max() for i in other) if other else 0
                    if a_mass < 0.05:
                        continue
                    line = []
                    for v in variants:
                        b, mode = v.split("/")
                        stt = [x for x in st[b] if x < npos] + [npos]
                        if mode == "oracle":
                            sc, _ = oracle_scores(kk, qg, stt, D["scale"], npos, 1)
                        elif mode == "bound":
                            sc = bound_scores(kk, qg, stt, D["scale"])
                        elif mode == "rows1":
                            sc = chunk_scores(kk, qg, stt, D["scale"], "rowheads1", False)
                        else:
                            sc = chunk_scores(kk, qg, stt, D["scale"], mode, False)
                        sel = select(stt, sc, npos, 1, 0.0625, 4, 32)
                        cov = [sel[int(s[1]):int(s[2])].mean() for s in spans]
                        ac = min(cov[i] for i in asked)
                        oc = max(cov[i] for i in other) if other else 0
                        t = tot[v]
                        t[0] += 1
                        t[1] += ac >= 0.5
                        t[2] += ac < 0.5 and oc >= 0.5
                        t[3] += a_mass * (1 - ac)
                        line.append("%s %.1f/%.1f" % (v, ac, oc))
                    if row == R - 1 or any(l.split()[1].startswith("0.0") for l in line):
                        print("  L%02d r%d g%d asked %.2f other %.2f | %s" % (li, row, g, a_mass, o_mass, "  ".join(line)))
    print("cases (layer, row, KV head) with >= 5%% of a head's attention on the asked needle; per variant: "
          "asked covered / asked missed while another needle is covered / cases / dense asked mass lost (sum)")
    for v in variants:
        c, a, w, lost = tot[v]
        print("  %-12s %d / %d / %d / %.2f" % (v, a, w, c, lost))


if __name__ == "__main__":
    main()
