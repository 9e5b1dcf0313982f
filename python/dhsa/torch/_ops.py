"""_ops.py: torch tensors into dhsa's kernels without copies, and
dhsa.torch.scaled_dot_product_attention (F.scaled_dot_product_attention's
semantics, plus DHSA routing through sparse=).

Contract (docs/torch.md, "Back ends", "Tensors" and
"scaled_dot_product_attention"):
  - backend: None = the C kernels when every tensor is on the CPU, else
    PyTorch's (_backend.py); "c" / "torch" force one (pick_backend).
  - C back end: CPU, strided tensors only; float32 and float16 go to C as numpy views of
    the tensor's own memory (Tensor.numpy() shares it), bfloat16 as a
    uint16 view of the same bits; other dtypes and devices are refused.
  - The output is a new tensor wrapping the array C wrote (torch.from_numpy,
    no copy); bfloat16 inputs give a float32 result from C, cast to
    bfloat16 (one output-sized copy).
  - With autograd recording (grad enabled and an input requiring grad), the
    result comes from an autograd.Function whose backward raises: dhsa's
    kernels are forward-only, and a silent wrong gradient is worse than an
    error.
Tested by python/tests/test_torch_sdpa.py and test_torch_mha.py.
"""

import numpy as np
import torch

import dhsa
from dhsa._route import _router_params

_BF16 = torch.bfloat16

# ------------------------------------------------------------- tensors ---


def as_numpy(name, t):
    """(array, is_bf16): a numpy view of the CPU tensor t's memory."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s is on %s: dhsa.torch runs dhsa's CPU kernels, so tensors must be on "
                         "the CPU (move them with .cpu(), or keep PyTorch's attention on %s)"
                         % (name, t.device, t.device.type))
    if t.layout != torch.strided or getattr(t, "is_nested", False):
        raise ValueError("%s is a %s tensor: dhsa.torch takes strided (dense) tensors"
                         % (name, "nested" if getattr(t, "is_nested", False) else str(t.layout)))
    t = t.detach()
    if t.dtype in (torch.float32, torch.float16, torch.bool):
        return t.numpy(), False
    if t.dtype == _BF16:
        return t.view(torch.int16).numpy().view(np.uint16), True
    if t.is_floating_point():  # float64: dhsa's kernels do not take it
        raise TypeError("%s has dtype %s: dhsa takes float32, float16 or bfloat16 (convert with "
                        ".float())" % (name, t.dtype))
    raise TypeError("%s has dtype %s: masks are bool or floating, q/k/v float32, float16 or "
                    "bfloat16" % (name, t.dtype))


def mask_numpy(name, m):
    """A mask tensor as numpy: bool and float32/float16 as views, other
    floating dtypes (bfloat16, float64) converted to float32 (one copy at
    the mask's own shape)."""
    if m is None:
        return None
    if isinstance(m, torch.Tensor) and m.is_floating_point() and m.dtype not in (torch.float32,
                                                                                 torch.float16):
        m = m.detach().to(torch.float32)
    a, _ = as_numpy(name, m)
    return a


def _needs_graph(*ts):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in ts)


def _run(q, k, v, kw):
    """dhsa.attention on torch tensors: (o, lse or None)."""
    qa, qb = as_numpy("q", q)
    ka, kb = as_numpy("k", k)
    va, vb = as_numpy("v", v)
    o = dhsa.attention(qa, ka, va, dtype="bfloat16" if (qb or kb or vb) else None, **kw)
    lse = None
    if kw.get("return_lse"):
        o, lse = o
        lse = torch.from_numpy(lse)
    out = torch.from_numpy(o)
    if q.dtype == _BF16:
        out = out.to(_BF16)
    return out, lse


class _ForwardOnly(torch.autograd.Function):
    """dhsa attention inside an autograd graph: forward runs the kernel,
    backward refuses."""

    @staticmethod
    def forward(ctx, q, k, v, kw):
        o, lse = _run(q, k, v, kw)
        if lse is None:
            return o
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("dhsa.torch: dhsa's attention kernels are forward-only (no backward): "
                           "train with PyTorch's attention, and swap dhsa in for inference (in "
                           "eval() under torch.inference_mode() or torch.no_grad())")


BACKENDS = (None, "c", "torch")


