"""_rest.py: the keys a routed call leaves out, summarised per chunk, for
dhsa.torch's transformers plug-in: what a dhsa session's `rest` does
(src/route/rest.c; docs/dhsa.md, "The rest of the keys, summarised"),
for one call that holds its keys from position 0.

Contract (docs/torch.md, "The routing a dhsa session runs"):
  - attend(o, lse, q, k, v, lay, p, scale, softcap, q_pos0, starts=None): o [B, Lq, Hq,
    dv] (the sparse attention's output, BLHD) and lse [B, Hq, Lq] (its
    log-sum-exp) become the attention over the kept keys and, per query
    block, every chunk of the call's keys that ends at or before the
    block's first row and shares no key with the block's ranges, attended
    as one key: its mean key, its mean value, and a bias of log(its key
    count) after the softcap; the two merged exactly through their
    log-sum-exps. The chunks: starts[b] (bounds, e.g. a decode index's
    closed chunks, dhsa.KVIndex.bounds(): what a session summarises), or
    the router's for these keys and parameters (the torch router's
    boundary rule, dhsa_route's); means in
    float64, used in float32. Returns the summaries read (rows x KV heads x
    chunks, as dhsa_attn_stats.summaries counts them).
  - Cost: the mean keys and values, O(Lk d Hkv); the summaries' scores,
    Lq x chunks per query head, computed in slices of rows (never Lq x Lk).
Tested by python/tests/test_torch_hf.py against a float64 reference.
"""

import dataclasses
import math

import numpy as np
import torch

import dhsa

from ._route import _P, _boundaries

_ROWS = 512  # query rows per slice of the summaries' scores


def _block_ranges(lay, b, g):
    """[n_blocks] arrays [n, 2] int64 of the ranges of blocks (b, g, .)."""
    if hasattr(lay, "merged"):  # a TorchLayout
        r, n = lay.merged()
        r, n = r[b, g].cpu().numpy(), n[b, g].cpu().numpy()
        return [r[i, :n[i]] for i in range(lay.n_blocks)]
    return [lay.ranges(b, g, i) for i in range(lay.n_blocks)]


def _left_out(starts, ranges, end):
    """Bool [nc]: the chunks (starts [nc + 1], numpy) that end at or before
    `end` and share no key with the ranges [n, 2]."""
    nc = len(starts) - 1
    free = starts[1:] <= end
    if len(ranges):
        lo = np.searchsorted(starts, ranges[:, 0], side="right") - 1  # first chunk each range touches
        hi = np.searchsorted(starts, ranges[:, 1], side="left")        # one past its last
        mark = np.zeros(nc + 1, dtype=np.int64)
        np.add.at(mark, np.clip(lo, 0, nc), 1)
        np.add.at(mark, np.clip(hi, 0, nc), -1)
        free &= np.cumsum(mark)[:nc] == 0
    return free


def _starts(kb, p, P):
    """Chunk starts [nc + 1] (int64 tensor) of one batch's keys kb [Hkv,
    Lk, d] under p: the torch router's boundary rule (dhsa_route's), or,
    for learned boundaries cut causally (the decode index's online rule,
    which the torch router does not run), the C decode index's chunks
    (its last closed chunk, whose end the index does not list, joined to
    the open tail: never summarised)."""
    if P is not None:
        return _boundaries(kb, P)
    Hkv, Lk, d = kb.shape
    with dhsa.KVIndex(Hkv, d, Lk, params=p) as ix:
        ix.append(kb.detach().float().cpu().numpy()[None])
        c = [int(x) for x in ix.chunks()]
    ends = sorted(set([0] + c + [Lk]))
    return torch.tensor(ends, dtype=torch.int64, device=kb.device)


def attend(o, lse, q, k, v, lay, p, scale, softcap, q_pos0, starts=None):
    B, Hq, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    # the boundaries do not depend on the chunk score: the torch router's
    # _P accepts "moments" for any score the C router runs
    learned_causal = isinstance(p.boundary, dhsa.Predictor) and p.causal_boundaries
    P = None if learned_causal else _P(dataclasses.replace(p, score="moments"))
    qb, nb = lay.q_block, lay.n_blocks
    wd = torch.float64 if q.device.type == "cpu" else torch.float32
    count = 0
    for b in range(B):
        starts_t = _starts(k[b], p, P) if starts is None else \
            torch.as_tensor(starts[b], dtype=torch.int64, device=k.device)
        bnd = starts_t.cpu().numpy()
        nc = len(bnd) - 1
        if nc < 1:
            continue
        ln = starts_t[1:] - starts_t[:-1]
        cid = torch.repeat_interleave(torch.arange(nc, device=k.device), ln)
        n = ln.to(wd)
        k0, k1 = int(bnd[0]), int(bnd[-1])  # the chunks' keys (a decode index's closed ones)
        mk = torch.zeros(Hkv, nc, d, dtype=wd, device=k.device).index_add_(1, cid, k[b, :, k0:k1].to(wd))
        mv = torch.zeros(Hkv, nc, v.shape[-1], dtype=wd, device=k.device).index_add_(
            1, cid, v[b, :, k0:k1].to(wd))
        mk = (mk / n[None, :, None]).float()
        mv = (mv / n[None, :, None]).float()
        bias = torch.log(n).float()
        for g in range(Hkv):
            rg = _block_ranges(lay, b, g)
            free = np.stack([_left_out(bnd, rg[i], q_pos0 + i * qb) for i in range(nb)])  # [nb, nc]
            if not free.any():
                continue
            rows_per = np.minimum(qb, Lq - np.arange(nb) * qb)
            count += int((free.sum(1) * rows_per).sum())
            allow = torch.from_numpy(free).to(q.device)
            for r0 in range(0, Lq, _ROWS):
                r1 = min(Lq, r0 + _ROWS)
                blk = torch.arange(r0, r1, device=q.device) // qb
                ok = allow[blk]                                           # [rows, nc]
                if not bool(ok.any()):
                    continue
                qs = q[b, g * G:(g + 1) * G, r0:r1].float()               # [G, rows, d]
                s = torch.matmul(qs, mk[g].T) * scale                     # [G, rows, nc]
                if softcap > 0:
                    s = softcap * torch.tanh(s / softcap)
                s = (s + bias).masked_fill(~ok, -math.inf)
                l2 = torch.logsumexp(s, -1)                               # [G, rows]
                w = torch.exp(s - torch.where(torch.isfinite(l2), l2, torch.zeros_like(l2))[..., None])
                o2 = torch.matmul(w, mv[g])                               # [G, rows, dv]
                l1 = lse[b, g * G:(g + 1) * G, r0:r1].float()
                m = torch.maximum(l1, l2)
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
                o1 = o[b, r0:r1, g * G:(g + 1) * G].transpose(0, 1).float()  # [G, rows, dv]
                tot = w1 + w2
                mix = (o1 * w1[..., None] + o2 * w2[..., None]) / torch.where(tot > 0, tot, 1)[..., None]
                o[b, r0:r1, g * G:(g + 1) * G] = mix.transpose(0, 1).to(o.dtype)
                lse[b, g * G:(g + 1) * G, r0:r1] = (m + torch.log(tot)).to(lse.dtype)
    return count
