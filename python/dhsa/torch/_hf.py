"""_hf.py: patch_transformers(model, method=..., density=...), dhsa as the
attention of Hugging Face transformers Llama, Qwen2, Gemma2 and Gemma3 models, on the
CPU through dhsa's kernels and on other devices through PyTorch's (backend=)
(the plug-in mode of the DHSA reference code: the model's own projections
and RoPE, dhsa between them and the output projection).

Contract (docs/torch.md, "Hugging Face transformers"):
  - Registers an attention function and a mask function named "dhsa" in
    transformers' AttentionInterface / AttentionMaskInterface (once per
    process) and switches the model to it. Settings live on each attention
    module (module._dhsa), so two models can be patched differently.
  - No L x L mask is ever built: the mask function returns None, or the
    padding as a per-key [B, 1, 1, Lk] bool keep-mask; causality
    (bottom-right aligned over the KV cache, q_pos0 = Lk - Lq), the sliding
    window (sliding_window=) and Gemma 2's softcap (softcap=) are applied
    by the kernel. A mask function that is neither causal nor causal with a
    sliding window (packed sequences, custom overlays, bidirectional) is
    refused (NotImplementedError), never approximated.
  - method "dense": dhsa's dense tiled kernel; "dhsa", "block": a decode
    index over the call's keys per global layer, call and sequence (as a
    session routes; on the host for tensors elsewhere), "stream",
    "oracle": dhsa.route(); each with what a dhsa session runs for the
    call's keys
    (_params: the length-scaled defaults of every entry point, causal
    boundaries, the router keywords over them, the hybrid chunk rule),
    then the sparse kernel; sliding-window layers read their window
    densely in every method, as sessions do. The stats() of every layout
    are kept (model_stats(model)); a sliding layer's as density 1.
Tested by python/tests/test_torch_hf.py.
"""

import dataclasses

import torch

import dhsa

from . import _ops, _rest
from ._ops import attention, pick_backend, route

NAME = "dhsa"
_SUPPORTED = ("LlamaAttention", "Qwen2Attention", "Gemma2Attention", "Gemma3Attention")
METHODS = ("dense", "dhsa", "block", "stream", "oracle")


def _transformers():
    try:
        import transformers
        from transformers import masking_utils
        from transformers.modeling_utils import AttentionInterface
    except Exception as e:
        raise ImportError("patch_transformers needs Hugging Face transformers, which is not "
                          "importable here (%s): pip install transformers (make test-torch "
                          "installs it in its venv)" % e) from e
    return transformers, masking_utils, AttentionInterface

# ----------------------------------------------------------------- masks ---


def _window_of(mask_function, mu):
    """0 for transformers' causal mask function, W for causal with a
    sliding window of W, None for anything else."""
    if mask_function is mu.causal_mask_function:
        return 0
    fns = ()
    for cell in getattr(mask_function, "__closure__", None) or ():
        if isinstance(cell.cell_contents, tuple):
            fns = cell.cell_contents
    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask" or len(fns) != 2:
        return None
    overlay, causal = fns
    if causal is not mu.causal_mask_function or \
            getattr(overlay, "__qualname__", "") != "sliding_window_overlay.<locals>.inner_mask":
        return None
    w = [c.cell_contents for c in overlay.__closure__ or () if isinstance(c.cell_contents, int)]
    if len(w) != 1:
        return None
    # the overlay must be what its name says: probe it
    q = torch.tensor([w[0] + 5])
    kv = torch.tensor([5, 6])
    if overlay(0, 0, q, kv).tolist() != [False, True]:
        return None
    return w[0]


