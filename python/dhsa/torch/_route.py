"""_route.py: the DHSA router in vectorised torch operations, on any
device, giving the layout dhsa_route (src/route/route.c) gives on the same
inputs; TorchLayout, the layout it makes, for the torch back end's sparse
attention (FlexAttention's BlockMask on CUDA, a gather of each query
block's keys elsewhere: _backend.py).

Contract (docs/torch.md, "DHSA in the torch back end"):
  - route(q, k, causal=, window=, q_pos0=, params=, **router): q
    [B, Hq, Lq, d], k [B, Hkv, Lk, d] (BHLD, post-RoPE) on one device; the
    router keywords and defaults of dhsa.route() (RouterParams). Supported:
    methods "dhsa", "block" and "stream"; boundaries "similarity" (with
    NMS, min_chunk, max_chunk, causal_boundaries) and "fixed"; chunk scores
    "moments" (default), "heads" and "pooled"; share_heads; budget or density with
    sinks, local keys, scale_fixed, dense_below; causal, window, q_pos0.
    Learned boundaries (a dhsa.Predictor): its network ported
    (_learned_score, the same file's weights), non-causal boundaries only.
    Refused with a sentence (ValueError): the oracle baseline (two dense QK
    passes, evaluation only), learned boundaries with causal_boundaries
    (the decode index's online rule, sequential) and the "bound" and
    "rows" scores; route those with dhsa.route() on the CPU and pass
    the dhsa.Layout as sparse=.
  - Same layout as C: the steps of route.c in the same order with the same
    rules (candidates, NMS in score order, even splits, per-block greedy
    selection with its half-chunk overshoot rule, the fill from passed-over
    chunks, max_ranges); sums in float64 (float32 on devices without
    float64) where C sums in double or float. What can differ is the order
    of float operations: a chunk score within about 1e-6 (relative) of
    another can rank the other way (a near tie; tests/test_torch_route.py
    checks that every difference is one).
  - Cost: O(Lk d Hkv) for boundaries and pooling, O(n_blocks x chunks) for
    the scores and the selection, never Lq x Lk; the greedy selection runs
    all blocks at once, one pass per chunk a block passes over near its
    budget's end (a handful).
Tested by python/tests/test_torch_route.py.
"""

import math

import numpy as np
import torch

import dhsa
from dhsa import _capi
from dhsa._route import RouterParams, _router_params

# ------------------------------------------------------------ params ---


