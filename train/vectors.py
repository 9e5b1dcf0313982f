"""Greedy test vectors for a GGUF file, from the PyTorch forward (float32) on the
file's own weights: the independent reference tests/test_default_model.c holds
dhsa's greedy decoding to, token for token.

Cases: a held-out text continuation, and a passkey, a multikey and a
multivalue task at about 1K tokens over held-out filler with held-out keys
(dhsa must reproduce the model's answer whatever it is; the task cases also
record whether the answer is right).

Output format (text): per case the lines
  case NAME
  prompt ID ID ...        (BOS first)
  expect ID ID ...        (the greedy continuation, EOS included if reached)
  answer TEXT             (task cases: the expected answer; "-" otherwise)

Usage: python vectors.py MODEL.gguf TOKENIZER.model OUT.txt [--n 24]
"""
import argparse
import os
import random

import sentencepiece as spm
import torch

import tasks
from export import load_gguf_weights, read_config
from model import Model
from train import Builder, load_sources

HERE = os.path.dirname(os.path.abspath(__file__))


@torch.no_grad()
def greedy(m, ids, n, eos):
    out = []
    x = list(ids)
    for _ in range(n):
        lo = m(torch.tensor(x)[None])[0, -1]
        t = int(lo.argmax())
        out.append(t)
        if t == eos:
            break
        x.append(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--work", default=os.path.join(HERE, "work"))
    a = ap.parse_args()
    torch.set_num_threads(2)
    sp = spm.SentencePieceProcessor(model_file=a.tokenizer)
    cfg = read_config(a.model)
    m = Model(cfg)
    m.load_state_dict(load_gguf_weights(a.model, cfg))
    m.eval()
    _, ev = load_sources(a.work)
    b = Builder(sp)
    rng = random.Random(2026)
    cases = [("text", [sp.bos_id()] + sp.encode(ev.span(rng, 600)), "-")]
    for kind, kw in (("passkey", {}), ("multikey", {"n_keys": 4}), ("multivalue", {"n_values": 3, "n_distract": 1})):
        ids, at = b.sample(kind, ev, rng, 1024, **kw)
        cases.append((kind, ids[:at], sp.decode(ids[at:-1])))
    lines = []
    for name, ids, ans in cases:
        exp = greedy(m, ids, a.n, sp.eos_id())
        got = sp.decode([t for t in exp if t != sp.eos_id()])
        mark = "" if ans == "-" else ("  (right)" if got.strip().startswith(ans.strip()) else "  (wrong)")
        print(f"{name}: {len(ids)} prompt tokens -> {got!r}{mark}")
        lines += [f"case {name}", "prompt " + " ".join(map(str, ids)), "expect " + " ".join(map(str, exp)),
                  "answer " + (ans.strip() if ans != "-" else "-")]
    tmp = a.out + ".part"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