def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
          attention_mask=None, **kwargs):
    """transformers' mask interface for "dhsa": None (no padding) or the
    padding of the keys this layer sees as [B, 1, 1, kv_length] bool, True
    = the key takes part. Never q_length x kv_length."""
    _, mu, _ = _transformers()
    if _window_of(mask_function, mu) is None:
        raise NotImplementedError(
            "dhsa.torch.patch_transformers: this call asks for an attention mask that is neither "
            "causal nor causal with a sliding window (%s: packed sequences, a custom or "
            "bidirectional mask); dhsa's patch expresses only those two (plus padding) and refuses "
            "the rest rather than approximate it" % getattr(mask_function, "__qualname__", "?"))
    if attention_mask is None:
        return None
    m = attention_mask
    if m.dim() != 2:
        raise NotImplementedError("dhsa.torch.patch_transformers: a %d-D attention_mask is not "
                                  "supported (give the [B, L] padding mask)" % m.dim())
    m = m.bool()
    if m.shape[1] < kv_offset + kv_length:
        raise ValueError("attention_mask covers %d positions, the keys reach %d"
                         % (m.shape[1], kv_offset + kv_length))
    m = m[:, kv_offset:kv_offset + kv_length]
    if bool(m.all()):
        return None
    return m.reshape(m.shape[0], 1, 1, kv_length)

# ------------------------------------------------------------- attention ---


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
               sliding_window=None, softcap=None, **kwargs):
    """transformers' attention interface for "dhsa": query [B, Hq, Lq, d],
    key/value [B, Hkv, Lk, d] (post-RoPE, the KV cache included). Returns
    (attn_output [B, Lq, Hq, d], None)."""
    cfg = getattr(module, "_dhsa", None)
    if cfg is None:
        raise RuntimeError("dhsa attention called on %s, which patch_transformers did not patch "
                           "(the model's config says attn_implementation='dhsa')"
                           % type(module).__name__)
    if dropout:
        raise ValueError("dhsa attention: dropout = %r; dhsa's kernels have no attention dropout "
                         "(use the model in eval())" % (dropout,))
    if kwargs.get("output_attentions"):
        raise ValueError("dhsa attention does not return attention weights (output_attentions="
                         "True): they are L x L; use attn_implementation='eager' for them")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("dhsa attention: position_bias is not supported")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if not is_causal:
        raise NotImplementedError("dhsa attention: this layer is bidirectional (is_causal=False); "
                                  "the patch supports causal decoders")
    B, Hq, Lq, d = query.shape
    Lk = key.shape[2]
    q_pos0 = Lk - Lq  # the queries are the newest positions of the cache
    window = int(sliding_window or 0)
    kw = dict(causal=True, q_pos0=q_pos0, window=window, scale=scaling,
              softcap=float(softcap or 0.0), layout="BLHD")
    if attention_mask is not None:
        if attention_mask.dim() != 4 or tuple(attention_mask.shape[1:3]) != (1, 1):
            raise NotImplementedError("dhsa attention: got a %s attention mask; the 'dhsa' mask "
                                      "function gives None or [B, 1, 1, Lk]"
                                      % (tuple(attention_mask.shape),))
        kw["attn_mask"] = attention_mask  # per key, True = keep
    sc = float(scaling) if scaling else 1.0 / d ** 0.5
    if cfg["method"] == "dense" or window > 0:
        if cfg["method"] != "dense":
            # a sliding-window layer reads its window densely in every
            # method, as dhsa's sessions do (src/model/session.c)
            cfg["stats"].append(_window_stats(B, key.shape[1], Lq, Lk, q_pos0, window))
        # BLHD views of the BHLD tensors: dhsa writes o as [B, Lq, Hq, d],
        # the layout transformers wants, so nothing is transposed after.
        o = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                      backend=cfg.get("backend"), **kw)
        return o, None
    p = _params(cfg, Lk)
    rest = _rest_on(cfg, module, p, Lq)
    r = _exact_from(cfg, p, Lq)  # rows r.. rank their chunks exactly (Lq: none)
    first = cfg.setdefault("first", {})
    if Lq == 1 and first and all(_continues(first.get(b), key[b], Lk) for b in range(B)):
        r = 0  # the first decode step after a prompt call that ranked rows exactly (as a session)
    first.clear()
    if r < Lq and Lq > 1:
        for b in range(B):
            first[b] = (Lk, key[b, :, Lk - 1].detach().clone())
    st = {"B": B, "Hkv": key.shape[1], "Lq": Lq, "Lk": Lk, "q_block": p.q_block, "q_pos0": q_pos0,
          "causal": True, "window": window, "selected": 0.0, "available": 0.0, "summaries": 0,
          "exact_rows": (Lq - r) * B, "carried": 0}
    if Lq > 1:
        cfg["carry"].clear()  # a prompt's rows: the next step carries nothing (as a session)
    if cfg["method"] in ("dhsa", "block"):
        # as a session: the decode index's chunks and routing, per sequence,
        # a decode step with the chunks the sequence's previous step carries;
        # routed on the CPU (host copies of q and k on another device),
        # attended by the call's back end on the tensors' device
        share = p.carry if Lq == 1 and not p.share_heads else 0.0  # DHSA and block, as a session
        outs = []
        for b in range(B):
            keep = _carried(cfg, b, key[b], Lk) if share > 0 else None
            if keep is not None:
                st["carried"] += int((keep >= 0).sum())
            o, got = _index_rows(query[b:b + 1], key[b:b + 1], value[b:b + 1],
                                 None if attention_mask is None else attention_mask[b:b + 1],
                                 p, sc, kw["softcap"], q_pos0, r, rest, st, keep=keep, share=share,
                                 backend=cfg.get("backend"))
            if share > 0:
                cfg["carry"][b] = (Lk, key[b, :, Lk - 1].detach().clone(), got)
            outs.append(o)
        o = outs[0] if B == 1 else torch.cat(outs, 0)
    else:
        # stream and oracle: sessions route them without the index
        # (dhsa_route's layout; the oracle in the C router only)
        lay = route(query, key, causal=True, q_pos0=q_pos0, window=window, sparse=p,
                    backend=cfg.get("backend"))
        o = _attend_part(query, key, value, lay, p, sc, rest, st, None, backend=cfg.get("backend"), **kw)
    st["density"] = st["selected"] / st["available"] if st["available"] else float("nan")
    cfg["stats"].append(st)
    return o, None