def pick_backend(backend, *tensors):
    """"c" (dhsa's C kernels) or "torch" (PyTorch's kernels) for these
    tensors: None picks "c" when every tensor is on the CPU and "torch"
    otherwise; "c" with a tensor off the CPU is refused."""
    if backend not in BACKENDS:
        raise ValueError("backend must be None (C kernels on the CPU, PyTorch's elsewhere), 'c' "
                         "or 'torch', not %r" % (backend,))
    devs = {t.device.type for t in tensors if isinstance(t, torch.Tensor)}
    if backend == "torch":
        return "torch"
    if devs <= {"cpu"}:
        return "c"
    if backend == "c":
        raise ValueError("backend='c' runs dhsa's CPU kernels, and a tensor is on %s: move it "
                         "with .cpu(), or use backend=None / 'torch' (PyTorch's kernels on its "
                         "device)" % ", ".join(sorted(devs - {"cpu"})))
    return "torch"


def attention(q, k, v, backend=None, **kw):
    """dhsa.attention over torch tensors (the keywords of dhsa.attention;
    masks as torch tensors). backend: see pick_backend. Returns o, or
    (o, lse) with return_lse=True."""
    if pick_backend(backend, q, k, v, kw.get("attn_mask"), kw.get("key_padding_mask")) == "torch":
        from . import _backend
        if "layout" in kw and not isinstance(kw["layout"], str):
            raise TypeError("layout= must be 'BHLD' or 'BLHD' here; pass a layout as sparse=")
        kw.pop("backend", None)
        return _backend.attention(q, k, v, **kw)
    for name in ("attn_mask", "key_padding_mask"):
        if isinstance(kw.get(name), torch.Tensor):
            kw[name] = mask_numpy(name, kw[name])
    if _needs_graph(q, k, v):
        r = _ForwardOnly.apply(q, k, v, kw)
        return r
    o, lse = _run(q, k, v, kw)
    return (o, lse) if kw.get("return_lse") else o

# ------------------------------------------------------------- routing ---


def _is_torch_layout(x):
    from ._route import TorchLayout
    return isinstance(x, TorchLayout)


def _router_kwargs(sparse):
    """Router keywords from sparse=: a dict of dhsa.route() keywords, a
    dhsa.RouterParams, or a method name ("dhsa", "block", "stream",
    "oracle")."""
    if isinstance(sparse, str):
        return {"method": sparse}
    if isinstance(sparse, dhsa.RouterParams):
        return {"params": sparse}
    if isinstance(sparse, dict):
        return dict(sparse)
    raise TypeError("sparse must be None, a dhsa.Layout, a dhsa.RouterParams, a dict of "
                    "dhsa.route() keywords (e.g. {'density': 0.0625}) or a method name, not %s"
                    % type(sparse).__name__)


def default_params(n, router):
    """The RouterParams every entry point runs by default for n keys,
    dhsa.RouterParams.for_length(n, density) (density: router's, else
    0.0625), with the keywords in `router` over it; router["params"], a
    RouterParams, replaces that base (used as the caller gave it)."""
    r = dict(router)
    base = r.pop("params", None)
    if base is None:
        base = dhsa.RouterParams.for_length(max(int(n), 1), r.get("density", 0.0625))
    elif not isinstance(base, dhsa.RouterParams):
        raise TypeError("params must be a dhsa.RouterParams, not %s" % type(base).__name__)
    return _router_params(base, r, "the router settings")


def route(q, k, *, causal, sparse, q_pos0=0, window=0, backend=None):
    """A layout for q [B, Hq, Lq, d] over k [B, Hkv, Lk, d] (torch, BHLD)
    under the router settings `sparse` (see _router_kwargs; a method name
    or a dict routes with default_params(Lk, ...), the defaults every
    entry point runs; a RouterParams as given). The back end
    (pick_backend) routes: "c", dhsa.route() (a dhsa.Layout; bfloat16 q/k
    converted to float32 first, one copy each, linear in L); "torch", the
    torch router on the tensors' device (_route.py: a TorchLayout, the same
    layout)."""
    kw = {"params": default_params(k.shape[-2], _router_kwargs(sparse))}
    if pick_backend(backend, q, k) == "torch":
        from . import _route
        return _route.route(q, k, causal=causal, q_pos0=q_pos0, window=window, **kw)
    qf = q.detach().float() if q.dtype == _BF16 else q
    kf = k.detach().float() if k.dtype == _BF16 else k
    qa, _ = as_numpy("q", qf)
    ka, _ = as_numpy("k", kf)
    return dhsa.route(qa, ka, causal=causal, q_pos0=q_pos0, window=window, **kw)

