#!/usr/bin/env python3
"""bench/serve.py: the dhsa serve numbers of docs/results.md (issue 14).

  ttft   the prompt cache: on the default model, a document of about 16K tokens
         (a passkey task of dhsa.retrieval_task) asked a first question (cold:
         the whole document is prefilled) and then two others sharing the
         document (warm: only the question is evaluated). Time to first token
         is measured at the client, from sending the request to the first SSE
         event with text; REPS documents (different seeds), medians.
  slots  total decode tokens/s of C concurrent clients against one, on the
         same server (--slots 4): each client streams max_tokens tokens of
         free text (ignore EOS is not an API option, so prompts that do not
         end early are used and the tokens counted from usage).

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
    p, url, _ = start(["--slots", str(clients), "--ctx", "1024", "--threads", "1"])
    prompts = ["Once upon a time", "The pass key is", "Some special magic numbers are hidden", "There is an important info"]

    def batch(n, rep):
        res = [None] * n

        def one(i):
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": max_tokens, "temperature": 1.0, "top_k": 0,
                    "top_p": 1.0, "min_p": 0.0, "seed": 1000 * rep + i}
            res[i] = stream(url, body)

        th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        toks = sum(r[2]["completion_tokens"] for r in res)
        return toks / wall, toks
    try:
        one, many = [], []
        for rep in range(reps):  # interleaved
            one.append(batch(1, rep)[0])
            many.append(batch(clients, rep)[0])
        m1, m4 = statistics.median(one), statistics.median(many)
        print("| clients | total tok/s, median (runs) | ratio to one |")
        print("|---|---|---|")
        print("| 1 | %.1f (%s) | 1.00 |" % (m1, ", ".join("%.1f" % x for x in one)))
        print("| %d | %.1f (%s) | %.2f |" % (clients, m4, ", ".join("%.1f" % x for x in many), m4 / m1))
    finally:
        stop(p)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["ttft", "slots"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--attn", default="dense", help="ttft: the server's --attn")
    a = ap.parse_args()
    ttft(a.reps, a.attn) if a.what == "ttft" else slots(a.reps)
