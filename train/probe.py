"""Short probes of the multikey circuit: which change sharpens the keyword match?

The shipped model answers 4-key multikey prompts as well at 256 tokens as at
1K (diagnose.py: 25-31 of 40 right at 256, 512 and 1K), so the miss is not a
matter of length, and a change of recipe or shape can be judged on short
texts, where a step costs a fraction of a second. A probe trains on
multiquery texts (every keyword asked and answered, 4 to 6 keywords at
256-512 tokens, training filler and keys) plus word-list copies, and every
--eval-every steps reads the first digit of the asked number (the token
where the keyword must be matched) and the whole answer (teacher-forced
argmax) on --eval-n held-out 4-key multikey prompts (held-out filler and
keywords) at 512 tokens.

Variants: from the shipped weights (--init) or from scratch; --kv-heads
widens an --init model's KV heads by duplication (each query head gets a
copy of its group's K/V projection, so the model starts as exactly the
file's function); --tokenizer for a larger vocabulary (from scratch only).

Usage (train/.venv, from train/):
    python probe.py --out /tmp/p.jsonl [--init ../models/dhsa-retrieval-8m.gguf] [--kv-heads 6]
                    [--steps 600] [--lr 5e-4] [--threads 1]
"""
import argparse
import copy
import json
import os
import random
import time

import sentencepiece as spm
import torch
import torch.nn.functional as F

import attsup
import tasks
import train
from model import Config, Model


