#!/usr/bin/env python3
"""bench/dist_fetch.py: what a fetch budget per rank (--dist-fetch F,
docs/dist.md) costs in next-token quality and saves in K/V bytes.

Usage: python3 bench/dist_fetch.py --text FILE [--windows 24] [--chars 12000]
           [--ranks 4] [--stripe 1024] [--fetch 1,0.25,0.125] [--cli build/dhsa]
           [--model M] [--extra "--dense-below 0"] [--out DIR]

For each of --windows consecutive, disjoint windows of --chars characters of
FILE (held-out text), `dhsa run -n 1 --temp 0 --logits-out` gives the
next-token logits after the window as a prompt: one process dense, one
process DHSA (the reference: what context parallelism must reproduce),
then under `mpirun --oversubscribe -np R` DHSA without a budget and with
each F. Prints per method the mean KL(reference || method) and KL(dense ||
method) of the final next-token distributions (nats, double-precision
log-softmax), the top-1
agreement with the reference and with dense, and, for the distributed
runs, the K/V bytes per layer per prompt token, the index relay and the
share of the visible remote keys fetched (the run's "dist:" line, summed
over the windows). Every command is printed once (with WINDOW for the
prompt file). Standard library only; one thread per process (-t 1).
"""
import argparse
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

MPIRUN = ["mpirun", "--oversubscribe"]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def log_softmax(x):
    m = max(x)
    lz = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - lz for v in x]


def kl(ref, got):
    a, b = log_softmax(ref), log_softmax(got)
    return sum(math.exp(p) * (p - q) for p, q in zip(a, b))


def argmax(x):
    return max(range(len(x)), key=lambda i: x[i])


def read_logits(path):
    with open(path, "rb") as f:
        data = f.read()
    return list(struct.unpack("<%df" % (len(data) // 4), data))


WIRE = re.compile(r"K/V ([0-9.]+) MiB = ([0-9.]+) bytes per layer per prompt token, index ([0-9.]+) MiB")
FETCH = re.compile(r"fetched ([0-9]+) of the ([0-9]+) keys .*?at most ([0-9.]+)\)")
PROMPT = re.compile(r"prompt: ([0-9]+) tokens in ([0-9.]+) s")


def run(name, shown_cmd, cmd, shown):
    """Runs cmd (stderr returned); prints shown_cmd the first time for name."""
    if name not in shown:
        print("  %s: %s" % (name, " ".join(shown_cmd)), flush=True)
        shown.add(name)
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed (exit %d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-3000:]))
    return p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--windows", type=int, default=24)
    ap.add_argument("--chars", type=int, default=12000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--stripe", type=int, default=1024)
    ap.add_argument("--fetch", default="1,0.25,0.125")
    ap.add_argument("--cli", default="build/dhsa")
    ap.add_argument("--model", default=None)
    ap.add_argument("--ctx", type=int, default=6144)
    ap.add_argument("--extra", default="--dense-below 0")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    text = open(a.text, encoding="utf-8", errors="replace").read()
    if len(text) < a.windows * a.chars:
        sys.exit("%s has %d characters, fewer than --windows x --chars" % (a.text, len(text)))
    out = a.out or tempfile.mkdtemp(prefix="dist_fetch_")
    os.makedirs(out, exist_ok=True)
    base = [a.cli, "run"] + (["-m", a.model] if a.model else []) + [
        "-n", "1", "--temp", "0", "--ids", "-t", "1", "--ctx", str(a.ctx)]
    extra = a.extra.split()
    methods = [("dense, 1 process", 1, ["--attn", "dense"]),
               ("dhsa, 1 process (reference)", 1, ["--attn", "dhsa"] + extra)]
    dist = ["--attn", "dhsa"] + extra + ["--dist-stripe", str(a.stripe)]
    methods.append(("dhsa, R = %d, no budget" % a.ranks, a.ranks, dist))
    for f in a.fetch.split(","):
        methods.append(("dhsa, R = %d, F = %s" % (a.ranks, f), a.ranks, dist + ["--dist-fetch", f]))
    print("windows: %d x %d characters of %s; R = %d, stripe %d; %s; outputs in %s" % (
        a.windows, a.chars, a.text, a.ranks, a.stripe, a.extra, out), flush=True)
    shown = set()
    logits = {m[0]: [] for m in methods}
    wire = {m[0]: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0] for m in methods}  # MiB, B/layer/token sum, index, keys, visible, share max
    tokens = 0
    for w in range(a.windows):
        prompt = os.path.join(out, "w%02d.txt" % w)
        with open(prompt, "w", encoding="utf-8") as f:
            f.write(text[w * a.chars:(w + 1) * a.chars])
        for k, (name, ranks, args) in enumerate(methods):
            lpath = os.path.join(out, "w%02d_m%d.f32" % (w, k))
            cmd = base + ["-f", prompt] + args + ["--logits-out", lpath]
            if ranks > 1:
                cmd = MPIRUN + ["-np", str(ranks)] + cmd
            shown_cmd = [c if c != prompt else "WINDOW" for c in cmd]
            shown_cmd = [c if c != lpath else "OUT.f32" for c in shown_cmd]
            err = run(name, shown_cmd, cmd, shown)
            logits[name].append(read_logits(lpath))
            if k == 1:
                m = PROMPT.search(err)
                tokens += int(m.group(1)) if m else 0
            if ranks > 1:
                m = WIRE.search(err)
                if m:
                    wire[name][0] += float(m.group(1))
                    wire[name][1] += float(m.group(2))
                    wire[name][2] += float(m.group(3))
                m = FETCH.search(err)
                if m:
                    wire[name][3] += float(m.group(1))
                    wire[name][4] += float(m.group(2))
                    wire[name][5] = max(wire[name][5], float(m.group(3)))
        print("window %d done" % w, file=sys.stderr, flush=True)
    ref = logits[methods[1][0]]
    dense = logits[methods[0][0]]
    n = a.windows
    print("\n%d windows, %.0f prompt tokens on average\n" % (n, tokens / n))
    print("| method | KL(ref \\|\\| method), mean (max) | KL(dense \\|\\| method), mean | top-1 = ref | top-1 = dense | "
          "K/V per layer per prompt token | index MiB / window | fetched of visible remote keys | largest share "
          "(rank, layer) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ranks, _ in methods:
        ks = [kl(r, g) for r, g in zip(ref, logits[name])]
        kd = [kl(r, g) for r, g in zip(dense, logits[name])]
        t_ref = sum(argmax(r) == argmax(g) for r, g in zip(ref, logits[name]))
        t_den = sum(argmax(r) == argmax(g) for r, g in zip(dense, logits[name]))
        wv = wire[name]
        bytes_txt = "%.1f B" % (wv[1] / n) if ranks > 1 else "-"
        idx_txt = "%.3f" % (wv[2] / n) if ranks > 1 else "-"
        fetch_txt = "%.2f%%" % (100.0 * wv[3] / wv[4]) if wv[4] > 0 else "-"
        share_txt = "%.4f" % wv[5] if wv[4] > 0 else "-"
        print("| %s | %.2e (%.2e) | %.4f | %d/%d | %d/%d | %s | %s | %s | %s |" % (
            name, sum(ks) / n, max(ks), sum(kd) / n, t_ref, n, t_den, n, bytes_txt, idx_txt, fetch_txt, share_txt))


if __name__ == "__main__":
    main()
