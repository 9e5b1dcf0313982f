"""_backend.py: dhsa.torch's second back end, PyTorch's own kernels, for
tensors on any device (CUDA, MPS, XPU, ...) and for CPU tensors with
backend="torch".

Contract (docs/torch.md, "Back ends"):
  - attention(q, k, v, ...) has the semantics of dhsa.attention (the C
    back end): causal with q_pos0, window, softcap, scale, key_padding_mask
    (bool True = ignore, or float added), attn_mask broadcastable to
    [B, Hq, Lq, Lk] (bool True = take part, or float added), GQA (Hq a
    multiple of Hkv, K/V never repeated), layout "BHLD" or "BLHD", sparse=
    a dhsa.Layout, return_lse. A query row with no allowed key gives zeros
    (lse -inf), as the C back end (PyTorch's SDPA gives NaN).
  - Dense: F.scaled_dot_product_attention with the masks turned into its
    convention explicitly (bool True = keep), per key as [B, 1, 1, Lk]
    where that is all there is, so that the memory-efficient / flash
    kernels are eligible. Where a mask depends on the query row (causal
    with q_pos0 or a window, combined with padding; a 2-D/4-D attn_mask),
    the rows are taken in chunks whose mask is [B|1, Hq|1, C, Lk] with
    C * Lk * B * Hq within a fixed element budget: never Lq x Lk at once
    unless Lq is within the chunk.
  - softcap and return_lse: the same chunks in float32 arithmetic
    (matmul, logsumexp), still never Lq x Lk at once.
  - Sparse, a TorchLayout (_route.py) on CUDA: FlexAttention (compiled)
    with a BlockMask from the layout's ranges (128 x 128 tiles) and a
    mask_mod that decides per key (_flex); sparse_kernel() says which.
  - Sparse otherwise (a dhsa.Layout, or off CUDA): the layout's key ranges,
    per (batch, KV head, query block), become a padded index of the
    selected keys; each chunk of query blocks gathers its keys and computes
    [.., q_block, K] scores (K = the most keys any block selects), with
    causality, window and masks applied per key. Memory: the index
    (selected keys) plus one chunk.
Tested by python/tests/test_torch_backend.py and test_torch_route.py.
"""

import math
import os
import warnings

import numpy as np
import torch
import torch.nn.functional as F

# Elements of the largest score/mask chunk materialised at once (float32:
# 4 bytes each): 64 MiB on the CPU, 512 MiB on a device (fewer, larger
# kernel launches; a GPU has the memory).
CHUNK_ELEMS = 1 << 24
CHUNK_ELEMS_DEVICE = 1 << 27

# The kernel for a TorchLayout's sparse attention (sparse_kernel()).
SPARSE_KERNEL = os.environ.get("DHSA_TORCH_SPARSE", "auto")
# FlexAttention's BlockMask tile (query rows, keys): 64 x 64 lists 27% of
# the causal tiles of a 6.25% layout at 16K and 16% at 32K where 128 x 128
# lists 61% and 37% (random q/k, RouterParams.for_length): the routed
# chunks are short and scattered. PyTorch (2.15) shrinks its kernel's
# BLOCK_M / BLOCK_N to fit power-of-two tiles >= 16.
FLEX_TILE = (64, 64)
# Whether flex_attention runs compiled: None = on CUDA only (eager
# elsewhere); True / False force it (a compiled CPU run needs a C++
# compiler and takes tens of seconds to compile).
FLEX_COMPILE = None


def _budget(dev):
    return CHUNK_ELEMS if dev.type == "cpu" else CHUNK_ELEMS_DEVICE


def _bhld(t, layout):
    return t if layout == "BHLD" else t.transpose(1, 2)


