#!/usr/bin/env python3
"""llamacpp_speed.py: dhsa against llama.cpp's llama-bench on the same GGUF
files, same threads, in one interleaved run (issue 11; docs/notes/results-models.md).

For every file and round: llama-bench (prefill P, decode N from an empty
context, and with --depth D also prefill D and decode N after D tokens),
then `dhsa bench model` on the same tests (--lengths 16 for the empty
context, --lengths 512 / D for prefill, decode after D). Prints, per file
and test, the median tokens/s of each over the rounds and the median of
the per-round ratios dhsa / llama.cpp.

  python3 bench/llamacpp_speed.py --llama-bench /work/peers/llama.cpp/build/bin/llama-bench \
      --dhsa build/dhsa --threads 2 --rounds 3 --depth 4096 FILE.gguf [FILE.gguf ...]

Options: --kv f16 (default, llama.cpp's default cache; dhsa --kv f16) or
f32; --dhsa-args "--exact" adds arguments to dhsa bench model;
--llama-args "--repack 0" adds arguments to llama-bench (this machine's
peer build crashes in its AMX repacking without it: say so with the
numbers). llama.cpp runs with flash attention on (-fa on).
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p.stdout


def llama(args, path, p, n, d):
    cmd = [args.llama_bench, "-m", path, "-t", str(args.threads), "-p", str(p), "-n", str(n), "-d", str(d),
           "-r", "1", "-fa", "on", "-ctk", args.kv, "-ctv", args.kv, "-o", "json"] + args.llama_args.split()
    out = json.loads(run(cmd))
    res = {}
    for r in out:
        key = "pp" if r["n_prompt"] > 0 else "tg"
        res[key] = r["avg_ts"]
    return res


def dhsa(args, path, length, n_dec):
    cmd = [args.dhsa, "bench", "model", "-m", path, "--lengths", str(length), "--attn", "dense", "--decode",
           str(n_dec), "--threads", str(args.threads), "--kv", args.kv] + args.dhsa_args.split()
    out = run(cmd)
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0] == str(length) and f[1] == "dense":
            return {"pp": float(f[4]), "tg": float(f[5])}, out
    sys.exit("could not read dhsa bench model's output:\n" + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--dhsa", default="build/dhsa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--kv", default="f16", choices=["f16", "f32"])
    ap.add_argument("--dhsa-args", default="")
    ap.add_argument("--llama-args", default="")
    args = ap.parse_args()
    rows = []
    for path in args.files:
        tests = [("prefill %d" % args.prompt, "pp", args.prompt, 0), ("decode, empty context", "tg", 16, 0)]
        if args.depth:
            tests += [("prefill %d" % args.depth, "pp", args.depth, 0), ("decode at %d" % args.depth, "tg", args.depth, 1)]
        vals = {t[0]: ([], [], []) for t in tests}
        header = None
        for _ in range(args.rounds):
            l0 = llama(args, path, args.prompt, args.gen, 0)
            d0, header = dhsa(args, path, args.prompt, args.gen)
            de, _ = dhsa(args, path, 16, args.gen)
            got = {("prefill %d" % args.prompt): (l0["pp"], d0["pp"]), "decode, empty context": (l0["tg"], de["tg"])}
            if args.depth:
                ld = llama(args, path, args.depth, 0, 0)
                lg = llama(args, path, 0, args.gen, args.depth)
                dd, _ = dhsa(args, path, args.depth, args.gen)
                got["prefill %d" % args.depth] = (ld["pp"], dd["pp"])
                got["decode at %d" % args.depth] = (lg["tg"], dd["tg"])
            for name, (lv, dv) in got.items():
                vals[name][0].append(lv)
                vals[name][1].append(dv)
                vals[name][2].append(dv / lv)
        routes = [ln for ln in header.splitlines() if ln.startswith("weight products")]
        for name, _, _, _ in tests:
            lv, dv, rv = vals[name]
            rows.append((path, name, statistics.median(lv), statistics.median(dv), statistics.median(rv),
                         routes[0] if routes else ""))
    print("| file | test | llama.cpp t/s | dhsa t/s | dhsa / llama.cpp |")
    print("| --- | --- | ---: | ---: | ---: |")
    for path, name, lv, dv, r in [(a, b, c, d, e) for a, b, c, d, e, _ in rows]:
        print("| %s | %s | %.1f | %.1f | %.2fx |" % (path.split("/")[-1], name, lv, dv, r))
    print("\n%d threads, KV %s, %d rounds (medians; the ratio is the median of the per-round ratios); dhsa %s" %
          (args.threads, args.kv, args.rounds, "; ".join(sorted(set(r[5] for r in rows)))))


if __name__ == "__main__":
    main()
