#!/usr/bin/env python3
"""bench/serve.py: the dhsa serve numbers of docs/notes/results-serve-dist.md (issue 14).

  ttft   the prompt cache: on the default model, a document of about 16K tokens
         (a passkey task of dhsa.retrieval_task) asked a first question (cold:
         the whole document is prefilled) and then two others sharing the
         document (warm: only the question is evaluated). Time to first token
         is measured at the client, from sending the request to the first SSE
         event with text; REPS documents (different seeds), medians.
  slots  total decode tokens/s of 4 concurrent clients against one (issue 14's
         goal: at least 2.5x), on servers with --slots 4 and --batch on / off
         (and, with --base-cli, another build's --batch on server), in
         interleaved rounds after a warm-up: each client asks (without
         streaming) up to 256 tokens of free text sampled at temperature 1
         (the tokens are counted from usage: a client that meets EOS counts
         less, and the rest of its round runs with fewer rows; with
         --ignore-eos every request asks "ignore_eos": true, so each reply
         is exactly --tokens long, which is checked). Prints the ratios (of
         the medians, and the median of the per-round ratios) and, from
         /metrics, the mean batch and the time per pass in
         dhsa_session_eval_batch and in the batcher's per-token work.

Usage: PYTHONPATH=python python3 bench/serve.py ttft [--reps N] [--attn dense|dhsa]
       python3 bench/serve.py slots [--reps N] [--clients 4] [--tokens 256] [--batch on,off]
                                    [--threads T] [--base-cli OTHER/dhsa] [--stream] [--ignore-eos]
(needs build/dhsa built with dhsa serve, or DHSA_CLI; starts and stops its
own servers on free ports). Prints markdown rows.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.environ.get("DHSA_CLI", os.path.join(REPO, "build", "dhsa"))


def start(args, cli=None):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    p = subprocess.Popen([cli or CLI, "serve", "--port", "0", *args], stderr=log, stdout=subprocess.DEVNULL, cwd=REPO)
    for _ in range(1200):
        with open(log.name) as f:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
        if m:
            return p, "http://127.0.0.1:%s" % m.group(1), log.name
        if p.poll() is not None:
            break
        time.sleep(0.1)
    p.kill()
    sys.exit("dhsa serve did not start: " + open(log.name).read())


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def stream(url, body):
    """(seconds to the first text event, seconds in all, usage) of a streamed completion."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, usage = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text") and first is None:
                first = time.perf_counter() - t0
            if ev.get("usage"):
                usage = ev["usage"]
    return first, time.perf_counter() - t0, usage


def whole(url, body):
    """The JSON reply of a completion without streaming."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def ttft(reps, attn="dense"):
    import dhsa
    tok = dhsa.Tokenizer(os.path.join(REPO, "models", "dhsa-retrieval-8m.gguf"))
    p, url, _ = start(["--slots", "1", "--ctx", "17408", "--attn", attn])
    cold, warm, n_doc = [], [], []
    try:
        for rep in range(reps):
            t = dhsa.retrieval_task(tok, "passkey", length=16384, depth=0.5, seed=100 + rep)
            q = " What is the pass key? The pass key is"
            doc = t.prompt[:t.prompt.rindex(q)]
            questions = [q, " Which number is the pass key? The pass key is", " Say the pass key again. The pass key is"]
            for i, qq in enumerate(questions):
                f, _, u = stream(url, {"prompt": doc + qq, "max_tokens": 8, "temperature": 0})
                (cold if i == 0 else warm).append(f)
                if i == 0:
                    n_doc.append(u["prompt_tokens"])
                else:
                    assert u["prompt_tokens_details"]["cached_tokens"] > 16000, u
        mc, mw = statistics.median(cold), statistics.median(warm)
        print("| attention | prompt tokens (median) | first question TTFT, median s | later questions TTFT, median s | ratio |")
        print("|---|---|---|---|---|")
        print("| %s | %d | %.3f (%s) | %.4f (%s) | %.0fx |" % (attn, statistics.median(n_doc), mc, ", ".join("%.3f" % x for x in cold),
                                                     mw, ", ".join("%.4f" % x for x in warm), mc / mw))
    finally:
        stop(p)


def metrics(url):
    """The counters of /metrics as {name: value}."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                k, v = line.split()
                out[k] = float(v)
        return out


