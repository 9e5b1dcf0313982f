"""Where the heads look when a multikey answer's first digit is predicted.

For N held-out 4-key multikey prompts at 512 tokens whose keywords all have
the same number of pieces (probe.py's held_same set, seed 11), runs the
model (PyTorch, from a GGUF file or a probe/train checkpoint) with explicit
attention and prints, per layer and head, the mean attention mass that the
row predicting the asked number's first digit puts on the right needle's
first digit and on each wrong needle's first digit; then, for the first
--show prompts, each head's five most attended positions from that row
(piece@offset:mass). docs/training.md, "The fifth run", reads it.

Usage (train/.venv, from train/):
    python heads.py MODEL.gguf|CKPT.pt [--n 40] [--show 2]
"""
import argparse
import math

import sentencepiece as spm
import torch
import torch.nn.functional as F

import model as M
import probe
import train
from export import load_gguf_weights, read_config


def forward_with_attention(m, ids):
    """Logits and [layer] -> attention probabilities [heads, T, T], computed
    as model.Block.forward computes them."""
    att = []
    cfg = m.cfg
    T = ids.shape[1]
    cos, sin = M.rope_tables(cfg, T)
    x = m.tok_embd(ids)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for blk in m.layers:
        h = blk.attn_norm(x)
        q = M.apply_rope(blk.wq(h).view(1, T, cfg.n_head, cfg.head_dim).transpose(1, 2), cos, sin)
        k = M.apply_rope(blk.wk(h).view(1, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2), cos, sin)
        v = blk.wv(h).view(1, T, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        g = cfg.n_head // cfg.n_kv_head
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        p = ((q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)).masked_fill(mask, float("-inf")).softmax(-1)
        att.append(p[0])
        x = x + blk.wo((p @ v).transpose(1, 2).reshape(1, T, -1))
        h = blk.ffn_norm(x)
        x = x + blk.w_down(F.silu(blk.w_gate(h)) * blk.w_up(h))
    return m.output(m.norm(x)), att


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--show", type=int, default=2)
    ap.add_argument("--tokenizer", default="tok2048.model")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.model.endswith(".pt"):
        ck = torch.load(a.model, weights_only=False, map_location="cpu")
        cfg, st = M.Config(**ck["cfg"]), ck["model"]
    else:
        cfg = read_config(a.model)
        st = load_gguf_weights(a.model, cfg)
    m = M.Model(cfg)
    own = m.state_dict().keys()
    m.load_state_dict({k: v for k, v in st.items() if k in own})  # session-9 probe files carry aliases too
    m.eval()
    sp = spm.SentencePieceProcessor(model_file=a.tokenizer)
    _, ev = train.load_sources("work")
    b = train.Builder(sp)
    colon = sp.piece_to_id(":")
    items = probe.eval_set(b, ev, a.n, 512, 11, probe.by_pieces(sp, ev))
    mass = torch.zeros(cfg.n_layer, cfg.n_head, 2)
    right = 0
    for n, (ids, ans) in enumerate(items):
        with torch.no_grad():
            lo, att = forward_with_attention(m, torch.tensor(ids[:-1])[None])
        j = next(i for i in range(ans, len(ids)) if ids[i] in b.digit_ids)
        row = j - 1
        firsts = [p for p in range(2, ans) if ids[p] in b.digit_ids and ids[p - 2] == colon]
        good = [p for p in firsts if ids[p:p + 7] == ids[j:j + 7]]
        bad = [p for p in firsts if p not in good]
        right += int(lo[0, row].argmax()) == ids[j]
        for l in range(cfg.n_layer):
            mass[l, :, 0] += att[l][:, row, good].sum(-1)
            mass[l, :, 1] += att[l][:, row, bad].sum(-1) / max(1, len(bad))
        if n < a.show:
            print("----", sp.decode(ids[row - 14:j + 7]))
            for l in range(cfg.n_layer):
                for h in range(cfg.n_head):
                    v, ix = att[l][h, row].topk(5)
                    print(f"L{l} H{h}", " ".join(f"{sp.id_to_piece(ids[i])}@{i - row}:{x:.2f}"
                                               for x, i in zip(v.tolist(), ix.tolist())))
    print(f"first digit right: {right} / {len(items)} (keywords of equal piece counts)")
    print("mean attention mass from the first-digit row: right needle's first digit / a wrong one's")
    for l in range(cfg.n_layer):
        print(f"L{l} " + "  ".join(f"H{h} {mass[l, h, 0] / len(items):.2f}/{mass[l, h, 1] / len(items):.2f}"
                                   for h in range(cfg.n_head)))


if __name__ == "__main__":
    main()