# ----------------------------------------------------------------- SDPA ---


def _to4(t, nd):
    """A 2-D/3-D/4-D SDPA operand as a 4-D view [B, H, L, E]."""
    if nd == 4:
        return t
    if nd == 3:
        return t.unsqueeze(1)
    return t.unsqueeze(0).unsqueeze(0)


def _mask4(m, nd):
    """attn_mask broadcastable to the operands' (N..., L, S), as a 4-D view
    broadcastable to [B, H, L, S]."""
    if m.dim() > nd:
        raise RuntimeError("attn_mask has %d dimensions, more than the query's %d" % (m.dim(), nd))
    while m.dim() < nd:
        m = m.unsqueeze(0)
    return _to4(m, nd)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, sparse=None,
                                 sparse_stats=None, backend=None):
    """F.scaled_dot_product_attention on dhsa's tiled kernel (CPU tensors).

    query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev]
    (2-D, 3-D or 4-D; 3-D means one head); attn_mask broadcastable to
    [..., Hq, L, S]: bool True = take part, float added; is_causal:
    top-left aligned (key j for query i iff j <= i), not with attn_mask;
    scale: None = 1/sqrt(E); enable_gqa: Hq a multiple of Hkv (else Hq must
    equal Hkv, as in PyTorch). dropout_p must be 0 (dhsa has no attention
    dropout). Returns [..., Hq, L, Ev] in query's dtype. A query row with no
    allowed key gives zeros (PyTorch: NaN).

    sparse: None (dense); a dhsa.Layout or dhsa.torch.TorchLayout made for
    these shapes; or router settings (a dict of dhsa.route() keywords such
    as {"density": 0.0625}, a dhsa.RouterParams, or a method name) to
    route this call, causal=is_causal, by the back end's router (route()).
    sparse_stats: a list; each routed call appends its layout's stats()
    dict (density, ...).

    backend: None (dhsa's C kernels for CPU tensors, PyTorch's kernels for
    tensors on any other device), "c" or "torch" (PyTorch's kernels on the
    CPU too); both give the same results (docs/torch.md, "Back ends")."""
    if dropout_p:
        raise ValueError("dropout_p = %r: dhsa's kernels have no attention dropout; pass 0 (as "
                         "Hugging Face models do in eval())" % (dropout_p,))
    nd = query.dim()
    if not 2 <= nd <= 4 or key.dim() != nd or value.dim() != nd:
        raise ValueError("query, key and value must all be 2-D, 3-D or 4-D ([B, H, L, E]), got "
                         "%d-D, %d-D and %d-D" % (nd, key.dim(), value.dim()))
    if attn_mask is not None and is_causal:
        raise RuntimeError("scaled_dot_product_attention: an explicit attn_mask must not be set "
                           "when is_causal=True (as in PyTorch)")
    q, k, v = _to4(query, nd), _to4(key, nd), _to4(value, nd)
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise RuntimeError("query has %d heads and key %d: pass enable_gqa=True for grouped-query "
                           "attention (as in PyTorch)" % (q.shape[1], k.shape[1]))
    kw = dict(causal=bool(is_causal), scale=scale)
    if attn_mask is not None:
        kw["attn_mask"] = _mask4(attn_mask, nd)
    lay = None
    try:
        if isinstance(sparse, dhsa.Layout) or _is_torch_layout(sparse):
            kw["sparse"] = sparse
        elif sparse is not None:
            lay = route(q, k, causal=bool(is_causal), sparse=sparse, backend=backend)
            if sparse_stats is not None:
                sparse_stats.append(lay.stats())
            kw["sparse"] = lay
        o = attention(q, k, v, backend=backend, **kw)
    finally:
        if lay is not None:
            lay.close()
    if nd == 4:
        return o
    return o[:, 0] if nd == 3 else o[0, 0]
