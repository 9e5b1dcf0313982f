#!/usr/bin/env python3
"""torch_memory.py: the seed experiment with PyTorch, in one command.

One multi-head attention layer (E = 1024, 16 heads, fp32, batch 1,
batch_first) with a key_padding_mask over the last P/8 keys, in eval() under
torch.inference_mode(), three ways on the same weights:

  fastpath  torch.nn.MultiheadAttention: PyTorch's fused fast path
  sdpa      the same layer written with F.scaled_dot_product_attention
            (in-projection, a [B, 1, 1, P] keep-mask, out-projection)
  dhsa      dhsa.torch.MultiheadAttention.from_module(the same module)

  python3 examples/torch_memory.py one MODE P     one forward; prints its peak RSS
                                                  (MODE none: the layer and inputs, no forward)
  python3 examples/torch_memory.py all [--sizes 1024,2048,4096,8192] [--linear-sizes LIST]
                                       [--svg FILE] [--md FILE]

`all` first checks the three agree (max-abs-diff at P = 512) and runs
dhsa.torch.find_square_intermediates on each at P = 512, then runs
`build/dhsa memprobe --json` on `one MODE {n}` for each mode (a fresh
process per size) with `one none {n}` as the baseline (the interpreter,
PyTorch with its libraries, the weights and the inputs: what the process
holds without the forward), and prints per size the process peaks, the
forward's own peak (each run resets VmHWM before its forward and prints
the peak above the RSS before it), the ratio fastpath/dhsa of those, and
per mode memprobe's fit peak = a n^2 + b n + c with its verdict. sdpa and
dhsa run again at --linear-sizes when given (sizes where the fast path
would not fit), where their growth shows above the high-water mark that
importing PyTorch leaves (below it, their forwards do not move the
process's peak, and the fit over the small sizes cannot say linear).
--svg plots the forward peaks of the three modes, --md writes the table. Exit 0
when everything ran, 1 when a run or check failed, 2 on usage errors, 3
when PyTorch is not importable. Run from the repository root after `make`.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
E, HEADS = 1024, 16
MODES = ("fastpath", "sdpa", "dhsa")
USAGE = ("usage: torch_memory.py one fastpath|sdpa|dhsa|none P\n"
         "       torch_memory.py all [--sizes 1024,2048,4096,8192] [--linear-sizes LIST] "
         "[--svg FILE] [--md FILE]")


def import_torch():
    try:
        import torch
    except Exception as e:
        sys.stderr.write("torch_memory.py: needs PyTorch, which is not importable here (%s); "
                         "`make test-torch` makes a venv with it (~/.cache/dhsa-torch-venv)\n" % e)
        sys.exit(3)
    return torch


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes():
    return _status("VmHWM")


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux: /proc/self/clear_refs "5").
    False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------- forwards ---


def layer(torch):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, HEADS, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_(std=0.1)
        mha.out_proj.bias.normal_(std=0.1)
    return mha


def inputs(torch, P):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, P, E, generator=g)
    pad = torch.zeros(1, P, dtype=torch.bool)
    pad[:, P - P // 8:] = True  # True = padding (key_padding_mask)
    return x, pad


def sdpa_forward(torch, mha, x, pad):
    """The layer with F.scaled_dot_product_attention: [B, H, P, d] views."""
    F = torch.nn.functional
    B, P, _ = x.shape
    d = E // HEADS
    qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).view(B, P, 3, HEADS, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :])
    return F.linear(o.transpose(1, 2).reshape(B, P, E), mha.out_proj.weight, mha.out_proj.bias)


def forward(torch, mode, mha, x, pad):
    with torch.inference_mode():
        if mode == "fastpath":
            return mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        if mode == "sdpa":
            return sdpa_forward(torch, mha, x, pad)
        import dhsa.torch
        return dhsa.torch.MultiheadAttention.from_module(mha)(
            x, x, x, key_padding_mask=pad, need_weights=False)[0]


def run_one(mode, P):
    torch = import_torch()
    mha = layer(torch)
    x, pad = inputs(torch, P)
    if mode == "none":
        import dhsa.torch  # noqa: F401  (what the dhsa mode imports too)
        print("mode none P %d: peak_rss_bytes %d" % (P, peak_rss_bytes()))
        return 0
    if mode == "dhsa":  # load the library outside the measured forward
        import dhsa.torch
        dhsa._capi.lib()
    before = _status("VmRSS")
    reset = reset_peak_rss()
    t0 = time.perf_counter()
    out = forward(torch, mode, mha, x, pad)
    dt = time.perf_counter() - t0
    fwd = peak_rss_bytes() - before if reset else -1
    print("mode %s P %d: output %s in %.3f s; forward_peak_bytes %d (the forward's peak RSS above "
          "the RSS before it, %.1f MiB)" % (mode, P, list(out.shape), dt, fwd, fwd / 2**20))
    print("peak_rss_bytes %d (%.1f MiB)" % (peak_rss_bytes(), peak_rss_bytes() / 2**20))
    log = os.environ.get("TORCH_MEMORY_LOG")
    if log:  # `all` reads the forward peaks from here (memprobe keeps no output of a good run)
        with open(log, "a") as f:
            f.write(json.dumps({"mode": mode, "P": P, "forward_peak_bytes": fwd}) + "\n")
    return 0

# ------------------------------------------------------------------ all ---



def checks(torch):
    """Agreement at P = 512 and the finder's verdict per mode: lines, ok."""
    import warnings
    import dhsa.torch
    mha = layer(torch)
    x, pad = inputs(torch, 512)
    outs = {m: forward(torch, m, mha, x, pad) for m in MODES}
    keep = ~pad[0]
    lines, ok = [], True
    for m in ("sdpa", "dhsa"):
        diff = float((outs[m][:, keep] - outs["fastpath"][:, keep]).abs().max())
        lines.append("P = 512: max-abs-diff %s vs fastpath %.3g (unpadded rows)" % (m, diff))
        ok &= diff <= 1e-5

    class Mode(torch.nn.Module):
        def __init__(self, mode):
            super().__init__()
            self.mode, self.mha = mode, mha

        def forward(self, x, pad):
            return forward(torch, self.mode, self.mha, x, pad)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dhsa.torch.ProductionModeWarning)
        for m in MODES:
            found = dhsa.torch.find_square_intermediates(Mode(m).eval(), x, pad)
            what = ", ".join("%s %s" % (f.op, list(f.shape)) for f in found) or "nothing"
            lines.append("find_square_intermediates, %s at P = 512: %d found (%s)"
                         % (m, len(found), what))
            ok &= bool(found) == (m == "fastpath")
    return lines, ok


