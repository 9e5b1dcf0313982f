"""Where multikey answers go wrong: the first digit of the asked number.

For N multikey prompts (4 keywords) on training keys and on held-out keys,
runs the model (PyTorch, from a GGUF file) on the prompt plus the right
answer and reads the distribution over the ten digits at the row that
predicts the answer's first digit (the one token where the keyword must be
matched: every later digit is a copy of the next token). Prints each miss
(the asked keyword's pieces, the other keywords', the digit wanted, the
digit predicted, whether it is another keyword's first digit, and both
probabilities), then per key set: right, misses that are a distractor's
first digit, mean pieces per keyword.

Usage (train/.venv, from train/):
    python diagnose.py MODEL.gguf [--n 40] [--length 1024] [--seed 5]
"""
import argparse
import random
from collections import Counter

import sentencepiece as spm
import torch

import tasks
import train
from export import load_gguf_weights, read_config
from model import Model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = read_config(a.model)
    m = Model(cfg)
    m.load_state_dict(load_gguf_weights(a.model, cfg))
    m.eval()
    sp = spm.SentencePieceProcessor(model_file="tok2048.model")
    tr, ev = train.load_sources("work")
    b = train.Builder(sp)
    digits = [sp.piece_to_id(str(d)) for d in range(10)]
    rng = random.Random(a.seed)
    st = Counter()
    for src, name in ((tr, "train"), (ev, "heldout")):
        for _ in range(a.n):
            r = random.Random(rng.random())
            kws = r.sample(src.keywords, 4)
            nums = [src.number(r, 7) for _ in kws]
            t = r.randrange(4)
            body, _ = tasks._insert(src.span(r, int((a.length - 120) * b.cpt)),
                                    [tasks.magic_needle(k, n) for k, n in zip(kws, nums)], [r.random() for _ in kws])
            ids, ans = b.encode(tasks.MAGIC_PRE + body + tasks.multikey_q(kws[t]), f" {nums[t]}")
            with torch.no_grad():
                lo = m(torch.tensor(ids[:-1])[None])[0]
            p = lo[ans].softmax(-1)[digits]  # row ans reads the answer's "▁" and predicts its first digit
            pred, want = int(p.argmax()), int(str(nums[t])[0])
            others = [int(str(n)[0]) for j, n in enumerate(nums) if j != t]
            pieces = [sp.encode(k, out_type=str) for k in kws]
            st[name, "n"] += 1
            st[name, "pieces"] += len(pieces[t])
            if pred == want:
                st[name, "right"] += 1
                continue
            st[name, "distractor"] += pred in others
            print(f"{name}: {kws[t]} {pieces[t]} others {[pieces[j] for j in range(4) if j != t]}: want {want} "
                  f"(p {p[want]:.2f}) got {pred} (p {p[pred]:.2f}){', a distractor' if pred in others else ''}")
    for name in ("train", "heldout"):
        n = st[name, "n"]
        print(f"{name}: {st[name, 'right']}/{n} right; misses that are a distractor's first digit: "
              f"{st[name, 'distractor']}/{n - st[name, 'right']}; pieces per asked keyword {st[name, 'pieces'] / n:.2f}")


if __name__ == "__main__":
    main()