def _mask4(m, B, Hq, Lq, Lk):
    """attn_mask as a 4-D view broadcastable to [B, Hq, Lq, Lk], checked."""
    if m.dim() > 4 or m.dim() < 1:
        raise ValueError("attn_mask must have 1 to 4 dimensions broadcastable to [B, Hq, Lq, Lk] "
                         "= %s, got shape %s" % ([B, Hq, Lq, Lk], tuple(m.shape)))
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if any(n not in (1, t) for n, t in zip(m.shape, (B, Hq, Lq, Lk))):
        raise ValueError("attn_mask of shape %s does not broadcast to [B, Hq, Lq, Lk] = %s"
                         % (tuple(m.shape), [B, Hq, Lq, Lk]))
    if m.dtype != torch.bool and not m.is_floating_point():
        raise TypeError("attn_mask has dtype %s: use bool (True = take part) or float (added)"
                        % m.dtype)
    return m


def _key_terms(key_padding_mask, attn_mask, B, Lk, device):
    """(keep [B|1, 1, 1, Lk] bool or None, add [B|1, 1, 1, Lk] float or
    None, row_mask 4-D or None): the per-key part of the masks (SDPA's
    convention: True = keep) and the part that depends on head or row."""
    keep = add = row = None
    if key_padding_mask is not None:
        m = key_padding_mask
        if m.dim() != 2 or m.shape[0] not in (1, B) or m.shape[1] != Lk:
            raise ValueError("key_padding_mask must be [B, Lk] = [%d, %d] (or [1, %d]), got shape "
                             "%s" % (B, Lk, Lk, tuple(m.shape)))
        m = m.to(device)
        if m.dtype == torch.bool:
            keep = (~m)[:, None, None, :]  # True = ignore -> True = keep
        elif m.is_floating_point():
            add = m.float()[:, None, None, :]
        else:
            raise TypeError("key_padding_mask has dtype %s: use bool (True = ignore the key) or "
                            "float (added)" % m.dtype)
    if attn_mask is not None:
        m = attn_mask.to(device)
        if m.shape[1] == 1 and m.shape[2] == 1:  # per key
            if m.dtype == torch.bool:
                keep = m if keep is None else keep & m
            else:
                add = m.float() if add is None else add + m.float()
        else:
            row = m
    return keep, add, row


def _row_keep(r0, r1, Lk, causal, q_pos0, window, device):
    """[1, 1, r1 - r0, Lk] bool: causality and window for rows r0..r1, or
    None when neither applies."""
    if not causal and window <= 0:
        return None
    pos = torch.arange(r0 + q_pos0, r1 + q_pos0, device=device)[:, None]
    j = torch.arange(Lk, device=device)[None, :]
    ok = None
    if causal:
        ok = j <= pos
    if window > 0:
        w = j > pos - window
        ok = w if ok is None else ok & w
    return ok[None, None]


def _combine(keep, add, extra_keep, row_chunk):
    """One SDPA mask (bool keep or float additive) from the parts, or None."""
    k = keep
    if extra_keep is not None:
        k = extra_keep if k is None else k & extra_keep
    a = add
    if row_chunk is not None:
        if row_chunk.dtype == torch.bool:
            k = row_chunk if k is None else k & row_chunk
        else:
            a = row_chunk.float() if a is None else a + row_chunk.float()
    if a is None:
        return k
    if k is not None:
        a = a.masked_fill(~k, float("-inf"))
    return a


def _allowed_rows(mask, shape):
    """[B|1, Hq|1, rows|1, 1] bool: whether each row has an allowed key."""
    if mask is None:
        return None
    ok = mask if mask.dtype == torch.bool else mask > float("-inf")
    return ok.any(-1, keepdim=True)


def _manual(q, k, v, mask, scale, softcap, G):
    """float32 attention of q [B, Hq, C, d] over k/v [B, Hkv, S, *]:
    (o, lse). mask: None, bool keep or float additive, broadcastable."""
    B, Hq, C, d = q.shape
    Hkv = k.shape[1]
    qf = q.float().reshape(B, Hkv, G, C, d)
    s = torch.matmul(qf, k.float().unsqueeze(2).transpose(-1, -2)) * scale  # [B, Hkv, G, C, S]
    s = s.reshape(B, Hq, C, -1)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)  # rows with no key: lse = -inf, exp(nan)
    o = torch.matmul(p.reshape(B, Hkv, G, C, -1), v.float().unsqueeze(2)).reshape(B, Hq, C, -1)
    return o, lse