def _attend_part(q, k, v, lay, p, sm_scale, rest, st, starts, **kw):
    """Attention of rows q [B, Hq, n, d] (BHLD) over k, v under the layout
    lay (closed here) and the attention keywords kw (q_pos0, softcap,
    mask, back end: BLHD output), with the summaries of the rest when rest
    (chunks: starts, or the router's; sm_scale the softmax scale resolved);
    adds the layout's selected /
    available keys and the summaries to st. Returns o [B, n, Hq, dv]."""
    try:
        ls = lay.stats()
        st["selected"] += ls["selected"]
        st["available"] += ls["available"]
        o = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sparse=lay,
                      return_lse=rest, **kw)
        if rest:
            o, lse = o
            st["summaries"] += _rest.attend(o, lse, q, k, v, lay, p, sm_scale, kw["softcap"], kw["q_pos0"],
                                            starts=starts)
        return o
    finally:
        lay.close()


def _host(t):
    """t as a numpy array for dhsa's C router: a view of a CPU tensor; a
    float32 host copy of a bfloat16 tensor or of one on another device."""
    t = t.detach()
    if t.device.type == "cpu" and t.dtype != torch.bfloat16:
        return t.numpy()
    return t.to(device="cpu", dtype=torch.float32).numpy()


def _index_rows(q, k, v, mask, p, scale, softcap, q_pos0, r, rest, st, keep=None, share=0.0,
                backend=None):
    """Attention of one sequence's rows q [1, Hq, n, d] (positions q_pos0..)
    over k, v [1, Hkv, Lk, d], routed as a dhsa session routes them:
    by a decode index over the keys (dhsa.KVIndex: its chunks, candidates,
    sinks and local keys), rows r.. with each block's chunks ranked by
    their exact attention (dhsa_kv_index_route_exact), a decode step with
    the chunks keep the previous step carried ranked first
    (dhsa_kv_index_route_keep), with the summaries of the index's closed
    chunks when rest. Adds the layouts' selected / available keys and the
    summaries to st. Returns (o [1, n, Hq, dv], carried): carried, for a
    one-row call with share > 0, the chunks this step hands the next
    (dhsa_kv_index_carry: [Hkv, DHSA_CARRY_MAX], -1 after), else None.
    Routed on the CPU (host copies of q, k and the mask), attended by
    `backend` (pick_backend) where the tensors are."""
    n, d, Hkv, Lk = q.shape[2], q.shape[3], k.shape[1], k.shape[2]
    kf = _host(k)
    hmask = None if mask is None else mask.detach().cpu()
    parts, carried = [], None
    with dhsa.KVIndex(Hkv, d, Lk, params=p) as ix:
        ix.append(kf)
        bounds = ix.bounds()
        for a, z, exact in ((0, r, False), (r, n, True)):
            if z <= a:
                continue
            qp = q[:, :, a:z]
            qf = _host(qp)
            lay = ix.route(qf, kf, q_pos0 + a, exact=exact, keep=None if exact else keep, scale=scale,
                           softcap=softcap)
            if share > 0 and n == 1:
                carried = ix.carry(qf, kf, lay, share, scale=scale, softcap=softcap, attn_mask=hmask)
            kw = dict(causal=True, q_pos0=q_pos0 + a, scale=scale, softcap=softcap, layout="BLHD")
            if mask is not None:
                kw["attn_mask"] = mask
            parts.append(_attend_part(qp, k, v, lay, p, scale, rest, st, [bounds], backend=backend, **kw))
    return (parts[0] if len(parts) == 1 else torch.cat(parts, 1)), carried