def memprobe(mode, sizes, baseline=True):
    cli = os.environ.get("DHSA_CLI", str(ROOT / "build" / "dhsa"))
    me = str(Path(__file__).resolve())
    if " " in sys.executable + me:
        raise RuntimeError("memprobe's --baseline is split at blanks: run from paths without them")
    cmd = [cli, "memprobe", "--json", "--quiet", "--sizes", ",".join(map(str, sizes))]
    if baseline:
        cmd += ["--baseline", "%s %s one none {n}" % (sys.executable, me)]
    cmd += ["--", sys.executable, me, "one", mode, "{n}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if not r.stdout.strip():
        raise RuntimeError("memprobe for %s printed nothing (exit %d): %s"
                           % (mode, r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout), r.returncode


def svg_plot(path, sizes, peaks):
    """One line plot: peak RSS (GiB) over P for each mode."""
    W, H, ml, mr, mt, mb = 640, 400, 70, 140, 30, 50
    ymax = max([v for p in peaks.values() for v in p if v is not None] or [1]) / 2**30 * 1.05
    xmax = max(sizes)
    sx = lambda n: ml + (W - ml - mr) * n / xmax
    sy = lambda g: H - mb - (H - mt - mb) * g / ymax
    colors = {"fastpath": "#c0392b", "sdpa": "#2471a3", "dhsa": "#1e8449"}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif"'
           ' font-size="12">' % (W, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14">Forward peak RSS of one MHA layer (E = 1024, 16 heads, '
           'key_padding_mask), eval + inference_mode</text>' % ml,
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (ml, H - mb, W - mr, H - mb),
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (ml, mt, ml, H - mb)]
    last = -1e9
    for n in sizes:  # a label closer than 34 px to the previous one is left out
        if sx(n) - last >= 34:
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>'
                       % (sx(n), H - mb + 16, n))
            last = sx(n)
    for i in range(6):
        g = ymax * i / 5
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (ml - 6, sy(g) + 4, g))
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                   % (ml, sy(g), W - mr, sy(g)))
    out.append('<text x="%d" y="%d" text-anchor="middle">P (sequence length)</text>'
               % ((ml + W - mr) // 2, H - 12))
    out.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">peak RSS '
               '(GiB)</text>' % ((mt + H - mb) // 2, (mt + H - mb) // 2))
    for j, (m, p) in enumerate(peaks.items()):
        pts = [(sx(n), sy(v / 2**30)) for n, v in zip(sizes, p) if v is not None]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (colors[m], " ".join("%.1f,%.1f" % xy for xy in pts)))
        for x, y in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x, y, colors[m]))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - mr + 10, mt + 20 + 18 * j,
                                                              colors[m], m))
    out.append("</svg>")
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, path)


def _sizes(text):
    try:
        v = sorted({int(x) for x in text.split(",")})
    except ValueError:
        return None
    return v if len(v) >= 3 and v[0] >= 8 else None