def _sdpa_gqa(q, k, v, mask, scale, G):
    """SDPA of q [B, Hq, C, d] over k/v [B, Hkv, S, *] with the G query
    heads of a KV head folded into its rows ([B, Hkv, G*C, d]): K/V are
    neither repeated nor passed with enable_gqa (which the memory-efficient
    kernel does not take, so PyTorch would pick the math kernel and build
    the scores). The mask follows the fold (a per-key mask stays
    [B|1, 1, 1, S]). Rows with no allowed key give zeros."""
    B, Hq, C, d = q.shape
    Hkv = k.shape[1]
    if G > 1:
        q = q.reshape(B, Hkv, G * C, d)
        if mask is not None and mask.shape[2] > 1:  # row-dependent: fold it too
            mb, mh, S = mask.shape[0], mask.shape[1], mask.shape[3]
            if mh == 1:
                mask = mask.unsqueeze(2).expand(mb, 1, G, C, S).reshape(mb, 1, G * C, S)
            else:
                mask = mask.reshape(mb, Hkv, G * C, S)
        elif mask is not None and mask.shape[1] > 1:  # per head, per key
            mb, S = mask.shape[0], mask.shape[3]
            mask = mask.reshape(mb, Hkv, G, S).unsqueeze(3).expand(mb, Hkv, G, C, S)
            mask = mask.reshape(mb, Hkv, G * C, S)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    ok = _allowed_rows(mask, None)
    if ok is not None:
        o = o.masked_fill(~ok, 0.0)
    return o.reshape(B, Hq, C, -1)


def _dense(q, k, v, *, causal, q_pos0, window, scale, softcap, keep, add, row, return_lse):
    B, Hq, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    dev = q.device
    rowdep = causal or window > 0 or row is not None
    manual = softcap > 0 or return_lse
    if causal and window <= 0 and row is None and keep is None and add is None and not manual \
            and q_pos0 in (0, Lk - Lq) and 0 < Lq <= Lk:  # every row sees key 0
        # plain causal (top-left, or bottom-right over a cache): no mask at
        # all, so that flash attention is eligible
        if q_pos0 == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                               enable_gqa=G > 1)
        else:
            from torch.nn.attention.bias import causal_lower_right
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(Lq, Lk),
                                               scale=scale, enable_gqa=G > 1)
        return o, None
    if not rowdep and not manual:
        C = Lq
    else:
        C = max(1, min(Lq, _budget(dev) // max(1, B * Hq * Lk)))
    outs, lses = [], []
    for r0 in range(0, Lq, C):
        r1 = min(Lq, r0 + C)
        extra = _row_keep(r0, r1, Lk, causal, q_pos0, window, dev)
        rc = None
        if row is not None:
            rc = row if row.shape[2] == 1 else row[:, :, r0:r1]
        mask = _combine(keep, add, extra, rc)
        qc = q[:, :, r0:r1]
        if manual:
            o, lse = _manual(qc, k, v, mask, scale, softcap, G)
            lses.append(lse)
        else:
            o = _sdpa_gqa(qc, k, v, mask, scale, G)
        outs.append(o)
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    lse = None
    if return_lse:
        lse = lses[0] if len(lses) == 1 else torch.cat(lses, dim=2)
    return o, lse


def layout_index(lay, device):
    """(idx [B, Hkv, nqb, K] int64, valid [B, Hkv, nqb, K] bool): the
    selected keys of every block of the dhsa.Layout, padded to K (the most
    keys any block selects; padding points at key 0 and is not valid)."""
    B, Hkv, nqb = lay.B, lay.Hkv, lay.n_blocks
    per = []
    K = 0
    for b in range(B):
        for g in range(Hkv):
            for qb in range(nqb):
                r = lay.ranges(b, g, qb)
                keys = (np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in r])
                        if len(r) else np.zeros(0, dtype=np.int64))
                per.append(keys)
                K = max(K, len(keys))
    K = max(K, 1)
    idx = np.zeros((B * Hkv * nqb, K), dtype=np.int64)
    valid = np.zeros((B * Hkv * nqb, K), dtype=np.bool_)
    for i, keys in enumerate(per):
        idx[i, :len(keys)] = keys
        valid[i, :len(keys)] = True
    return (torch.from_numpy(idx).reshape(B, Hkv, nqb, K).to(device),
            torch.from_numpy(valid).reshape(B, Hkv, nqb, K).to(device))