def widen_kv(st, cfg, n_kv):
    """State of the same model with n_kv KV heads: query head h reads a copy of
    the K/V head it read before (h // (n_head / old n_kv))."""
    g_old = cfg.n_head // cfg.n_kv_head
    g_new = cfg.n_head // n_kv
    out = dict(st)
    for k, v in st.items():
        if k.endswith("wk.weight") or k.endswith("wv.weight"):
            heads = v.view(cfg.n_kv_head, cfg.head_dim, -1)
            out[k] = torch.cat([heads[(j * g_new) // g_old] for j in range(n_kv)], 0).clone()
    return out


def by_pieces(sp, src):
    """src's keywords grouped by their number of pieces (1-2, 3, 4, 5+): a
    source per group, sharing the text."""
    groups = {}
    for k in src.keywords:
        if k:
            groups.setdefault(min(max(len(sp.encode(k)), 2), 5), []).append(k)
    out = []
    for g in sorted(groups):
        s = copy.copy(src)
        s.keywords = groups[g]
        out.append(s)
    return out


def eval_set(b, ev, n, T, seed, groups=None):
    """n 4-key prompts; with groups, the 4 keywords of a prompt have the same
    number of pieces (a group drawn in proportion to its size)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = random.Random(rng.random())
        src = ev
        if groups:
            src = r.choices(groups, weights=[len(g.keywords) for g in groups])[0]
        kws = r.sample(src.keywords, 4)
        nums = [ev.number(r, 7) for _ in kws]
        t = r.randrange(4)
        body, _ = tasks._insert(ev.span(r, int((T - 120) * b.cpt)),
                                [tasks.magic_needle(k, v) for k, v in zip(kws, nums)], [r.random() for _ in kws])
        ids, a = b.encode(tasks.MAGIC_PRE + body + tasks.multikey_q(kws[t]), f" {nums[t]}")
        out.append((ids, a))
    return out


@torch.no_grad()
def evaluate(model, items, b):
    model.eval()
    first = exact = 0
    for ids, a in items:
        lo = model(torch.tensor(ids[:-1])[None])[0]
        pred = lo[a - 1:len(ids) - 2].argmax(-1)
        want = torch.tensor(ids[a:len(ids) - 1])
        exact += bool((pred == want).all())
        j = next(i for i in range(a, len(ids)) if ids[i] in b.digit_ids)  # the first digit
        first += int(lo[j - 1].argmax()) == ids[j]
    model.train()
    return first / len(items), exact / len(items)


def batch(b, tr, rng, tokens, lengths, groups=None, p_same=0.0, targets=None):
    """targets: a list that receives (sequence, row, [positions]) for every
    answer's first digit: the row that predicts it and the positions of the
    same number's first digit in the needles (for --att-sup)."""
    T = rng.choice(lengths)
    B = max(1, tokens // T)
    x = torch.zeros(B, T, dtype=torch.long)
    y = torch.zeros(B, T, dtype=torch.long)
    w_lm, w_ans, w_first = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T)
    for i in range(B):
        if rng.random() < 0.8:
            src = tr
            if groups and rng.random() < p_same:  # every keyword of the text as long as the others
                src = rng.choices(groups, weights=[len(g.keywords) for g in groups])[0]
            try:
                ids, spans = b.sample_multiquery(src, rng, T + 1, many=True)
            except RuntimeError:  # too long for a 128-token sequence: a copy text instead
                ids, spans = b.sample_copy(tr, rng, T + 1)
        else:
            ids, spans = b.sample_copy(tr, rng, T + 1)
        n = len(ids) - 1
        x[i, :n] = torch.tensor(ids[:-1])
        y[i, :n] = torch.tensor(ids[1:])
        w_lm[i, :n] = 1
        for c0, c1 in spans:
            w_ans[i, c0 - 1:c1 - 1] = 1
        for j in range(1, n + 1):
            if w_ans[i, j - 1] and ids[j - 1] == b.space_id and ids[j] in b.digit_ids:
                w_first[i, j - 1] = 1
        if targets is not None:
            targets += [(i, *t) for t in attsup.targets_for(b.anchors, ids, w_first[i].nonzero().flatten().tolist())]
    return x, y, w_lm, w_ans, w_first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--init")
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--tokenizer", default="tok2048.model")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--lengths", default="256,512")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-n", type=int, default=100)
    ap.add_argument("--reinit", default="",
                    help="with --init: comma-separated layers whose blocks start from fresh random weights")
    ap.add_argument("--save", help="the model's state (torch.save) at every evaluation, written to .part and renamed")
    ap.add_argument("--att-sup", default="",
                    help="LAYER:H1,H2,..: those heads' attention at an answer's first-digit row is pulled to the "
                         "needle's first digit (an auxiliary loss)")
    ap.add_argument("--att-weight", type=float, default=1.0)
    ap.add_argument("--gather-sup", default="",
                    help="LAYER:H1,..: those heads' attention at the answer row and at the needle's first digit "
                         "is pulled to the keyword's pieces (the first hop; with --att-sup)")
    ap.add_argument("--same-len", type=float, default=0.0,
                    help="share of multiquery texts whose keywords all have the same number of pieces")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    sp = spm.SentencePieceProcessor(model_file=a.tokenizer)
    if a.init:
        from export import load_gguf_weights, read_config
        cfg = read_config(a.init)
        st = load_gguf_weights(a.init, cfg)
        if a.kv_heads and a.kv_heads != cfg.n_kv_head:
            st = widen_kv(st, cfg, a.kv_heads)
            cfg = Config(**{**cfg.to_dict(), "n_kv_head": a.kv_heads})
        model = Model(cfg)
        model.load_state_dict(st)
        for i in [int(x) for x in a.reinit.split(",") if x]:  # fresh weights, as Model() draws them
            fresh = Model(cfg).layers[i]
            model.layers[i].load_state_dict(fresh.state_dict())
    else:
        cfg = Config(vocab=sp.vocab_size(), dim=384, n_layer=a.layers, n_head=6,
                     n_kv_head=a.kv_heads or 2, head_dim=64, ffn=1024)
        model = Model(cfg)
    tr, ev = train.load_sources("work")
    b = train.Builder(sp)
    b.anchors = attsup.Anchors(sp)
    held = eval_set(b, ev, a.eval_n, 512, 11)
    held_same = eval_set(b, ev, a.eval_n, 512, 11, by_pieces(sp, ev))
    groups = by_pieces(sp, tr)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    lengths = [int(x) for x in a.lengths.split(",")]
    rng = random.Random(a.seed)
    log = open(a.out, "a")
    f0, e0 = evaluate(model, held, b)
    f1, e1 = evaluate(model, held_same, b)
    log.write(json.dumps({"step": 0, "first": f0, "exact": e0, "first_same": f1, "exact_same": e1,
                          "cfg": cfg.to_dict(), "args": vars(a)}) + "\n")
    log.flush()
    sup = attsup.Supervisor(model, a.gather_sup, a.att_sup)
    for step in range(1, a.steps + 1):
        t0 = time.time()
        targets = [] if sup.active() else None
        x, y, w_lm, w_ans, w_first = batch(b, tr, rng, a.tokens, lengths, groups, a.same_len, targets)
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / a.warmup)
        ce = F.cross_entropy(model(x).reshape(-1, cfg.vocab), y.reshape(-1), reduction="none").view(y.shape)
        terms = [(ce * w).sum() / w.sum().clamp(min=1) for w in (w_lm, w_ans, w_first)]
        if sup.active():
            terms += [a.att_weight * v for v in sup.losses(targets)]
        loss = sum(terms)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rec = {"step": step, "loss": round(loss.item(), 4), "ans": round(terms[1].item(), 4),
               "firstloss": round(terms[2].item(), 4), "sec": round(time.time() - t0, 2)}
        if sup.active():
            rec["gatherloss"], rec["attloss"] = round(terms[3].item(), 4), round(terms[4].item(), 4)
        if step % a.eval_every == 0:
            rec["first"], rec["exact"] = evaluate(model, held, b)
            rec["first_same"], rec["exact_same"] = evaluate(model, held_same, b)
            print(json.dumps(rec), flush=True)
            if a.save:
                torch.save({"cfg": cfg.to_dict(), "model": model.state_dict(), "step": step}, a.save + ".part")
                os.replace(a.save + ".part", a.save)
        log.write(json.dumps(rec) + "\n")
        log.flush()


if __name__ == "__main__":
    main()
