#!/usr/bin/env python3
"""bench/serve.py: the dhsa serve numbers of docs/results.md (issue 14).

  ttft   the prompt cache: on the default model, a document of about 16K tokens
         (a passkey task of dhsa.retrieval_task) asked a first question (cold:
         the whole document is prefilled) and then two others sharing the
         document (warm: only the question is evaluated). Time to first token
         is measured at the client, from sending the request to the first SSE
         event with text; REPS documents (different seeds), medians.
  slots  total decode tokens/s of 4 concurrent clients against one, on
         servers with --slots 4 and --batch on / off, interleaved: each client
         asks (without streaming) up to 256 tokens of free text sampled at temperature 1 (the
         tokens are counted from usage: a client that meets EOS counts less).

Usage: PYTHONPATH=python python3 bench/serve.py ttft|slots [--reps N] [--attn dense|dhsa]
(needs build/dhsa built with dhsa serve; starts and stops its own servers on
free ports). Prints markdown rows.
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
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.environ.get("DHSA_CLI", os.path.join(REPO, "build", "dhsa"))


def start(args):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    p = subprocess.Popen([CLI, "serve", "--port", "0", *args], stderr=log, stdout=subprocess.DEVNULL, cwd=REPO)
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


def slots(reps, clients=4, max_tokens=256):
    """Interleaved, per repetition: 1 and `clients` concurrent clients against a
    server with --batch on (the decode steps of all slots in one pass) and one
    with --batch off (each slot decodes alone on its own threads)."""
    servers = {b: start(["--slots", str(clients), "--ctx", "1024", "--batch", b]) for b in ("on", "off")}
    prompts = ["Once upon a time", "The pass key is", "Some special magic numbers are hidden", "There is an important info"]

    def batch(url, n, rep):
        res = [None] * n

        def one(i):  # whole replies: a Python client parsing an event per token would be the bottleneck
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": max_tokens, "temperature": 1.0, "top_k": 0,
                    "top_p": 1.0, "min_p": 0.0, "seed": 1000 * rep + i}
            res[i] = whole(url, body)

        th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        return sum(r["usage"]["completion_tokens"] for r in res) / wall
    try:
        runs = {(b, n): [] for b in ("on", "off") for n in (1, clients)}
        for rep in range(reps):
            for b in ("on", "off"):
                for n in (1, clients):
                    runs[(b, n)].append(batch(servers[b][1], n, rep))
        base = statistics.median(runs[("on", 1)])
        print("| --batch | clients | total tok/s, median (runs) | ratio of medians to one client, --batch on "
              "| median of the per-repetition ratios |")
        print("|---|---|---|---|---|")
        for (b, n), v in runs.items():
            m = statistics.median(v)
            per = statistics.median(x / y for x, y in zip(v, runs[("on", 1)]))
            print("| %s | %d | %.1f (%s) | %.2f | %.2f |" % (b, n, m, ", ".join("%.0f" % x for x in v), m / base, per))
    finally:
        for p, _, _ in servers.values():
            stop(p)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["ttft", "slots"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--attn", default="dense", help="ttft: the server's --attn")
    a = ap.parse_args()
    ttft(a.reps, a.attn) if a.what == "ttft" else slots(a.reps)