def sparse_kernel(device):
    """The sparse attention kernel for a TorchLayout on `device`: SPARSE_KERNEL
    "auto" gives "flex" on CUDA (FlexAttention, compiled) and "gather"
    elsewhere; "flex" or "gather" force one (flex off CUDA runs eagerly,
    which materialises each head's Lq x Lk scores: for tests at small
    sizes)."""
    k = SPARSE_KERNEL
    if k not in ("auto", "flex", "gather"):
        raise ValueError("dhsa.torch sparse kernel must be 'auto', 'flex' or 'gather', not %r "
                         "(DHSA_TORCH_SPARSE / _backend.SPARSE_KERNEL)" % (k,))
    if k == "auto":
        return "flex" if device.type == "cuda" and _flex_available() else "gather"
    return k


def _flex_available():
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
        return True
    except Exception:
        return False


def _sparse(q, k, v, lay, **kw):
    B, Hq, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if (lay.B, lay.Hkv, lay.Lq, lay.Lk) != (B, Hkv, Lq, Lk):
        raise ValueError("sparse layout is for B=%d Hkv=%d Lq=%d Lk=%d, the tensors are B=%d "
                         "Hkv=%d Lq=%d Lk=%d" % (lay.B, lay.Hkv, lay.Lq, lay.Lk, B, Hkv, Lq, Lk))
    from ._route import TorchLayout
    if isinstance(lay, TorchLayout):
        if lay.device != q.device:
            raise ValueError("the layout is on %s and q on %s: route on the attention's device"
                             % (lay.device, q.device))
        if sparse_kernel(q.device) == "flex":
            return _flex(q, k, v, lay, **kw)
        idx, valid = lay.key_index()
    else:
        idx, valid = layout_index(lay, q.device)
    return _gather(q, k, v, idx, valid, lay.q_block, lay.n_blocks, **kw)