class _P:
    """The router parameters as C sees them (RouterParams.to_c(): float32
    fields rounded, boundary resolved), checked as dhsa__route_check_params."""

    def __init__(self, params):
        if params.method == "oracle":
            raise ValueError("dhsa.torch: the oracle baseline (chunks ranked by their true "
                             "attention mass, two dense QK passes: evaluation only) runs in the C "
                             "router only: route with dhsa.route() on CPU tensors and pass the "
                             "dhsa.Layout as sparse=")
        self.predictor = params.boundary if isinstance(params.boundary, dhsa.Predictor) else None
        if self.predictor is not None and params.causal_boundaries:
            raise ValueError("dhsa.torch: learned boundaries with causal_boundaries=True follow "
                             "the decode index's online rule (a sequential state machine), "
                             "which runs in the C router only: route with dhsa.route(..., "
                             "boundary=predictor, causal_boundaries=True) on CPU tensors and "
                             "pass the dhsa.Layout as sparse=, or use causal_boundaries=False")
        if params.score not in ("moments", "heads", "pooled"):
            raise ValueError("dhsa.torch: the %r chunk score runs in the C router only (the torch "
                             "router has 'moments', 'heads' and 'pooled'): route with "
                             "dhsa.route() on CPU tensors and pass the dhsa.Layout as sparse="
                             % (params.score,))
        rp, _ = params.to_c()
        for f, _t in _capi.RouterParams._fields_:
            if f != "predictor":
                setattr(self, f, getattr(rp, f))
        self.stream = rp.method == _capi.DHSA_ROUTE_STREAM
        self.picked = self.sink_window > self.sink_tokens  # dhsa__sink_picked
        self.fixed = rp.boundary == _capi.DHSA_BOUNDARY_FIXED
        self.moments = rp.score_mode == _capi.DHSA_SCORE_MOMENTS
        self.heads = rp.score_mode == _capi.DHSA_SCORE_HEADS
        self.two = self.moments or self.heads  # keys pooled as [mean, variance]
        bad = None
        if not 1 <= self.q_block <= (1 << 20):
            bad = "q_block = %d: use 1..2^20" % self.q_block
        elif (self.chunk < 1 or self.min_chunk < 1 or self.max_chunk < self.min_chunk
              or self.sim_window < 1 or self.nms_window < 0 or self.max_chunk > (1 << 40)):
            bad = ("chunk sizes: need chunk >= 1, 1 <= min_chunk <= max_chunk, sim_window >= 1, "
                   "nms_window >= 0 (got chunk %d, min %d, max %d, w %d, nms %d)"
                   % (self.chunk, self.min_chunk, self.max_chunk, self.sim_window,
                      self.nms_window))
        elif not 0 <= self.sink_window <= 4096:
            bad = "sink_window = %d: use 0 (the first sink_tokens keys) .. 4096" % self.sink_window
        elif not math.isfinite(self.threshold):
            bad = "threshold must be finite"
        elif min(self.budget_tokens, self.sink_tokens, self.local_tokens, self.dense_below) < 0:
            bad = "budget, sink, local and dense_below must be >= 0"
        elif self.budget_tokens == 0 and not 0.0 < self.density <= 1.0:
            bad = "density = %g: give budget > 0 or a density in (0, 1]" % self.density
        elif self.heads and self.share_heads:
            bad = ("the heads chunk score weighs each query head against its own KV head's "
                   "chunks: it cannot share one routing over all heads (share_heads = 1)")
        if bad:
            raise ValueError("dhsa.torch.route: " + bad)

    def limits(self, Lk):
        """(min_len, max_chunks, max_ranges): dhsa__route_limits."""
        min_len = self.chunk if self.fixed else self.min_chunk
        smallest = min_len
        if self.boundary == _capi.DHSA_BOUNDARY_SIMILARITY and self.max_chunk // 2 < smallest:
            smallest = max(self.max_chunk // 2, 1)
        max_chunks = Lk // smallest + 2
        if Lk < self.dense_below:
            max_ranges = 1
        else:
            budget = float(self.budget_tokens) if self.budget_tokens > 0 \
                else math.ceil(self.density * Lk)
            # + sink, local, two clipped chunks, one overshoot, + one range per picked sink;
            # never more than every chunk, the sinks and the local keys
            picked = self.sink_tokens if self.picked else 0
            r = budget / smallest + 5.0 + picked
            max_ranges = max_chunks + 2 + picked if r > max_chunks + 2 + picked else int(r)
        return min_len, max_chunks, max_ranges


def _wide(dev):
    """The accumulation dtype: float64 where the device has it."""
    return torch.float32 if dev.type == "mps" else torch.float64

# -------------------------------------------------------- boundaries ---


def _similarity_score(kb, p):
    """score [Lk] float32 for the keys kb [Hkv, Lk, d] of one batch:
    mean over KV heads of 1 - cos(sum k[t-w, t), sum k[t, t+w)) (right
    window k[t] with causal_boundaries), each head's term rounded to
    float32 and the heads added in order in float32, as route.c."""
    Hkv, Lk, d = kb.shape
    wd = _wide(kb.device)
    w = p.sim_window
    t = torch.arange(1, Lk, device=kb.device)
    score = torch.zeros(Lk, dtype=torch.float32, device=kb.device)
    for g in range(Hkv):  # one head at a time: [Lk, d] in float64
        x = kb[g].to(wd)
        cs = torch.cat([torch.zeros(1, d, dtype=wd, device=x.device), torch.cumsum(x, 0)])
        left = cs[t] - cs[(t - w).clamp(min=0)]
        right = x[t] if p.causal_boundaries else cs[(t + w).clamp(max=Lk)] - cs[t]
        xy = (left * right).sum(-1)
        xx = (left * left).sum(-1)
        yy = (right * right).sum(-1)
        ok = (xx > 0) & (yy > 0)
        cos = torch.where(ok, xy / torch.sqrt(torch.where(ok, xx * yy, torch.ones_like(xx))),
                          torch.ones_like(xy))
        part = ((1.0 - cos) / Hkv).to(torch.float32)
        if Hkv == 1:
            score[1:] = part
        else:
            score[1:] += part
    return score


def _nms(cand_t, cand_s, Lk, gap):
    """The kept boundaries (sorted positions) of greedy NMS in score order
    (score descending, earlier position first on ties): a candidate is
    kept iff no kept better one is within distance < gap. Computed in
    rounds: an undecided candidate best among the undecided within gap is
    kept, and the undecided within gap of a kept one are suppressed."""
    dev = cand_t.device
    n = cand_t.numel()
    if n == 0:
        return cand_t
    order = torch.sort(cand_s, descending=True, stable=True).indices
    rank = torch.empty(n, dtype=torch.float64, device=dev)
    rank[order] = torch.arange(n, dtype=torch.float64, device=dev)
    big = float(n + 1)
    at = torch.full((Lk,), big, dtype=torch.float64, device=dev)  # rank at each position
    at[cand_t] = rank
    und = torch.zeros(Lk, dtype=torch.bool, device=dev)
    und[cand_t] = True
    kept = torch.zeros(Lk, dtype=torch.bool, device=dev)
    ksz = 2 * gap - 1
    pool = torch.nn.functional.max_pool1d
    for _ in range(n):
        if not bool(und.any()):
            break
        r = torch.where(und, at, torch.full_like(at, big))
        best = -pool(-r.view(1, 1, Lk), ksz, stride=1, padding=gap - 1).view(Lk)
        new = und & (r == best)
        kept |= new
        near = pool(new.to(torch.float64).view(1, 1, Lk), ksz, stride=1, padding=gap - 1).view(Lk)
        und = und & ~new & ~(near > 0)
    return torch.nonzero(kept).view(-1)


# ---------------------------------------------------- learned boundaries ---


def predictor_weights(pred, device):
    """The weights of a dhsa.Predictor as float32 tensors on `device`
    (read from its file format, docs/predictor.md: header, then wq [C][C],
    bq, wk, bk, wv, bv, gamma, beta [C], w1 [4C + 1][hidden], b1, w2
    [hidden], b2), cached on the predictor per device."""
    cache = pred.__dict__.setdefault("_torch_weights", {})
    key = str(device)
    if key in cache:
        return cache[key]
    import os
    import struct
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "predictor.bin")
        pred.save(path)
        with open(path, "rb") as f:
            data = f.read()
    C, w, hidden = struct.unpack("<III", data[12:24])
    fl = np.frombuffer(data, dtype="<f4", offset=28, count=(len(data) - 32) // 4)
    F = 4 * C + 1
    sizes = [("wq", C * C), ("bq", C), ("wk", C * C), ("bk", C), ("wv", C * C), ("bv", C),
             ("gamma", C), ("beta", C), ("w1", F * hidden), ("b1", hidden), ("w2", hidden),
             ("b2", 1)]
    out, at = {"C": C, "w": w, "hidden": hidden}, 0
    for name, n in sizes:
        out[name] = torch.from_numpy(fl[at:at + n].copy()).to(device)
        at += n
    for name in ("wq", "wk", "wv"):
        out[name] = out[name].view(C, C)
    out["w1"] = out["w1"].view(F, hidden)
    cache[key] = out
    return out


LEARNED_SLAB = 8192  # candidates per pass of the predictor: [slab, 2w, C] windows


def _learned_score(kb, pred):
    """Boundary probabilities p [Lk] float32 of the keys kb [Hkv, Lk, d] of
    one batch: the predictor's network (docs/predictor.md) for every
    candidate at once, its windows as strided views, LayerNorm statistics
    and the cosine in float64 as src/route/predictor.c; p[0] = 0."""
    Hkv, Lk, d = kb.shape
    dev = kb.device
    W = predictor_weights(pred, dev)
    C, w = W["C"], W["w"]
    if Hkv * d != C:
        raise ValueError("the predictor reads C = %d features per token but k has %d KV heads x %d "
                         "dims = %d: one predictor per model (KV heads x head dim)"
                         % (C, Hkv, d, Hkv * d))
    wd = _wide(dev)
    X = kb.permute(1, 0, 2).reshape(Lk, C).to(torch.float32)        # x[g * d + c]
    zero = torch.zeros(w, C, dtype=torch.float32, device=dev)
    Xp = torch.cat([zero, X, zero])                                  # [Lk + 2w, C]
    Q = Xp @ W["wq"] + W["bq"]
    K = Xp @ W["wk"] + W["bk"]
    V = Xp @ W["wv"] + W["bv"]
    inv = float(np.float32(1.0 / math.sqrt(C)))
    p = torch.empty(Lk, dtype=torch.float32, device=dev)
    for t0 in range(0, Lk, LEARNED_SLAB):  # memory: one slab of windows at a time
        t1 = min(Lk, t0 + LEARNED_SLAB)
        # candidate t's window: rows [t, t + 2w) of the padded rows, [n, 2w, C] views
        Xw, Qw, Kw, Vw = (M[t0:t1 + 2 * w - 1].unfold(0, 2 * w, 1).transpose(1, 2)
                          for M in (Xp, Q, K, V))
        A = torch.softmax(torch.matmul(Qw, Kw.transpose(1, 2)) * inv, -1)
        h = Xw + torch.matmul(A, Vw)                                  # [n, 2w, C]
        h64 = h.to(wd)
        mean = h64.mean(-1, keepdim=True)
        var = ((h64 - mean) ** 2).mean(-1, keepdim=True)
        rstd = (1.0 / torch.sqrt(var + 1e-5)).to(torch.float32)
        y = ((h64 - mean).to(torch.float32) * rstd * W["gamma"] + W["beta"]) / float(w)
        lft, rgt = y[:, :w].sum(1), y[:, w:].sum(1)                   # [n, C]
        ll = (lft.to(wd) ** 2).sum(-1)
        rr = (rgt.to(wd) ** 2).sum(-1)
        lr = (lft.to(wd) * rgt.to(wd)).sum(-1)
        ok = (ll > 0) & (rr > 0)
        cos = torch.where(ok, lr / torch.sqrt(torch.where(ok, ll * rr, torch.ones_like(ll))),
                          torch.zeros_like(lr)).to(torch.float32)
        f = torch.cat([lft, rgt, (lft - rgt).abs(), lft * rgt, cos[:, None]], -1)
        z = torch.relu(f @ W["w1"] + W["b1"]) @ W["w2"] + W["b2"]
        p[t0:t1] = 1.0 / (1.0 + torch.exp(-z))
    p[0] = 0.0
    return p


def _boundaries(kb, p):
    """Chunk starts [n + 1] int64 of one batch (kb [Hkv, Lk, d]): starts[0]
    = 0 < ... < starts[n] = Lk."""
    Hkv, Lk, d = kb.shape
    dev = kb.device
    if p.fixed:
        return torch.cat([torch.arange(0, Lk, p.chunk, device=dev),
                          torch.tensor([Lk], device=dev)])
    if p.predictor is not None:
        score = _learned_score(kb, p.predictor)
    else:
        score = _similarity_score(kb, p)
    if Lk > 1:
        s = score[1:].to(torch.float64)
        if p.predictor is not None:  # local maxima of the probability >= the threshold
            cut = torch.tensor(float(p.learned_threshold), dtype=torch.float64, device=dev)
        else:  # local maxima at or above mean + threshold * std
            mean = s.sum() / (Lk - 1)
            var = ((s - mean) ** 2).sum()
            cut = mean + float(p.threshold) * torch.sqrt(var / (Lk - 1))
        t = torch.arange(1, Lk, device=dev)
        sc = score[1:]
        prev = torch.where(t > 1, score[t - 1], torch.full_like(sc, -math.inf))
        nxt = torch.where(t + 1 < Lk, score[(t + 1).clamp(max=Lk - 1)],
                          torch.full_like(sc, -math.inf))
        cand = (s >= cut) & ~(prev > sc) & ~(nxt > sc)
        cand &= (t >= p.min_chunk) & (Lk - t >= p.min_chunk)
        ct = t[cand]
        kept = _nms(ct, sc[cand], Lk, max(p.nms_window + 1, p.min_chunk))
    else:
        kept = torch.zeros(0, dtype=torch.int64, device=dev)
    # spans between kept boundaries, those longer than max_chunk split evenly
    ends = torch.cat([kept, torch.tensor([Lk], device=dev)])
    prev = torch.cat([torch.tensor([0], device=dev), kept])
    ln = ends - prev
    parts = (ln + p.max_chunk - 1) // p.max_chunk
    span = torch.repeat_interleave(torch.arange(ln.numel(), device=dev), parts)
    first = torch.cumsum(parts, 0) - parts
    kk = torch.arange(span.numel(), device=dev) - first[span]
    starts = prev[span] + torch.div(ln[span] * kk, parts[span], rounding_mode="floor")
    return torch.cat([starts, torch.tensor([Lk], device=dev)])

# ------------------------------------------------------------ pooling ---


def _pool_keys(kb, starts, p):
    """kp [Hkv or 1, nc, dk] float64 (values rounded to float32, as C
    stores them): MOMENTS and HEADS [mean key, per-dimension variance about it];
    POOLED the keys' sum / sqrt(len); averaged over KV heads with
    share_heads."""
    Hkv, Lk, d = kb.shape
    dev = kb.device
    wd = _wide(dev)
    nc = starts.numel() - 1
    ln = (starts[1:] - starts[:-1]).to(wd)                      # [nc]
    cid = torch.repeat_interleave(torch.arange(nc, device=dev), starts[1:] - starts[:-1])
    outs = []
    for g in range(Hkv):
        x = kb[g].to(wd)
        s = torch.zeros(nc, d, dtype=wd, device=dev).index_add_(0, cid, x)
        if p.two:
            m = s / ln[:, None]
            v = torch.zeros(nc, d, dtype=wd, device=dev).index_add_(0, cid, (x - m[cid]) ** 2)
            outs.append((m, v))
        else:
            outs.append(s)
    if p.two:
        if p.share_heads:  # C adds the heads' float32 terms in order
            om = torch.zeros(nc, d, dtype=torch.float32, device=dev)
            ov = torch.zeros(nc, d, dtype=torch.float32, device=dev)
            for m, v in outs:
                om += (m / Hkv).to(torch.float32)
                ov += (v / (ln[:, None] * Hkv)).to(torch.float32)
            return torch.cat([om, ov], -1).to(wd)[None]
        return torch.stack([torch.cat([m.to(torch.float32), (v / ln[:, None]).to(torch.float32)],
                                      -1) for m, v in outs]).to(wd)
    if p.share_heads:
        tot = sum(outs)
        return (tot / (torch.sqrt(ln)[:, None] * Hkv)).to(torch.float32).to(wd)[None]
    return torch.stack([(s / torch.sqrt(ln)[:, None]).to(torch.float32) for s in outs]).to(wd)


def _var_term(v, n):
    """The variance term of a MOMENTS estimate, v = s^2/2 q^2 . var(k),
    capped at 2 sqrt(v ln 2n) for a chunk of n keys (src/route/select.h,
    dhsa__var_term; docs/dhsa.md, "The variance term, capped")."""
    cap = 2.0 * torch.sqrt(v.clamp(min=0) * torch.log(2.0 * n))
    return torch.where(v > 0, torch.minimum(v, cap), v)


def _heads_scores(qt, kp, starts, cand):
    """HEADS chunk scores [Hkv, nqb, nc] (route.c heads_scores): for each
    query head h of a group, e_h(c) = the MOMENTS estimate of one key of
    chunk c (mean term + capped variance term) minus the log of head h's
    estimated total, sum over the block's candidate chunks c' of
    n(c') exp(e_h(c')); the score is the log of the heads' summed shares.
    qt [Hkv, G, nqb, 2d], kp [Hkv, nc, 2d], cand [nqb, nc]."""
    d_ = qt.shape[-1] // 2
    n = (starts[1:] - starts[:-1]).to(qt.dtype)                   # [nc]
    kt = kp.transpose(1, 2)[:, None]                              # [Hkv, 1, 2d, nc]
    E = torch.matmul(qt[..., :d_], kt[..., :d_, :])               # [Hkv, G, nqb, nc]
    E = E + _var_term(torch.matmul(qt[..., d_:], kt[..., d_:, :]), n)
    E = E.to(torch.float32).to(qt.dtype)  # C's tile is float32
    E = torch.where(cand[None, None], E, torch.full_like(E, -math.inf))
    lz = torch.logsumexp(E + torch.log(n), dim=-1, keepdim=True)  # [Hkv, G, nqb, 1]
    e = torch.where(cand[None, None], E - lz, torch.full_like(E, -math.inf))
    return torch.logsumexp(e, dim=1)                              # [Hkv, nqb, nc]


def _pool_queries(qb_, Hkv, p, scale):
    """qt [Hkv or 1, nqb, dk] float64 for the queries of one batch qb_
    [Hq, Lq, d]: per query block the rows (and the group's heads, or all
    heads with share_heads) pooled: MOMENTS [s * mean row, s^2 / 2 * mean
    of the rows' squares], POOLED sum / (sqrt(rows) * heads). HEADS: the
    MOMENTS form per query head, [Hkv, G, nqb, dk] (route.c heads_scores)."""
    Hq, Lq, d = qb_.shape
    dev = qb_.device
    wd = _wide(dev)
    qbk = p.q_block
    nqb = (Lq + qbk - 1) // qbk
    pad = nqb * qbk - Lq
    x = qb_.to(wd)
    if pad:
        x = torch.cat([x, torch.zeros(Hq, pad, d, dtype=wd, device=dev)], 1)
    x = x.view(Hq, nqb, qbk, d)
    groups = 1 if p.share_heads else Hkv
    heads = Hq // groups
    x = x.view(groups, heads, nqb, qbk, d)
    rows = torch.full((nqb,), float(qbk), dtype=wd, device=dev)
    rows[-1] = float(Lq - (nqb - 1) * qbk)
    if p.heads:  # one head's rows: C's (float)(sc / rows), (float)(0.5 sc^2 / rows)
        n1 = (float(scale) / rows).to(torch.float32).to(wd)
        n2 = (0.5 * float(scale) * float(scale) / rows).to(torch.float32).to(wd)
        return torch.cat([x.sum(dim=3) * n1[None, None, :, None],
                          (x * x).sum(dim=3) * n2[None, None, :, None]], -1)
    s1 = x.sum(dim=(1, 3))                                        # [groups, nqb, d]
    if p.moments:
        s2 = (x * x).sum(dim=(1, 3))
        # C's norms are float32: (float)(sc / (rows * heads)), (float)(0.5 sc^2 / (rows * heads))
        n1 = (float(scale) / (rows * heads)).to(torch.float32).to(wd)
        n2 = (0.5 * float(scale) * float(scale) / (rows * heads)).to(torch.float32).to(wd)
        return torch.cat([s1 * n1[None, :, None], s2 * n2[None, :, None]], -1)
    n1 = (1.0 / (torch.sqrt(rows) * heads)).to(torch.float32).to(wd)
    return s1 * n1[None, :, None]

# ---------------------------------------------------------- selection ---


def _spans(p, Lq, Lk, causal, window, q_pos0, dev):
    """Per query block: alo, ahi (keys the block may see together), pos0,
    pos1 (its positions), all [nqb] int64 (dhsa__block_span)."""
    qbk = p.q_block
    nqb = (Lq + qbk - 1) // qbk
    r0 = torch.arange(nqb, device=dev) * qbk
    r1 = torch.clamp(r0 + qbk, max=Lq)
    first, last = q_pos0 + r0, q_pos0 + r1 - 1
    if window > 0:
        alo = torch.clamp(first - window + 1, min=0)
    else:
        alo = torch.zeros_like(first)
    ahi = torch.clamp(last + 1, max=Lk) if causal else torch.full_like(first, Lk)
    alo = torch.clamp(alo, max=Lk)
    ahi = torch.maximum(ahi, alo)
    return alo, ahi, q_pos0 + r0, q_pos0 + r1


def _uncovered(s, e, a0, a1, b0, b1):
    """Size of [s, e) minus its parts in [a0, a1) and [b0, b1) (route.c's
    uncovered), elementwise."""
    n = (e - s).clamp(min=0)
    ia0, ia1 = torch.maximum(s, a0), torch.minimum(e, a1)
    ib0, ib1 = torch.maximum(s, b0), torch.minimum(e, b1)
    ia = (ia1 - ia0).clamp(min=0)
    ib = (ib1 - ib0).clamp(min=0)
    i0, i1 = torch.maximum(ia0, ib0), torch.minimum(ia1, ib1)
    iab = torch.where((ia > 0) & (ib > 0) & (i1 > i0), i1 - i0, torch.zeros_like(n))
    return torch.where(e > s, n - ia - ib + iab, torch.zeros_like(n))


def _greedy(fresh, budget, used, cap, active):
    """The per-block greedy of dhsa__select_ranges over candidates in rank
    order: fresh [N, M] (keys a candidate adds; 0 = not a candidate or
    nothing new), budget/used [N] int64, cap [N] (ranges left for chunks),
    active [N] bool. Returns taken [N, M] bool.

    A candidate that fits is taken; one that overshoots is taken if the
    budget still lacks at least half of it (and the block is full), else
    passed over; when the candidates run out short of the budget, the
    best passed-over one is taken. Each pass takes the fitting run up to
    the next overshoot at once, then jumps over the candidates that the
    remaining budget passes over, so the passes are about as many as the
    chunks a block passes over near its budget's end."""
    N, M = fresh.shape
    dev = fresh.device
    taken = torch.zeros(N, M, dtype=torch.bool, device=dev)
    if M == 0:
        return taken
    pos = torch.arange(M, device=dev)[None, :]
    ptr = torch.zeros(N, dtype=torch.int64, device=dev)
    u = used.clone()
    tk = torch.zeros(N, dtype=torch.int64, device=dev)
    first_skip = torch.full((N,), -1, dtype=torch.int64, device=dev)
    live = active & (u < budget) & (cap > 0)
    fill = torch.zeros(N, dtype=torch.bool, device=dev)
    big = M + 1
    for _ in range(M + 1):
        if not bool(live.any()):
            break
        f = torch.where((pos >= ptr[:, None]) & live[:, None], fresh, torch.zeros_like(fresh))
        pf = f > 0
        cum = torch.cumsum(f, 1)
        cnt = torch.cumsum(pf.to(torch.int64), 1)
        before = u[:, None] + cum - f                     # used before each candidate
        cntb = tk[:, None] + cnt - pf.to(torch.int64)
        ev = pf & ((before + f > budget[:, None]) | (cntb >= cap[:, None]))
        j = torch.where(ev, pos, torch.full_like(pos, big)).min(1).values  # first event
        run = pf & (pos < j[:, None])
        taken |= run
        has = j < big
        jj = j.clamp(max=M - 1)
        uj = torch.where(has, before.gather(1, jj[:, None])[:, 0], u + cum[:, -1])
        tj = torch.where(has, cntb.gather(1, jj[:, None])[:, 0], tk + cnt[:, -1])
        fj = f.gather(1, jj[:, None])[:, 0]
        u = torch.where(live, uj, u)
        tk = torch.where(live, tj, tk)
        # no event: every candidate taken; short of the budget -> the fill
        out = live & ~has
        fill |= out & (u < budget)
        stop = live & has & ((tk >= cap) | (u >= budget))
        over = live & has & ~stop & (budget - u >= torch.div(fj, 2, rounding_mode="floor"))
        taken[over, jj[over]] = True
        u = torch.where(over, u + fj, u)
        tk = torch.where(over, tk + 1, tk)
        skip = live & has & ~stop & ~over
        first_skip = torch.where(skip & (first_skip < 0), j, first_skip)
        # jump to the next candidate the remaining budget does not pass over
        r = (budget - u)[:, None]
        nxt_ok = pf & (pos > j[:, None]) & (torch.div(f, 2, rounding_mode="floor") <= r)
        j2 = torch.where(nxt_ok, pos, torch.full_like(pos, big)).min(1).values
        fill |= skip & (j2 >= big)
        ptr = torch.where(skip, j2, ptr)
        live = skip & (j2 < big)
    # the fill: the best passed-over candidate (it overshoots: every
    # passed-over one is more than twice what was missing)
    fl = fill & (u < budget) & (tk < cap) & (first_skip >= 0)
    taken[fl, first_skip[fl]] = True
    return taken

def _pick_sinks(qb_, kb, p, alo, avail, n_pick, G_):
    """(picked [G_, nqb, SW] int64, scores [G_, nqb, SW] float32): per block
    the keys [alo, alo + min(avail, SW)) of the KV head (head 0 with
    share_heads) ranked by their dot product with the sum of the block's
    query rows over the group's heads (float32, as dhsa__rank_sinks; the
    dot in float64, rounded to float32), best first, ties to the lower
    position; the first n_pick kept, -1 elsewhere. scores: the ranked
    scores (-inf beyond the keys), for the tests' near-tie checks."""
    Hq, Lq, d = qb_.shape
    Hkv, Lk = kb.shape[0], kb.shape[1]
    dev = qb_.device
    wd = _wide(dev)
    SW, qbk = p.sink_window, p.q_block
    nqb = alo.numel()
    pad = nqb * qbk - Lq
    x = qb_.to(wd)
    if pad:
        x = torch.cat([x, torch.zeros(Hq, pad, d, dtype=wd, device=dev)], 1)
    heads = Hq // G_
    qm = x.view(G_, heads, nqb, qbk, d).sum(dim=(1, 3)).to(torch.float32).to(wd)  # [G_, nqb, d]
    kk = kb[:G_].to(wd) if p.share_heads else kb.to(wd)                  # [G_, Lk, d]
    j = torch.arange(SW, device=dev)
    wlen = torch.clamp(torch.minimum(avail, torch.full_like(avail, SW)), min=0)  # [nqb]
    ok = j[None, :] < wlen[:, None]                                       # [nqb, SW]
    pos = (alo[:, None] + j[None, :]).clamp(max=Lk - 1)
    # the keys are read in pieces none of which is [.., d, d]: the square
    # finder would take sink_window x d keys for a square when sink_window
    # equals d
    cuts = [0, SW]
    if SW == d:
        cuts = [0, next(c for c in (SW // 2, SW // 2 + 1, 16, 17, 1) if 0 < c < SW and c != d
                        and SW - c != d), SW]
    pieces = list(zip(cuts[:-1], cuts[1:]))
    if bool((alo == alo[0]).all()):  # no window: the same keys for every block (views)
        a0 = int(alo[0])
        m = max(0, min(SW, Lk - a0))
        parts = [torch.matmul(qm, kk[:, a0 + i:a0 + min(j, m)].transpose(1, 2))
                 for i, j in pieces if min(j, m) > i]
        sc = torch.cat(parts + [qm.new_zeros(G_, nqb, SW - m)], -1)
    else:
        sc = torch.cat([(qm[:, :, None, :] * kk[:, pos[:, i:j]]).sum(-1) for i, j in pieces],
                       -1)
    sc = sc.to(torch.float32)
    sc = torch.where(ok[None], sc, torch.full_like(sc, -math.inf))
    sc, r = torch.sort(sc, dim=-1, descending=True, stable=True)
    picked = alo[None, :, None] + r
    keep = j[None, None, :] < n_pick[None, :, None]
    return torch.where(keep, picked, torch.full_like(picked, -1)), sc


# -------------------------------------------------------------- layout ---


class TorchLayout:
    """A layout made by dhsa.torch.route (the torch router), on the device
    of its q/k: for each (batch b, KV head g, query block qb) the keys of
    up to two fixed ranges (sinks and the local diagonal; the whole span
    for a dense block; sinks and recent keys for "stream") plus the routed
    chunks it takes. Attributes as dhsa.Layout: B, Hkv, Lq, Lk, q_block,
    n_blocks, max_ranges, q_pos0, causal, window; and the tensors
    starts [B, nc_max + 1] (chunk starts, padded with Lk), chunk_of
    [B, Lk] (the chunk of each key), taken [B, Hkv, n_blocks, nc_max] bool,
    fixed [n_blocks, 4] (two ranges per block: [a0, a1, b0, b1]), sinks
    [B, Hkv, n_blocks, sink_window] (picked sink keys, -1 = none) or None
    (sink_window <= sink: the first keys, in fixed). ranges()
    and stats() as dhsa.Layout's; close() does nothing (torch frees it)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self._merged = None

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    @property
    def device(self):
        return self.taken.device

    def merged(self):
        """(r [B, Hkv, n_blocks, R, 2] int64, count [B, Hkv, n_blocks]):
        each block's ranges sorted, disjoint, adjacent ones merged (as
        dhsa_layout_set normalises them); rows beyond count are [Lk, Lk]."""
        if self._merged is not None:
            return self._merged
        B, Hkv, nqb = self.B, self.Hkv, self.n_blocks
        dev = self.device
        nc = self.taken.shape[-1]
        cnt = self.taken.sum(-1)                                          # [B, Hkv, nqb]
        R = int(cnt.max()) if cnt.numel() else 0
        # the taken chunks in index (= position) order, first R columns
        idx = torch.sort(self.taken.to(torch.int8), dim=-1, descending=True,
                         stable=True).indices[..., :R]                    # [B, Hkv, nqb, R]
        okc = torch.arange(R, device=dev) < cnt[..., None]
        st = self.starts[:, None, None, :].expand(B, Hkv, nqb, nc + 1)
        cs = torch.gather(st, 3, idx)
        ce = torch.gather(st, 3, idx + 1)
        alo = self.alo[None, None, :, None]
        ahi = self.ahi[None, None, :, None]
        cs = torch.maximum(cs, alo)
        ce = torch.minimum(ce, ahi)
        fx = self.fixed[None, None].expand(B, Hkv, nqb, 4)
        s = torch.cat([fx[..., 0::2], cs], -1)
        e = torch.cat([fx[..., 1::2], ce], -1)
        ok = torch.cat([torch.ones(B, Hkv, nqb, 2, dtype=torch.bool, device=dev), okc], -1)
        if self.sinks is not None:  # picked sinks: one key each
            s = torch.cat([s, self.sinks], -1)
            e = torch.cat([e, self.sinks + 1], -1)
            ok = torch.cat([ok, self.sinks >= 0], -1)
        ok &= e > s
        Lk = self.Lk
        s = torch.where(ok, s, torch.full_like(s, Lk + 1))
        e = torch.where(ok, e, torch.full_like(e, Lk + 1))
        s, o = torch.sort(s, dim=-1, stable=True)
        e = torch.gather(e, -1, o)
        ok = s <= Lk
        # a range starts a group unless it begins within the ranges before it
        pe = torch.cummax(e, -1).values
        pe = torch.cat([torch.full_like(pe[..., :1], -1), pe[..., :-1]], -1)
        new = ok & (s > pe)
        grp = torch.cumsum(new.to(torch.int64), -1) - 1
        n = new.sum(-1)
        G = int(n.max()) if n.numel() else 0
        G = max(G, 1)
        grp = torch.where(ok, grp, torch.full_like(grp, G))
        rs = torch.full((B, Hkv, nqb, G + 1), Lk, dtype=torch.int64, device=dev)
        re = torch.full((B, Hkv, nqb, G + 1), Lk, dtype=torch.int64, device=dev)
        rs.scatter_(-1, torch.where(new, grp, torch.full_like(grp, G)), s.clamp(max=Lk))
        re = re.scatter_reduce(-1, grp, torch.where(ok, e, torch.zeros_like(e)), "amax",
                               include_self=False)
        r = torch.stack([rs[..., :G], re[..., :G]], -1)
        r = torch.where((torch.arange(G, device=dev) < n[..., None])[..., None], r,
                        torch.full_like(r, Lk))
        self._merged = (r, n)
        return self._merged

    def ranges(self, b, g, qb):
        """The ranges of block (b, g, qb): int64 numpy [n, 2], sorted and
        disjoint (dhsa.Layout.ranges)."""
        r, n = self.merged()
        k = int(n[b, g, qb])
        return r[b, g, qb, :k].cpu().numpy()

    def all_ranges(self):
        """Every block's ranges as a list (b, g, qb order) of numpy [n, 2]."""
        r, n = self.merged()
        r, n = r.cpu().numpy(), n.cpu().numpy()
        return [r[b, g, qb, :n[b, g, qb]] for b in range(self.B) for g in range(self.Hkv)
                for qb in range(self.n_blocks)]

    def key_index(self):
        """(idx [B, Hkv, n_blocks, K] int64, valid [B, Hkv, n_blocks, K]
        bool): each block's keys in order, padded to K (the most keys a
        block selects; padding points at key 0 and is not valid)."""
        r, n = self.merged()
        ln = (r[..., 1] - r[..., 0])                                      # [B, Hkv, nqb, G]
        tot = ln.sum(-1)
        K = max(int(tot.max()) if tot.numel() else 0, 1)
        cend = torch.cumsum(ln, -1)
        p = torch.arange(K, device=r.device).expand(*ln.shape[:-1], K).contiguous()
        which = torch.searchsorted(cend.contiguous(), p, right=True).clamp(max=ln.shape[-1] - 1)
        off = torch.gather(cend - ln, -1, which)
        idx = torch.gather(r[..., 0], -1, which) + (p - off)
        valid = p < tot[..., None]
        return torch.where(valid, idx, torch.zeros_like(idx)), valid

    def stats(self):
        """dhsa.Layout.stats()'s dict for this layout (density: selected /
        available over every (b, g, row) under causal / window / q_pos0)."""
        r, n = self.merged()
        B, Hkv, nqb, qbk = self.B, self.Hkv, self.n_blocks, self.q_block
        dev = r.device
        rows = torch.arange(nqb * qbk, device=dev)
        pos = self.q_pos0 + rows
        lo = torch.clamp(pos - self.window + 1, min=0) if self.window > 0 else torch.zeros_like(pos)
        hi = torch.clamp(pos + 1, max=self.Lk) if self.causal else torch.full_like(pos, self.Lk)
        real = (rows < self.Lq) & (hi > lo)
        avail = float(((hi - lo) * real).sum()) * B * Hkv
        ln = r[..., 1] - r[..., 0]
        cend = torch.cumsum(ln, -1).contiguous()
        starts = r[..., 0].contiguous()

        def below(x):  # selected keys < x for every row: [B, Hkv, nqb, qbk]
            xs = x.view(nqb, qbk)[None, None].expand(B, Hkv, nqb, qbk).contiguous()
            i = torch.searchsorted(starts, xs, right=True) - 1
            ic = i.clamp(min=0)
            s0 = torch.gather(starts, -1, ic)
            l0 = torch.gather(ln, -1, ic)
            c0 = torch.gather(cend, -1, ic) - l0
            return torch.where(i >= 0, c0 + torch.minimum((xs - s0).clamp(min=0), l0),
                               torch.zeros_like(xs))
        sel = (below(hi) - below(lo)).clamp(min=0)
        selected = float((sel * real.view(nqb, qbk)).sum())
        return dict(B=B, Hkv=Hkv, Lq=self.Lq, Lk=self.Lk, q_block=qbk, n_blocks=nqb,
                    max_ranges=self.max_ranges, q_pos0=self.q_pos0, causal=bool(self.causal),
                    window=self.window, selected=selected, available=avail,
                    density=selected / avail if avail > 0 else 1.0, ranges=int(n.sum()),
                    dense_blocks=self.dense_blocks, chunks=self.chunks,
                    chunk_mean=self.chunk_mean, chunk_min=self.chunk_min,
                    chunk_max=self.chunk_max)

    def __repr__(self):
        return "<dhsa.torch.TorchLayout B=%d Hkv=%d Lq=%d Lk=%d q_block=%d on %s>" % (
            self.B, self.Hkv, self.Lq, self.Lk, self.q_block, self.device)

# --------------------------------------------------------------- route ---


def route(q, k, *, causal=True, window=0, q_pos0=0, params=None, scale=None, _trace=None,
          **router):
    """DHSA routing of one layer in torch operations on q's device: a
    TorchLayout for q [B, Hq, Lq, d] over k [B, Hkv, Lk, d] (BHLD) under
    causal / window / q_pos0, with the router keywords of dhsa.route()
    (params=RouterParams(...) and/or its field names). scale: the
    attention scale the MOMENTS score uses (None = 1/sqrt(d), as C).
    _trace: a list that gets, per batch, {"starts", "scores" [Hkv or 1,
    n_blocks, chunks] (-inf: not a candidate), "fresh" [n_blocks, chunks]}
    (tests: near ties)."""
    p = _router_params(params, router, "dhsa.torch.route()")
    P = _P(p)
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError("%s must be a 4-D torch tensor [B, H, L, d]" % name)
        if not t.is_floating_point():
            raise TypeError("%s has dtype %s: the router takes floating tensors" % (name, t.dtype))
    if k.device != q.device:
        raise ValueError("q is on %s and k on %s: put them on one device" % (q.device, k.device))
    B, Hq, Lq, d = q.shape
    Bk, Hkv, Lk, dk_ = k.shape
    if Bk != B or dk_ != d:
        raise ValueError("q %s and k %s do not match (as [B, H, L, d])"
                         % (tuple(q.shape), tuple(k.shape)))
    if Hkv < 1 or Hq % Hkv:
        raise ValueError("q has %d heads, not a multiple of k's %d" % (Hq, Hkv))
    if Lq < 1 or Lk < 1:
        raise ValueError("dhsa.torch.route needs at least one query row and one key (Lq=%d, "
                         "Lk=%d)" % (Lq, Lk))
    window, q_pos0 = int(window), int(q_pos0)
    if window < 0 or q_pos0 < 0:
        raise ValueError("window and q_pos0 must be >= 0")
    if scale is None:
        scale = float(np.float32(1.0 / math.sqrt(d)))
    scale = float(np.float32(scale))
    dev = q.device
    q, k = q.detach(), k.detach()
    min_len, max_chunks, max_ranges = P.limits(Lk)
    qbk = P.q_block
    nqb = (Lq + qbk - 1) // qbk
    alo, ahi, pos0, pos1 = _spans(P, Lq, Lk, bool(causal), window, q_pos0, dev)
    avail = ahi - alo
    if P.budget_tokens > 0:
        budget = torch.full_like(avail, P.budget_tokens)
    else:
        budget = torch.ceil(P.density * avail.to(torch.float64)).to(torch.int64)
    dense = (avail > 0) & ((avail < P.dense_below) | (budget >= avail))
    sink = torch.full_like(avail, P.sink_tokens)
    local = torch.full_like(avail, P.local_tokens)
    if P.scale_fixed:
        # at most budget / 8, but a block never loses its sink (select.c)
        sink = torch.minimum(sink, torch.div(budget, 8, rounding_mode="floor").clamp(min=1))
        local = torch.minimum(local, torch.div(budget, 4, rounding_mode="floor"))
    s0 = alo
    s1 = torch.maximum(torch.minimum(sink, ahi), s0)
    SW = P.sink_window if P.picked else 0
    n_pick = torch.zeros_like(avail)
    if P.picked:  # sinks picked among the first sink_window keys: no sink range
        s1 = s0.clone()
        n_pick = torch.minimum(sink, torch.clamp(torch.minimum(avail, torch.full_like(avail, SW)),
                                                 min=0))
    l1 = torch.minimum(pos1, ahi)
    l0 = torch.minimum(torch.maximum(pos0 - local, alo), l1)
    if P.stream:
        # sinks, then the block's own rows always (causal), then back from
        # them while the budget lasts
        recent = (budget - (s1 - s0) - n_pick).clamp(min=0)
        r0 = torch.maximum(ahi - recent, alo)
        if causal:
            r0 = torch.where(pos0 < r0, torch.maximum(pos0, alo), r0)
        f2 = torch.stack([r0, ahi], -1)
    else:
        f2 = torch.stack([l0, l1], -1)
    # [nqb, 4]: [a0, a1, b0, b1], two ranges (not [nqb, 2, 2], whose last
    # two sizes the square finder would take for a square)
    fixed = torch.cat([s0[:, None], s1[:, None], f2], -1)
    fixed = torch.where(dense[:, None], torch.stack([alo, ahi, ahi, ahi], -1), fixed)
    fixed = torch.where((avail > 0)[:, None], fixed, torch.zeros_like(fixed))
    used = (s1 - s0) + (l1 - l0) - (torch.minimum(s1, l1) - torch.maximum(s0, l0)).clamp(min=0)
    routed = ~dense & (avail > 0) & (not P.stream)
    score_them = not P.stream and Lk >= P.dense_below
    cap = max_ranges - 2 - n_pick  # [nqb]: ranges left for chunks after the picked sinks

    all_starts, takens, nchunks, lens, sinks = [], [], 0, [], []
    for b in range(B):
        starts = _boundaries(k[b], P)                                      # [nc + 1]
        nc = starts.numel() - 1
        nchunks += nc
        lens.append(starts[1:] - starts[:-1])
        all_starts.append(starts)
        G_ = 1 if P.share_heads else Hkv
        taken = torch.zeros(G_, nqb, nc, dtype=torch.bool, device=dev)
        used_g = used[None].expand(G_, nqb)
        picked = None
        if P.picked:
            picked, sink_sc = _pick_sinks(q[b], k[b], P, alo, avail, n_pick, G_)  # [G_, nqb, SW]
            in_local = (picked >= l0[None, :, None]) & (picked < l1[None, :, None])
            extra = ((picked >= 0) & ~in_local)
            used_g = used_g + extra.sum(-1)
            sinks.append(picked)
        if score_them and bool(routed.any()):
            kp = _pool_keys(k[b], starts, P)                               # [G_, nc, dk]
            qt = _pool_queries(q[b], Hkv, P, scale)                        # [G_, nqb, dk]
            cst, cen = starts[:-1][None, :], starts[1:][None, :]
            cand = (cen > alo[:, None]) & (cst < ahi[:, None])             # [nqb, nc]
            if P.heads:
                S = _heads_scores(qt, kp, starts, cand)
            elif P.moments:  # mean term + the capped variance term (route.c qk_capped)
                d_ = qt.shape[-1] // 2
                S = torch.matmul(qt[..., :d_], kp[..., :d_].transpose(1, 2))  # [G_, nqb, nc]
                V = torch.matmul(qt[..., d_:], kp[..., d_:].transpose(1, 2))
                S = S + _var_term(V, (starts[1:] - starts[:-1]).to(V.dtype))
            else:
                S = torch.matmul(qt, kp.transpose(1, 2))                   # [G_, nqb, nc]
            S = torch.where(cand[None], S, torch.full_like(S, -math.inf))
            order = torch.sort(S, dim=-1, descending=True, stable=True).indices
            cs = torch.maximum(cst, alo[:, None])
            ce = torch.minimum(cen, ahi[:, None])
            fresh = _uncovered(cs, ce, s0[:, None], s1[:, None], l0[:, None], l1[:, None])
            fresh = torch.where(cand, fresh, torch.zeros_like(fresh))       # [nqb, nc]
            fresh = fresh[None].expand(G_, nqb, nc)
            if picked is not None:  # picked sinks outside the local keys are read already
                cid = torch.repeat_interleave(torch.arange(nc, device=dev),
                                              starts[1:] - starts[:-1])
                pc = torch.zeros(G_, nqb, nc, dtype=torch.int64, device=dev)
                pc.scatter_add_(2, cid[picked.clamp(min=0)], extra.to(torch.int64))
                fresh = fresh - pc
            fr = torch.gather(fresh, 2, order).reshape(G_ * nqb, nc)
            if _trace is not None:
                _trace.append(dict(b=b, starts=starts, scores=S, fresh=fresh[0],
                                   fresh_g=fresh, sink_scores=sink_sc if P.picked else None,
                                   n_pick=n_pick))
            t_sorted = _greedy(fr, budget.repeat(G_), used_g.reshape(-1), cap.repeat(G_),
                               routed.repeat(G_))
            taken.view(G_ * nqb, nc).scatter_(1, order.reshape(G_ * nqb, nc), t_sorted)
        elif _trace is not None and P.picked:
            _trace.append(dict(b=b, starts=starts, scores=None, sink_scores=sink_sc,
                               n_pick=n_pick))
        if P.share_heads:
            taken = taken.expand(Hkv, nqb, nc)
            if picked is not None:
                sinks[-1] = picked.expand(Hkv, nqb, SW)
        takens.append(taken)
    ncmax = max(s.numel() - 1 for s in all_starts)
    starts_t = torch.full((B, ncmax + 1), Lk, dtype=torch.int64, device=dev)
    taken_t = torch.zeros(B, Hkv, nqb, ncmax, dtype=torch.bool, device=dev)
    chunk_of = torch.empty(B, Lk, dtype=torch.int64, device=dev)
    for b in range(B):
        nc = all_starts[b].numel() - 1
        starts_t[b, :nc + 1] = all_starts[b]
        taken_t[b, :, :, :nc] = takens[b]
        chunk_of[b] = torch.repeat_interleave(torch.arange(nc, device=dev), lens[b])
    lens_all = torch.cat(lens)
    sinks_t = torch.stack(sinks) if P.picked else None                 # [B, Hkv, nqb, SW]
    if sinks_t is not None:  # only blocks that route (not dense, something to see) read them
        sinks_t = torch.where((~dense & (avail > 0))[None, None, :, None], sinks_t,
                              torch.full_like(sinks_t, -1))
    return TorchLayout(sinks=sinks_t, B=B, Hkv=Hkv, Lq=Lq, Lk=Lk, q_block=qbk, n_blocks=nqb,
                       max_ranges=max_ranges, max_chunks=max_chunks, q_pos0=q_pos0,
                       causal=bool(causal), window=window,
                       starts=starts_t, chunk_of=chunk_of, taken=taken_t, fixed=fixed,
                       alo=alo, ahi=ahi, dense_blocks=int(dense.sum()) * B * Hkv,
                       chunks=nchunks,
                       chunk_mean=float(lens_all.double().mean()) if nchunks else 0.0,
                       chunk_min=int(lens_all.min()) if nchunks else 0,
                       chunk_max=int(lens_all.max()) if nchunks else 0)


__all__ = ["route", "TorchLayout", "RouterParams"]