def run_all(argv):
    opts = {"--sizes": "1024,2048,4096,8192", "--linear-sizes": None, "--svg": None, "--md": None}
    i = 0
    while i < len(argv):
        if argv[i] not in opts or i + 1 >= len(argv):
            sys.stderr.write(USAGE + "\n")
            return 2
        opts[argv[i]] = argv[i + 1]
        i += 2
    sizes = _sizes(opts["--sizes"])
    linear = _sizes(opts["--linear-sizes"]) if opts["--linear-sizes"] else sizes
    if sizes is None or linear is None:
        sys.stderr.write("--sizes and --linear-sizes need at least 3 distinct sizes >= 8\n"
                         + USAGE + "\n")
        return 2
    # memprobe runs per mode: --sizes for all; --linear-sizes (where the fast
    # path would not fit) again for sdpa and dhsa, whose growth stays under
    # PyTorch's import spike at small P (see docs/torch.md)
    runs = {"fastpath": [sizes], "sdpa": [sizes], "dhsa": [sizes]}
    if linear != sizes:
        runs["sdpa"].append(linear)
        runs["dhsa"].append(linear)
    allsizes = sorted(set(sizes) | set(linear))
    torch = import_torch()
    status = 0
    lines, ok = checks(torch)
    print("\n".join(lines))
    if not ok:
        print("CHECK FAILED: the modes disagree or the finder's verdicts are not fastpath-only")
        status = 1
    peaks, fwd, fits = {}, {}, {}
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "forward.jsonl")
        os.environ["TORCH_MEMORY_LOG"] = log
        for m in MODES:
            by_n = {}
            fits[m] = []
            for k, sz in enumerate(runs[m]):
                # the --linear-sizes run takes the fitted c as its baseline: the
                # measured one holds the import's high-water mark, above c
                js, rc = memprobe(m, sz, baseline=(k == 0))
                if rc:
                    status = 1
                    print("memprobe %s over %s: exit %d; failures: %s" % (
                        m, ",".join(map(str, sz)), rc, js.get("failures")))
                    for r in js.get("results", []):
                        if r.get("status") not in ("ok", None) and r.get("last_output"):
                            print("  P = %d (%s): %s" % (r["n"], r["status"],
                                                         r["last_output"].strip()[-400:]))
                by_n.update({r["n"]: r for r in js.get("results", []) if r.get("in_fit")})
                fits[m].append((sz, js))
            peaks[m] = [by_n[n]["peak_bytes"] if n in by_n else None for n in allsizes]
        got = {}
        if os.path.exists(log):
            with open(log) as f:
                for line in f:
                    r = json.loads(line)
                    if r["forward_peak_bytes"] >= 0:
                        got[(r["mode"], r["P"])] = r["forward_peak_bytes"]
        for m in MODES:
            fwd[m] = [got.get((m, n)) if peaks[m][j] is not None else None
                      for j, n in enumerate(allsizes)]
    base = fits["dhsa"][0][1].get("baseline_bytes")
    cell = lambda v: "%.3f GiB" % (v / 2**30) if v is not None else "-"
    rows = ["Peak RSS of the process (memprobe; the baseline `one none {n}`, interpreter + "
            "PyTorch + weights + inputs, is %s) and the forward's own peak (VmHWM reset before "
            "it, minus the RSS before it)." % ("%.3f GiB" % (base / 2**30) if base else "?"),
            "",
            "| P | peak fastpath | peak sdpa | peak dhsa | forward fastpath | forward sdpa | "
            "forward dhsa | forward dhsa / P | fastpath / dhsa (forward) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for j, n in enumerate(allsizes):
        f, sd, d = (fwd[m][j] for m in MODES)
        rows.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            n, cell(peaks["fastpath"][j]), cell(peaks["sdpa"][j]), cell(peaks["dhsa"][j]),
            cell(f), cell(sd), cell(d), "%.1f KiB" % (d / n / 1024) if d else "-",
            "%.1f" % (f / d) if f and d else "-"))
    nan = float("nan")
    for m in MODES:
        for sz, js in fits[m]:
            rows.append("")
            rows.append("%s (memprobe over %s, baseline %s): peak = %.4g n^2 + %.4g n + %.4g "
                        "bytes, log-log slope %.2f above the baseline; verdict %s: %s"
                        % (m, ",".join(map(str, sz)),
                           "`one none`" if js.get("baseline_command") else "the fitted c",
                           js.get("a") or nan, js.get("b") or nan,
                           js.get("c") or nan, js.get("slope") or nan, js.get("verdict"),
                           js.get("verdict_reason")))
    text = "\n".join(rows)
    print(text)
    if opts["--md"]:
        with open(opts["--md"], "w") as f:
            f.write(text + "\n")
    if opts["--svg"]:
        svg_plot(opts["--svg"], allsizes, fwd)
        print("plot: %s" % opts["--svg"])
    return status


def main(argv):
    if len(argv) >= 2 and argv[1] == "all":
        return run_all(argv[2:])
    if len(argv) == 4 and argv[1] == "one" and argv[2] in MODES + ("none",):
        try:
            P = int(argv[3])
        except ValueError:
            P = 0
        if P >= 8:
            return run_one(argv[2], P)
    sys.stderr.write(USAGE + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
