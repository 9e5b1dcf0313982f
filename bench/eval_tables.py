#!/usr/bin/env python3
"""bench/eval_tables.py: markdown tables from `dhsa eval passkey|multikey|multivalue --json`.

Usage: python3 bench/eval_tables.py FILE.json [FILE.json ...] > tables.md

Files of the same task are merged (e.g. the run with similarity boundaries
and the run with --boundary learned:FILE, whose method is "dhsa-learned");
the prompts are the same when the runs share --seed, --lengths, --depths and
--trials, which is checked: a (length, depth, trial) cell must carry the
same expected answer in every file.

Per task and density: accuracy per method and length with the density
actually used and the number of prompts; accuracy per depth (all lengths);
paired differences between methods on the same prompts (dhsa - block,
dhsa-learned - block, dhsa - dense) with the standard error of the mean
difference; and every miss of a sparse method classified by the layouts of
the row that produced its first wrong token (needle keys selected in every
layer, in some, in none). Standard library only.
"""
import json
import math
import sys
from collections import defaultdict


def load(paths):
    tasks = defaultdict(list)
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        tasks[d["command"]].append((p, d))
    return tasks


def fmt_len(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def dens_key(a):
    return 1.0 if a["method"] == "dense" else a["density"]


def main(paths):
    out = []
    for task, files in load(paths).items():
        answers, expect = [], {}
        for p, d in files:
            for a in d["answers"]:
                a["method"] = a["method"].split(" ")[0]  # "dhsa 0.0625" -> "dhsa": the density is its own field
                k = (a["length"], a["depth"], a["trial"])
                if expect.setdefault(k, a["expected"]) != a["expected"]:
                    sys.exit(f"eval_tables: {p}: prompt {k} differs from another file's (seed or grid?)")
                answers.append(a)
        lengths = sorted({a["length"] for a in answers})
        depths = sorted({a["depth"] for a in answers})
        densities = sorted({a["density"] for a in answers if a["method"] != "dense"}) or [1.0]  # dense only
        methods = []
        for a in answers:
            if a["method"] not in methods:
                methods.append(a["method"])
        by = defaultdict(list)  # (method, density, length, depth) -> answers
        for a in answers:
            by[(a["method"], dens_key(a), a["length"], a["depth"])].append(a)
        out.append(f"## {task}\n")
        out.append("Files: " + ", ".join(p for p, _ in files) + "\n")
        for rho in densities:
            rows = [(m, 1.0 if m == "dense" else rho) for m in methods]
            out.append(f"### {task}, density {rho:g}: accuracy [density used] (prompts)\n")
            out.append("| method | " + " | ".join(fmt_len(L) for L in lengths) + " | all |")
            out.append("|---" * (len(lengths) + 2) + "|")
            for m, r in rows:
                cells, tot = [], []
                for L in lengths:
                    xs = [a for D in depths for a in by[(m, r, L, D)]]
                    tot += xs
                    if xs:
                        acc = sum(a["hit"] for a in xs) / len(xs)
                        du = sum(a["density_used"] for a in xs) / len(xs)
                        cells.append(f"{acc:.3f} [{du:.3f}] ({len(xs)})")
                    else:
                        cells.append("")
                all_acc = f"{sum(a['hit'] for a in tot) / len(tot):.3f}" if tot else ""
                if tot:
                    out.append(f"| {m} | " + " | ".join(cells) + f" | {all_acc} |")
            out.append("")
            chunks = []
            for m, r in rows:
                cs = [a["mean_chunk"] for L in lengths for D in depths for a in by[(m, r, L, D)] if a.get("mean_chunk")]
                if cs:
                    chunks.append(f"{m} {sum(cs) / len(cs):.2f}")
            if chunks:
                out.append("Keys per chunk over the prompts (mean over prompts and layers): " + ", ".join(chunks) + "\n")
            out.append(f"Per depth (all lengths pooled), density {rho:g}:\n")
            out.append("| method | " + " | ".join(f"{D:g}" for D in depths) + " |")
            out.append("|---" * (len(depths) + 1) + "|")
            for m, r in rows:
                cells = []
                for D in depths:
                    xs = [a for L in lengths for a in by[(m, r, L, D)]]
                    cells.append(f"{sum(a['hit'] for a in xs) / len(xs):.2f}" if xs else "")
                if any(cells):
                    out.append(f"| {m} | " + " | ".join(cells) + " |")
            out.append("")
            pairs = [(x, y) for x, y in (("dhsa", "block"), ("dhsa-learned", "block"), ("dhsa", "dense"),
                                          ("dhsa-learned", "dhsa"), ("block", "dense")) if x in methods and y in methods]
            if pairs:
                out.append(f"Paired differences on the same prompts, density {rho:g}: mean (standard error)\n")
                out.append("| difference | " + " | ".join(fmt_len(L) for L in lengths) + " | all |")
                out.append("|---" * (len(lengths) + 2) + "|")
                for x, y in pairs:
                    rx, ry = (1.0 if x == "dense" else rho), (1.0 if y == "dense" else rho)
                    cells, alld = [], []
                    for L in lengths:
                        ds = []
                        for D in depths:
                            ax = {a["trial"]: a["hit"] for a in by[(x, rx, L, D)]}
                            ay = {a["trial"]: a["hit"] for a in by[(y, ry, L, D)]}
                            ds += [int(ax[t]) - int(ay[t]) for t in ax if t in ay]
                        alld += ds
                        cells.append(diff_cell(ds))
                    out.append(f"| {x} - {y} | " + " | ".join(cells) + f" | {diff_cell(alld)} |")
                out.append("")
            out.append(f"Misses of each method, density {rho:g}, at the row of the first wrong token: needle keys "
                       "selected in every layer (the model's own error) / in some layers only / in none\n")
            out.append("| method | misses | every layer | some layers | none |")
            out.append("|---|---|---|---|---|")
            for m, r in rows:
                ms = [a for L in lengths for D in depths for a in by[(m, r, L, D)] if not a["hit"]]
                if not [1 for L in lengths for D in depths if by[(m, r, L, D)]]:
                    continue
                c = [0, 0, 0]
                for a in ms:
                    s = a["selected_there"]
                    c[0 if min(s) >= 0.999 else 2 if max(s) <= 0.001 else 1] += 1
                out.append(f"| {m} | {len(ms)} | {c[0]} | {c[1]} | {c[2]} |")
            out.append("")
    print("\n".join(out))


def diff_cell(ds):
    if not ds:
        return ""
    n = len(ds)
    mu = sum(ds) / n
    sd = math.sqrt(sum((d - mu) ** 2 for d in ds) / (n - 1)) if n > 1 else 0.0
    return f"{mu:+.3f} ({sd / math.sqrt(n):.3f})"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