def _continues(prev, k, Lk):
    """Whether a call over Lk keys k [Hkv, Lk, d] is one token on from the
    call prev = (its Lk, its newest key, ...) recorded: prev's newest key
    is this cache's key Lk - 2 (the same sequence: a new prompt, a batch
    reordered by beam search or a cache cut back is not)."""
    return (prev is not None and prev[0] == Lk - 1 and Lk >= 2
            and torch.equal(prev[1], k[:, Lk - 2]))


def _carried(cfg, b, k, Lk):
    """The chunks sequence b's previous decode step carries to this one
    (Lk keys k [Hkv, Lk, d]): those the step over Lk - 1 keys handed on
    when this call continues it (_continues), else None."""
    prev = cfg["carry"].get(b)
    return prev[2] if _continues(prev, k, Lk) and prev[2] is not None else None


def _window_stats(B, Hkv, Lq, Lk, q_pos0, window):
    """The stats() dict of a sliding-window layer read densely: every key
    each row may see (rows q_pos0.. under causality and the window), as a
    dhsa session counts such a layer (density 1)."""
    a, z = q_pos0 + 1, min(q_pos0 + Lq, Lk)  # row i sees min(i + 1, window) keys
    t = max(0, min(z, window) - a + 1)        # rows whose window is not yet full
    avail = float((t * (2 * a + t - 1) // 2 + (Lq - t) * window) * B * Hkv)
    return {"B": B, "Hkv": Hkv, "Lq": Lq, "Lk": Lk, "q_block": Lq, "n_blocks": 1, "max_ranges": 1,
            "q_pos0": q_pos0, "causal": True, "window": window, "selected": avail,
            "available": avail, "density": 1.0 if avail else float("nan"), "ranges": B * Hkv,
            "dense_blocks": B * Hkv, "chunks": 0, "chunk_mean": 0.0, "chunk_min": 0, "chunk_max": 0,
            "summaries": 0, "exact_rows": 0, "carried": 0}


def _params(cfg, n):
    """The RouterParams a global layer of the patched model routes a call
    over n keys with: what a dhsa session runs (docs/torch.md): the
    defaults of every entry point for n keys (RouterParams.for_length),
    causal boundaries (a session's, so a prefill and the decode steps
    after it cut the same chunks), the caller's keywords over them, the
    method, and on a model that interleaves sliding-window layers chunks
    of at most hybrid_max_chunk keys unless min_chunk / max_chunk or
    params= were given."""
    r = dict(cfg["router"])
    given = set(r)
    if "params" not in r:
        r.setdefault("causal_boundaries", True)
    p = _ops.default_params(n, dict(r, method=cfg["method"]))
    if cfg.get("hybrid") and p.hybrid_max_chunk > 0 and not given & {"min_chunk", "max_chunk", "params"}:
        mx = min(p.max_chunk, p.hybrid_max_chunk)
        p = dataclasses.replace(p, max_chunk=mx, min_chunk=min(p.min_chunk, mx))
    return p


def _rest_on(cfg, module, p, Lq):
    """Whether this routed call also attends the chunks its blocks leave
    out, summarised (_rest.py), as a session's would: DHSA or block, a
    call of more than one row (a prompt, not a decode step), and p.rest:
    REST_HYBRID (-1) in every global layer of a hybrid model, n > 0 in
    layers n - 1 and after, 0 never."""
    if cfg["method"] not in ("dhsa", "block") or Lq < 2:
        return False
    n = (1 if cfg.get("hybrid") else 0) if p.rest == dhsa.REST_HYBRID else p.rest
    return n > 0 and int(getattr(module, "layer_idx", 0) or 0) + 1 >= n


def _exact_from(cfg, p, Lq):
    """The first row of this routed call whose block ranks its chunks by
    the exact attention its rows put on them, as a session's answering
    eval does (src/model/session.c, attend): the start of the query block
    that holds row Lq - exact_rows, for a call of more than one row, DHSA
    or block, exact_rows > 0, not share_heads; Lq (none) otherwise."""
    if cfg["method"] not in ("dhsa", "block") or Lq < 2 or p.exact_rows <= 0 or p.share_heads:
        return Lq
    first = Lq - p.exact_rows
    return first - first % p.q_block if first > 0 else 0


def _hybrid(mods):
    """Whether the model interleaves sliding-window layers with global
    ones (gemma-2/3; dhsa__model_hybrid in C)."""
    w = [bool(getattr(m, "sliding_window", None)) for _, m in mods]
    return any(w) and not all(w)

# ------------------------------------------------------------------- API ---


def _register():
    _, mu, AttentionInterface = _transformers()
    if AttentionInterface._global_mapping.get(NAME) is not _attention:
        AttentionInterface.register(NAME, _attention)
    if mu.AttentionMaskInterface._global_mapping.get(NAME) is not _mask:
        mu.AttentionMaskInterface.register(NAME, _mask)


def _attention_modules(model):
    return [(p, m) for p, m in model.named_modules() if type(m).__name__ in _SUPPORTED]


def _set_implementation(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def patch_transformers(model, method="dhsa", density=0.0625, backend=None, **router):
    """Makes a transformers Llama, Qwen2, Gemma2 or Gemma3 model (…ForCausalLM or
    the bare model) run its attention on dhsa, in place, on CPU tensors.

    method: "dense" (dhsa's dense kernel), "dhsa" (DHSA routing), "block",
    "stream" or "oracle" (dhsa.route() baselines; the torch back end routes
    them with dhsa.torch.route, which refuses "oracle" and causal learned
    boundaries); "dhsa" and "block" route as a session on either back end
    (a decode index over the call's keys, built on the host). density:
    the share of keys each query block may see (routed methods); router: any other dhsa.route() keyword (budget=,
    q_block=, sink=, local=, dense_below=, boundary=, ...:
    docs/python.md). Returns the paths of the attention modules patched.
    backend: None (dhsa's C kernels for a model on the CPU, PyTorch's
    kernels on any other device: SDPA for "dense", the gather kernel over
    the index's layouts for "dhsa" and "block", the torch router and
    FlexAttention / the gather kernel for "stream"), "c" or "torch".
    model_stats(model) gives the routed densities;
    unpatch_transformers(model) restores the previous implementation."""
    _transformers()
    if method not in METHODS:
        raise ValueError("method must be one of %s, not %r" % (", ".join(METHODS), method))
    mods = _attention_modules(model)
    if not mods:
        raise TypeError("patch_transformers: %s has no %s module: supported are transformers' "
                        "Llama, Qwen2, Gemma2 and Gemma3 models" % (type(model).__name__,
                                                            " / ".join(_SUPPORTED)))
    router = dict(router)
    if method != "dense":
        if "budget" not in router:
            router["density"] = density
        dhsa.RouterParams(**{k: v for k, v in router.items() if k != "params"})  # names checked now
    pick_backend(backend)  # the name
    if backend == "c":
        for name, p in model.named_parameters():
            if p.device.type != "cpu":
                raise ValueError("patch_transformers: backend='c' runs dhsa's CPU kernels and "
                                 "parameter %s is on %s: use backend=None or 'torch'"
                                 % (name, p.device))
    _register()
    prev = getattr(model.config, "_attn_implementation", None)
    if prev == NAME:
        prev = getattr(model, "_dhsa_previous_attn", prev)
    stats = []
    hybrid = _hybrid(mods)
    for _, m in mods:
        m._dhsa = {"method": method, "router": router, "stats": stats, "backend": backend,
                   "hybrid": hybrid, "carry": {}, "first": {}}
    model._dhsa_previous_attn = prev
    model._dhsa_stats = stats
    _set_implementation(model, NAME)
    return [p for p, _ in mods]


def router_params(model, n):
    """The dhsa.RouterParams the patched model's global (not sliding-window)
    layers route a call over n keys with (prefill: the prompt's length;
    a decode step: the keys in the cache), or None for method "dense"."""
    mods = [m for _, m in _attention_modules(model) if hasattr(m, "_dhsa")]
    if not mods:
        raise ValueError("router_params: the model was not patched by patch_transformers")
    cfg = mods[0]._dhsa
    return None if cfg["method"] == "dense" else _params(cfg, n)


def model_stats(model):
    """The stats() dicts of every routed call since patch_transformers
    (one per layer and forward call; a sliding-window layer's window read
    densely counts as density 1), summed as {"calls": n, "density":
    mean, "selected": sum, "available": sum, "summaries": share,
    "carried": n} where density = selected / available over all calls,
    summaries = the chunk summaries read (rows x KV heads x chunks) /
    available, and carried = the chunks decode steps ranked first because
    the step before carried them (RouterParams.carry)."""
    stats = getattr(model, "_dhsa_stats", None)
    if stats is None:
        raise ValueError("model_stats: the model was not patched by patch_transformers")
    sel = sum(s["selected"] for s in stats)
    avail = sum(s["available"] for s in stats)
    summ = sum(s.get("summaries", 0) for s in stats)
    return {"calls": len(stats), "selected": sel, "available": avail,
            "density": (sel / avail) if avail else float("nan"),
            "summaries": (summ / avail) if avail else float("nan"),
            "carried": sum(s.get("carried", 0) for s in stats)}


def unpatch_transformers(model):
    """Restores the attention implementation the model had before
    patch_transformers and removes the dhsa settings."""
    prev = getattr(model, "_dhsa_previous_attn", None)
    if prev is None and not hasattr(model, "_dhsa_stats"):
        raise ValueError("unpatch_transformers: the model was not patched by patch_transformers")
    for _, m in _attention_modules(model):
        if hasattr(m, "_dhsa"):
            del m._dhsa
    _set_implementation(model, prev or "sdpa")
    del model._dhsa_previous_attn, model._dhsa_stats