def _gather(q, k, v, idx, valid, qbk, nqb, *, causal, q_pos0, window, scale, softcap, keep, add,
            row, return_lse):
    """Sparse attention of q [B, Hq, Lq, d] over the keys idx [B, Hkv,
    nqb, K] (valid where `valid`) of each query block: the keys gathered,
    [.., q_block, K] scores per chunk of blocks."""
    B, Hq, Lq, d = q.shape
    Hkv, Lk, dv = k.shape[1], k.shape[2], v.shape[3]
    G = Hq // Hkv
    dev = q.device
    K = idx.shape[-1]
    nb = max(1, min(nqb, _budget(dev) // max(1, B * Hq * qbk * (K if row is None else Lk))))
    pad = nqb * qbk - Lq
    qp = F.pad(q, (0, 0, 0, pad)) if pad else q
    o = torch.zeros(B, Hq, nqb * qbk, dv, dtype=torch.float32, device=dev)
    lse = torch.full((B, Hq, nqb * qbk), float("-inf"), device=dev) if return_lse else None
    kidx_all = idx  # [B, Hkv, nqb, K]
    for b0 in range(0, nqb, nb):
        b1 = min(nqb, b0 + nb)
        n = b1 - b0
        r0, r1 = b0 * qbk, b1 * qbk
        ix = kidx_all[:, :, b0:b1]                       # [B, Hkv, n, K]
        flat = ix.reshape(B, Hkv, n * K, 1)
        kg = torch.gather(k, 2, flat.expand(B, Hkv, n * K, d)).reshape(B, Hkv, 1, n, K, d)
        vg = torch.gather(v, 2, flat.expand(B, Hkv, n * K, dv)).reshape(B, Hkv, 1, n, K, dv)
        qc = qp[:, :, r0:r1].reshape(B, Hkv, G, n, qbk, d)
        s = torch.matmul(qc.float(), kg.float().transpose(-1, -2)) * scale  # [B,Hkv,G,n,qbk,K]
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        ok = valid[:, :, b0:b1].reshape(B, Hkv, 1, n, 1, K)
        kpos = ix.reshape(B, Hkv, 1, n, 1, K)
        qpos = (torch.arange(r0, r1, device=dev) + q_pos0).reshape(1, 1, 1, n, qbk, 1)
        ok = ok & (qpos < Lq + q_pos0)  # padded rows see nothing
        if causal:
            ok = ok & (kpos <= qpos)
        if window > 0:
            ok = ok & (kpos > qpos - window)
        if keep is not None:  # [B|1, 1, 1, Lk] -> per selected key
            km = keep[:, 0, 0, :].expand(B, Lk)[:, None, :].expand(B, Hkv, Lk)
            ok = ok & torch.gather(km, 2, ix.reshape(B, Hkv, n * K)).reshape(B, Hkv, 1, n, 1, K)
        if add is not None:
            am = add[:, 0, 0, :].expand(B, Lk)[:, None, :].expand(B, Hkv, Lk)
            s = s + torch.gather(am, 2, ix.reshape(B, Hkv, n * K)).reshape(B, Hkv, 1, n, 1, K)
        if row is not None:  # [mb, mh, Lq|1, Lk]: gathered at the selected keys
            mb, mh = row.shape[0], row.shape[1]
            if row.shape[2] == 1:
                rr = row.reshape(mb, mh // G if mh > 1 else 1, G if mh > 1 else 1, 1, Lk)
                rr = rr.expand(B, Hkv, G, n, Lk)
                gi = ix.reshape(B, Hkv, 1, n, K).expand(B, Hkv, G, n, K)
                gm = torch.gather(rr, 4, gi).reshape(B, Hkv, G, n, 1, K)
            else:
                rr = row[:, :, r0:min(r1, Lq)]
                if rr.shape[2] < r1 - r0:  # the last chunk's padded rows
                    fill = torch.zeros(mb, mh, r1 - r0 - rr.shape[2], Lk, dtype=rr.dtype,
                                       device=dev)
                    rr = torch.cat([rr, fill], dim=2)
                rr = rr.reshape(mb, mh // G if mh > 1 else 1, G if mh > 1 else 1, r1 - r0, Lk)
                rr = rr.expand(B, Hkv, G, r1 - r0, Lk)
                gi = ix.reshape(B, Hkv, 1, n, 1, K).expand(B, Hkv, G, n, qbk, K)
                gm = torch.gather(rr, 4, gi.reshape(B, Hkv, G, n * qbk, K))
                gm = gm.reshape(B, Hkv, G, n, qbk, K)
            if gm.dtype == torch.bool:
                ok = ok & gm
            else:
                s = s + gm.float()
        s = s.masked_fill(~ok, float("-inf"))
        l = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.exp(s - l[..., None]), nan=0.0)
        oc = torch.matmul(p, vg.float())  # [B, Hkv, G, n, qbk, dv]
        o[:, :, r0:r1] = oc.reshape(B, Hq, r1 - r0, dv)
        if lse is not None:
            lse[:, :, r0:r1] = l.reshape(B, Hq, r1 - r0)
    o = o[:, :, :Lq]
    return o, (lse[:, :, :Lq] if lse is not None else None)


_FLEX_COMPILED = None


def _flex_fn(device):
    """flex_attention, compiled once per process on CUDA (its fused kernel;
    eager off CUDA)."""
    global _FLEX_COMPILED
    from torch.nn.attention.flex_attention import flex_attention
    if not (FLEX_COMPILE if FLEX_COMPILE is not None else device.type == "cuda"):
        return flex_attention
    if _FLEX_COMPILED is None:
        # CUDA: dynamic shapes after a first recompile (the usual use). The
        # CPU (inductor's C++ flex template, torch 2.15) failed to compile
        # the dynamic version of this mask_mod ("cur_qSplitSize3 was not
        # declared"): one static kernel per shape there.
        _FLEX_COMPILED = torch.compile(flex_attention,
                                       dynamic=None if device.type == "cuda" else False)
    return _FLEX_COMPILED


def flex_block_mask(lay, Hq, mask_mod):
    """The BlockMask of a TorchLayout: FLEX_TILE (rows, keys) tiles, a KV tile
    listed for a query tile when a range of one of its router blocks
    reaches into it (every listed tile partial: mask_mod decides per key).
    Built from the merged ranges, [B, Hkv, n_blocks, KV tiles] at most:
    never Lq x Lk."""
    from torch.nn.attention.flex_attention import BlockMask
    TQ, T = (FLEX_TILE, FLEX_TILE) if isinstance(FLEX_TILE, int) else FLEX_TILE
    B, Hkv, nqb, qbk, Lq, Lk = lay.B, lay.Hkv, lay.n_blocks, lay.q_block, lay.Lq, lay.Lk
    dev = lay.device
    nqt, nkt = (Lq + TQ - 1) // TQ, (Lk + T - 1) // T
    r, n = lay.merged()                                           # [B, Hkv, nqb, R, 2]
    R = r.shape[3]
    ok = torch.arange(R, device=dev) < n[..., None]
    t0 = torch.where(ok, r[..., 0] // T, torch.full_like(r[..., 0], nkt))
    t1 = torch.where(ok, (r[..., 1] - 1) // T + 1, torch.full_like(t0, nkt))
    diff = torch.zeros(B, Hkv, nqb, nkt + 1, dtype=torch.int32, device=dev)
    one = torch.ones_like(t0, dtype=torch.int32)
    diff.scatter_add_(3, t0, one)
    diff.scatter_add_(3, t1, -one)
    occ = (torch.cumsum(diff, 3)[..., :nkt] > 0).to(torch.int32)   # [B, Hkv, nqb, nkt]
    # router blocks -> query tiles (a block may straddle two or more tiles)
    r0 = torch.arange(nqb, device=dev) * qbk
    r1 = torch.clamp(r0 + qbk, max=Lq)
    occ_t = torch.zeros(B, Hkv, nqt, nkt, dtype=torch.int32, device=dev)
    span = (qbk + TQ - 1) // TQ + 1
    for o in range(span):  # the tiles a block reaches: at most a few
        tq = torch.minimum(r0 // TQ + o, (r1 - 1) // TQ)
        occ_t.scatter_reduce_(2, tq.view(1, 1, nqb, 1).expand(B, Hkv, nqb, nkt), occ, "amax")
    num = occ_t.sum(-1).to(torch.int32)
    ind = torch.sort(occ_t, dim=-1, descending=True, stable=True).indices.to(torch.int32)
    G = Hq // Hkv
    if G > 1:
        num = num.repeat_interleave(G, dim=1)
        ind = ind.repeat_interleave(G, dim=1)
    # no full tiles (every listed tile goes through mask_mod), stated as
    # zeros: inductor's CPU template (torch 2.15) fails to compile a
    # one-row query without them
    return BlockMask.from_kv_blocks(num.contiguous(), ind.contiguous(), torch.zeros_like(num),
                                    torch.zeros_like(ind), BLOCK_SIZE=(TQ, T),
                                    mask_mod=mask_mod, seq_lengths=(Lq, Lk))


def _flex(q, k, v, lay, *, causal, q_pos0, window, scale, softcap, keep, add, row, return_lse):
    """Sparse attention of a TorchLayout through FlexAttention: the block
    mask lists the KV tiles each query tile's router blocks reach; the
    mask_mod keeps key kv for row q iff kv is in a chunk the row's block
    took or in one of its two fixed ranges, and causality, window and the
    per-key / per-row boolean masks allow it; the score_mod applies softcap
    and the additive masks. Rows with no allowed key give zeros (lse
    -inf)."""
    from torch.nn.attention.flex_attention import AuxRequest
    B, Hq, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qbk = lay.q_block
    nc = lay.taken.shape[-1]
    # padded to the most chunks the shape allows (+ one "no chunk"), so that
    # the compiled kernel sees one size per shape whatever the routing made
    pad = max(getattr(lay, "max_chunks", nc), nc) + 1 - nc
    taken = torch.cat([lay.taken, lay.taken.new_zeros(*lay.taken.shape[:-1], pad)], -1)
    chunk_of = lay.chunk_of
    fixed = lay.fixed                                             # [nqb, 4]
    # picked sinks as a table over each block's first keys: sink_tab[b, g,
    # qb, j] = key alo[qb] + j is a picked sink
    sinks = getattr(lay, "sinks", None)
    if sinks is not None:
        SW = sinks.shape[-1]
        rel = torch.where(sinks >= 0, sinks - lay.alo[None, None, :, None],
                          torch.full_like(sinks, SW))
        sink_tab = torch.zeros(*sinks.shape[:-1], SW + 1, dtype=torch.bool, device=q.device)
        sink_tab.scatter_(3, rel, True)
        sink_tab = sink_tab[..., :SW].contiguous()
        alo_t = lay.alo
        sw_last = SW - 1
    # per-call numbers as 0-d tensors: the compiled kernel takes them as
    # inputs instead of recompiling for each value (q_pos0 moves with
    # every decode step)
    dev = q.device
    lastq = torch.tensor(Lq - 1, device=dev)
    lastk = torch.tensor(Lk - 1, device=dev)
    q_pos0_t = torch.tensor(int(q_pos0), device=dev)
    window_t = torch.tensor(int(window), device=dev)
    causal, use_window = bool(causal), int(window) > 0
    keep_b = None if keep is None else keep[:, 0, 0, :]          # [B|1, Lk]
    add_b = None if add is None else add[:, 0, 0, :].float()
    row_bool = row if row is not None and row.dtype == torch.bool else None
    row_add = row.float() if row is not None and row.dtype != torch.bool else None

    def pick(m, b, h, qi, ki):  # m [mb, mh, Lq|1, Lk] at (b, h, qi, ki), broadcast dims at 0
        bi = b if m.shape[0] > 1 else 0
        hi = h if m.shape[1] > 1 else 0
        if m.shape[2] > 1:
            return m[bi, hi, torch.minimum(qi, lastq), ki]
        return m[bi, hi, 0, ki]

    def mask_mod(b, h, qi, ki):
        kc = torch.minimum(ki, lastk)
        qc = torch.minimum(qi, lastq)
        blk = qc // qbk
        c = chunk_of[b, kc]
        ok = taken[b, h // G, blk, c]
        ok = ok | ((kc >= fixed[blk, 0]) & (kc < fixed[blk, 1]))
        ok = ok | ((kc >= fixed[blk, 2]) & (kc < fixed[blk, 3]))
        if sinks is not None:
            rel = kc - alo_t[blk]
            hit = sink_tab[b, h // G, blk, torch.clamp(rel, min=0, max=sw_last)]
            ok = ok | (hit & (rel >= 0) & (rel <= sw_last))
        pos = qc + q_pos0_t
        if causal:
            ok = ok & (kc <= pos)
        if use_window:
            ok = ok & (kc > pos - window_t)
        if keep_b is not None:
            ok = ok & keep_b[b if keep_b.shape[0] > 1 else 0, kc]
        if row_bool is not None:
            ok = ok & pick(row_bool, b, h, qi, kc)
        return ok

    score_mod = None
    if softcap > 0 or add_b is not None or row_add is not None:
        use_cap = softcap > 0
        # a captured Python float becomes a SymFloat, which the op refuses
        cap_t = torch.tensor(float(softcap), dtype=torch.float32, device=q.device)

        def score_mod(s, b, h, qi, ki):
            kc = torch.minimum(ki, lastk)
            if use_cap:
                s = cap_t * torch.tanh(s / cap_t)
            if add_b is not None:
                s = s + add_b[b if add_b.shape[0] > 1 else 0, kc]
            if row_add is not None:
                s = s + pick(row_add, b, h, qi, kc)
            return s
    if return_lse and q.device.type == "cpu" and FLEX_COMPILE:
        raise ValueError("return_lse with FlexAttention compiled on the CPU: PyTorch's CPU "
                         "template does not return the lse; use the gather kernel "
                         "(_backend.SPARSE_KERNEL = 'gather', the CPU default) or FLEX_COMPILE "
                         "= None")
    bm = flex_block_mask(lay, Hq, mask_mod)
    fn = _flex_fn(q.device)
    dt = q.dtype if q.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
    with warnings.catch_warnings():
        # eager off CUDA: PyTorch warns that it materialises the scores (documented)
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        # rows with no allowed key: FlexAttention gives zeros (its kernels
        # guard them unless ROWS_GUARANTEED_SAFE) and lse -inf, as C
        r = fn(q.to(dt), k.to(dt), v.to(dt), score_mod=score_mod, block_mask=bm,
               scale=float(scale), enable_gqa=G > 1,
               return_aux=AuxRequest(lse=True) if return_lse else None)
    if return_lse:
        return r[0].float(), r[1].lse.float()
    return r.float(), None


def attention(q, k, v, *, layout="BHLD", causal=False, q_pos0=0, window=0, scale=None,
              softcap=0.0, key_padding_mask=None, attn_mask=None, sparse=None,
              return_lse=False):
    """dhsa.attention's semantics on PyTorch's kernels (any device). q/k/v
    torch tensors in `layout`; returns o in the same layout and q's dtype
    (or (o, lse) with return_lse, lse [B, Hq, Lq] float32)."""
    if layout not in ("BHLD", "BLHD"):
        raise ValueError("layout must be 'BHLD' or 'BLHD', not %r" % (layout,))
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError("q is on %s and %s on %s: put q, k and v on one device"
                             % (q.device, name, t.device))
    qh, kh, vh = _bhld(q, layout), _bhld(k, layout), _bhld(v, layout)
    if qh.dim() != 4 or kh.dim() != 4 or vh.dim() != 4:
        raise ValueError("q, k and v must be 4-D")
    B, Hq, Lq, d = qh.shape
    Hkv, Lk = kh.shape[1], kh.shape[2]
    if kh.shape[0] != B or kh.shape[3] != d or vh.shape[:3] != kh.shape[:3]:
        raise ValueError("q %s, k %s and v %s do not match (as [B, H, L, D])"
                         % (tuple(qh.shape), tuple(kh.shape), tuple(vh.shape)))
    if Hkv < 1 or Hq % Hkv:
        raise ValueError("q has %d heads, not a multiple of k's %d" % (Hq, Hkv))
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if attn_mask is not None:
        attn_mask = _mask4(attn_mask, B, Hq, Lq, Lk)
    keep, add, row = _key_terms(key_padding_mask, attn_mask, B, Lk, q.device)
    kw = dict(causal=bool(causal), q_pos0=int(q_pos0), window=int(window), scale=float(scale),
              softcap=float(softcap or 0.0), keep=keep, add=add, row=row, return_lse=return_lse)
    if sparse is not None:
        o, lse = _sparse(qh, kh, vh, sparse, **kw)
    else:
        o, lse = _dense(qh, kh, vh, **kw)
    o = o.to(q.dtype)
    if layout == "BLHD":
        o = o.transpose(1, 2).contiguous()
    return (o, lse) if return_lse else o