def slots(reps, clients=4, max_tokens=256, batch=("on", "off"), threads=None, base_cli=None, stream=False,
          ignore_eos=False):
    """Interleaved rounds: in each, 1 and `clients` concurrent clients against
    every server in turn: --slots `clients` with --batch on (the decode steps
    of all slots in one pass) and off (each slot decodes alone on its own
    threads), and with base_cli the same --batch on server from another
    build (the baseline, measured in the same rounds). One warm-up round is
    not counted. Ratios are of medians over the rounds and medians of the
    per-round ratios (absolute tok/s drift on a shared machine; ratios
    within a round hold). With ignore_eos every request asks for it and
    every reply must be max_tokens long (a build without it answers 400:
    the run stops, naming the server)."""
    extra = ["--threads", str(threads)] if threads else []
    servers = {}
    for b in batch:
        servers["this, --batch " + b] = start(["--slots", str(clients), "--ctx", "1024", "--batch", b, *extra])
    if base_cli:
        servers["base, --batch on"] = start(["--slots", str(clients), "--ctx", "1024", "--batch", "on", *extra], base_cli)
    prompts = ["Once upon a time", "The pass key is", "Some special magic numbers are hidden", "There is an important info"]
    keys = ("dhsa_decode_batches_total", "dhsa_decode_batch_rows_total", "dhsa_decode_batch_eval_seconds_total",
            "dhsa_decode_batch_sample_seconds_total")

    def batch_round(url, n, rep):
        res = [None] * n

        def one(i):  # whole replies by default: a Python client parsing an event per token can be the bottleneck
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": max_tokens, "temperature": 1.0, "top_k": 0,
                    "top_p": 1.0, "min_p": 0.0, "seed": 1000 * rep + i}
            if ignore_eos:
                body["ignore_eos"] = True
            try:
                res[i] = stream_usage(url, body) if stream else whole(url, body)["usage"]
            except urllib.error.HTTPError as e:
                res[i] = "%s: HTTP %d: %s" % (url, e.code, e.read().decode(errors="replace"))

        th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        for u in res:
            if isinstance(u, str):
                sys.exit("dhsa serve refused a request (a build without ignore_eos?): " + u)
            if ignore_eos and u["completion_tokens"] != max_tokens:
                sys.exit("--ignore-eos: a reply of %d tokens, not %d: %s" % (u["completion_tokens"], max_tokens, u))
        return sum(u["completion_tokens"] for u in res) / wall

    try:
        runs = {(name, n): [] for name in servers for n in (1, clients)}
        counters = {k: dict.fromkeys(keys, 0.0) for k in runs}
        for rep in range(-1, reps):  # -1: warm-up
            for name, (_, url, _) in servers.items():
                for n in (1, clients):
                    m0 = metrics(url)
                    v = batch_round(url, n, rep)
                    m1 = metrics(url)
                    if rep < 0:
                        continue
                    runs[(name, n)].append(v)
                    for k in keys:
                        counters[(name, n)][k] += m1.get(k, 0.0) - m0.get(k, 0.0)
        first = next(iter(servers))
        base = statistics.median(runs[(first, 1)])
        print("%d rounds (interleaved, after one warm-up), %d tokens per client, %s replies%s%s" %
              (reps, max_tokens, "streamed" if stream else "whole", ", --threads %d" % threads if threads else "",
               ", ignore_eos: every reply exactly %d tokens (EOS masked)" % max_tokens if ignore_eos else ""))
        print()
        print("| server | clients | total tok/s, median (rounds) | ratio of medians to 1 client, same server "
              "| median of per-round ratios, same server | ratio to 1 client of %s | mean batch "
              "| ms per pass: eval, per-token work in the batcher |" % first)
        print("|---|---|---|---|---|---|---|---|")
        for (name, n), v in runs.items():
            m, one = statistics.median(v), runs[(name, 1)]
            per = statistics.median(x / y for x, y in zip(v, one))
            c = counters[(name, n)]
            passes = c["dhsa_decode_batches_total"]
            mean = "%.2f" % (c["dhsa_decode_batch_rows_total"] / passes) if passes else "-"
            ms = "%.3f, %.3f" % (1e3 * c["dhsa_decode_batch_eval_seconds_total"] / passes,
                                 1e3 * c["dhsa_decode_batch_sample_seconds_total"] / passes) if passes else "-"
            print("| %s | %d | %.1f (%s) | %.2f | %.2f | %.2f | %s | %s |" % (
                name, n, m, ", ".join("%.0f" % x for x in v), m / statistics.median(one), per, m / base, mean, ms))
        for name in servers:
            v, one = runs[(name, clients)], runs[(name, 1)]
            print("\n%s: %d clients / 1 client = %.2fx (ratio of medians), %.2fx (median of per-round ratios); goal 2.5x"
                  % (name, clients, statistics.median(v) / statistics.median(one),
                     statistics.median(x / y for x, y in zip(v, one))))
    finally:
        for p, _, _ in servers.values():
            stop(p)


def stream_usage(url, body):
    """usage of a streamed completion."""
    return stream(url, body)[2]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["ttft", "slots"])
    ap.add_argument("--reps", type=int, default=3, help="rounds (slots) or documents (ttft)")
    ap.add_argument("--attn", default="dense", help="ttft: the server's --attn")
    ap.add_argument("--clients", type=int, default=4, help="slots: concurrent clients (and --slots)")
    ap.add_argument("--tokens", type=int, default=256, help="slots: max_tokens of each request")
    ap.add_argument("--batch", default="on,off", help="slots: the servers' --batch, comma-separated (default on,off)")
    ap.add_argument("--threads", type=int, default=0, help="slots: the servers' --threads (default: theirs)")
    ap.add_argument("--base-cli", default=None, help="slots: another build's dhsa, its --batch on server "
                    "measured in the same rounds (e.g. main before a change)")
    ap.add_argument("--stream", action="store_true", help="slots: streamed replies instead of whole ones")
    ap.add_argument("--ignore-eos", action="store_true", help="slots: every request asks \"ignore_eos\": true, so "
                    "each reply is --tokens long (as vLLM's benchmark_serving --ignore-eos); needs it in every "
                    "server measured, --base-cli's too")
    a = ap.parse_args()
    if a.what == "ttft":
        ttft(a.reps, a.attn)
    else:
        slots(a.reps, a.clients, a.tokens, tuple(a.batch.split(",")), a.threads or None, a.base_cli, a.stream,
              a.ignore_eos)
