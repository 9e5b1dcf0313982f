"""_attention.py: dhsa.attention() and dhsa.workspace_size() over numpy
arrays, with PyTorch's mask conventions mapped onto dhsa_attn_desc.

Contract (details in docs/python.md):
  - q, k, v are passed to C as strided views: no copy, unless an array has a
    negative stride, a byte stride that is not a multiple of its item size,
    or is misaligned (then one C-contiguous copy of that array is made).
  - key_padding_mask (nn.MultiheadAttention): bool True = IGNORE the key
    -> key_mask with DHSA_MASK_TRUE_IGNORES; float -> added (key_bias).
  - attn_mask (F.scaled_dot_product_attention): bool True = TAKE PART,
    float = added; any shape that broadcasts to [B, Hq, Lq, Lk]. A mask that
    varies only over batch and keys ([B|1, 1, 1, Lk]) goes to the per-key
    slots (key_mask with DHSA_MASK_TRUE_KEEPS, or key_bias); anything else
    goes to the dense additive mask, a bool one converted to 0 / -inf
    float32 at the mask's own (unexpanded) shape.
  - The output is a new array in q's layout; float16 for float16 q, else
    float32. return_lse adds lse [B, Hq, Lq] float32.
  - sparse= (or layout= given a dhsa.Layout) sets desc.layout: each query
    row attends only to its block's key ranges; C checks that the layout
    was made for these B, Hkv, Lq, Lk. The layout is locked during the call.
Tested by python/tests/test_attention.py and test_masks.py (sparse= by test_route.py).
"""

import contextlib
import ctypes

import numpy as np

from . import _capi
from ._capi import check, lib
from ._context import resolve

_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1
_SIZE_MAX = 2**64 - 1

# ---------------------------------------------------------------- tensors ---


def _dhsa_type(name, a, bf16):
    dt = a.dtype
    if dt == np.float32:
        return _capi.DHSA_F32
    if dt == np.float16:
        return _capi.DHSA_F16
    if dt.name == "bfloat16" and dt.itemsize == 2:  # e.g. ml_dtypes.bfloat16
        return _capi.DHSA_BF16
    if dt == np.uint16:
        if bf16:
            return _capi.DHSA_BF16
        raise TypeError("%s is a uint16 array: pass dtype='bfloat16' to read it as bfloat16 bits"
                        % name)
    raise TypeError("%s has dtype %s: dhsa takes float32, float16, or bfloat16 bits in a uint16 "
                    "array with dtype='bfloat16' (convert explicitly, e.g. %s.astype(np.float32))"
                    % (name, dt, name))


def _passable(a):
    """True if a's memory can be described to C as-is: aligned, and every
    stride a non-negative multiple of the item size."""
    isz = a.itemsize
    return a.flags.aligned and all(s >= 0 and s % isz == 0 for s in a.strides)


def _tensor_view(name, a, layout, bf16=False):
    """(Tensor, array): the dhsa_tensor describing a (a 4-D array in layout
    "BHLD" or "BLHD") and the array it points into, which the caller keeps
    alive during the call. That array is a itself unless a cannot be passed
    by strides (see _passable), then a C-contiguous copy."""
    a = np.asarray(a)
    if a.ndim != 4:
        raise ValueError("%s must be 4-D, %s, got shape %s" % (
            name, "[B, H, L, D]" if layout == "BHLD" else "[B, L, H, D] (layout='BLHD')", a.shape))
    t = _dhsa_type(name, a, bf16)
    if not _passable(a):
        a = np.ascontiguousarray(a)
    isz = a.itemsize
    s = [x // isz for x in a.strides]
    if layout == "BHLD":
        shape, stride = a.shape, s
    else:  # BLHD: logical [B, H, L, D] is axes (0, 2, 1, 3) of the array
        shape = (a.shape[0], a.shape[2], a.shape[1], a.shape[3])
        stride = (s[0], s[2], s[1], s[3])
    tv = _capi.Tensor()
    tv.data = a.ctypes.data
    tv.type = t
    tv.shape[:] = [int(x) for x in shape]
    tv.stride[:] = [int(x) for x in stride]
    return tv, a


def _logical_shape(a, layout):
    return a.shape if layout == "BHLD" else (a.shape[0], a.shape[2], a.shape[1], a.shape[3])

# ------------------------------------------------------------------ masks ---


def _key_bytes(m):
    """A bool [b, Lk] mask as uint8 rows with unit key stride (a view when
    possible; bool and uint8 share the 0/1 byte representation)."""
    u = m.view(np.uint8)
    if u.strides[1] != 1 or u.strides[0] < 0:
        u = np.ascontiguousarray(u)
    return u


def _set_masks(desc, keep, key_padding_mask, attn_mask, B, Hq, Lq, Lk, query_only):
    """Fills the mask fields of desc from the PyTorch-named arguments;
    appends every array C will read to keep."""
    bool_terms = []   # ([b, Lk] bool, polarity)
    float_terms = []  # [b, Lk] floating, added
    dense = None      # [B|1, Hq|1, Lq|1, Lk|1] bool or floating

    if key_padding_mask is not None:
        m = np.asarray(key_padding_mask)
        if m.ndim != 2 or m.shape[0] not in (1, B) or m.shape[1] != Lk:
            raise ValueError("key_padding_mask must be [B, Lk] = [%d, %d] (or [1, %d]), got shape %s"
                             % (B, Lk, Lk, m.shape))
        if m.dtype == np.bool_:
            bool_terms.append((m, _capi.DHSA_MASK_TRUE_IGNORES))
        elif np.issubdtype(m.dtype, np.floating):
            float_terms.append(m)
        else:
            raise TypeError("key_padding_mask has dtype %s: use bool (True = ignore the key, as "
                            "nn.MultiheadAttention) or float (added to the scores)" % m.dtype)

    if attn_mask is not None:
        m = np.asarray(attn_mask)
        is_bool = m.dtype == np.bool_
        if not is_bool and not np.issubdtype(m.dtype, np.floating):
            raise TypeError("attn_mask has dtype %s: use bool (True = take part, as "
                            "F.scaled_dot_product_attention) or float (added to the scores)" % m.dtype)
        target = (B, Hq, Lq, Lk)
        if not 1 <= m.ndim <= 4:
            raise ValueError("attn_mask must have 1 to 4 dimensions broadcastable to "
                             "[B, Hq, Lq, Lk] = %s, got shape %s" % (list(target), m.shape))
        m4 = m.reshape((1,) * (4 - m.ndim) + m.shape)
        if any(n not in (1, t) for n, t in zip(m4.shape, target)):
            raise ValueError("attn_mask of shape %s does not broadcast to [B, Hq, Lq, Lk] = %s"
                             % (m.shape, list(target)))
        if m4.shape[1] == 1 and m4.shape[2] == 1:
            # The same for every head and query: a per-key mask or bias.
            per_key = np.broadcast_to(m4[:, 0, 0, :], (m4.shape[0], Lk))
            if is_bool:
                bool_terms.append((per_key, _capi.DHSA_MASK_TRUE_KEEPS))
            else:
                float_terms.append(per_key)
        else:
            dense = m4

    if len(bool_terms) == 1:
        m, pol = bool_terms[0]
        km = _key_bytes(m)
    elif len(bool_terms) == 2:
        # key_padding_mask and a per-key bool attn_mask: one keep-mask.
        kb = max(m.shape[0] for m, _ in bool_terms)
        km = np.ones((kb, Lk), dtype=np.bool_)
        for m, p in bool_terms:
            km &= m if p == _capi.DHSA_MASK_TRUE_KEEPS else ~m
        km = _key_bytes(km)
        pol = _capi.DHSA_MASK_TRUE_KEEPS
    if bool_terms:
        keep.append(km)
        desc.key_mask = km.ctypes.data
        desc.key_mask_batch_stride = km.strides[0] if km.shape[0] > 1 else 0
        desc.key_mask_polarity = pol

    if float_terms:
        f = float_terms[0]
        if not (len(float_terms) == 1 and f.dtype == np.float32 and f.strides[1] == 4
                and f.strides[0] >= 0 and f.strides[0] % 4 == 0 and f.flags.aligned):
            kb = max(t.shape[0] for t in float_terms)
            f = np.zeros((kb, Lk), dtype=np.float32)
            for t in float_terms:
                f += t
        keep.append(f)
        desc.key_bias = f.ctypes.data
        desc.key_bias_batch_stride = f.strides[0] // 4 if f.shape[0] > 1 else 0

    if dense is not None:
        if query_only:
            # The workspace does not depend on the mask's values: describe a
            # zero-stride placeholder instead of converting anything.
            f = np.zeros((1, 1, 1, 1), dtype=np.float32)
        elif dense.dtype == np.bool_:
            f = np.where(dense, np.float32(0.0), np.float32(-np.inf))
        elif dense.dtype == np.float32 and _passable(dense):
            f = dense
        else:
            f = dense.astype(np.float32)
        full = np.broadcast_to(f, (dense.shape[0], dense.shape[1], Lq, Lk))
        keep.append(f)
        tv = desc.attn_mask
        tv.data = full.ctypes.data
        tv.type = _capi.DHSA_F32
        tv.shape[:] = [int(x) for x in full.shape]
        tv.stride[:] = [int(x) // 4 for x in full.strides]

# ------------------------------------------------------------- descriptor ---


def _int64(name, x):
    v = int(x)
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise ValueError("%s = %d does not fit in int64" % (name, v))
    return v


def _split_layout(layout, sparse):
    """(tensor layout name, sparse Layout or None) from attention()'s layout=
    and sparse= arguments: layout= may be a dhsa.Layout, then it is the
    sparse layout and the tensors are BHLD."""
    from ._route import Layout  # here: _route imports this module
    if isinstance(layout, Layout):
        if sparse is not None:
            raise ValueError("a dhsa.Layout given both as layout= and sparse=: pass it once "
                             "(sparse=, with layout='BHLD' or 'BLHD' for the tensors)")
        layout, sparse = "BHLD", layout
    if sparse is not None and not isinstance(sparse, Layout):
        raise TypeError("sparse must be a dhsa.Layout (from dhsa.route(), KVIndex.route() or "
                        "Layout.empty()), not %s" % type(sparse).__name__)
    return layout, sparse


def _using(sparse):
    """Context manager yielding the C handle of a sparse layout (locked) or
    None."""
    return sparse._use() if sparse is not None else contextlib.nullcontext(None)


def _build(q, k, v, *, causal, scale, key_padding_mask, attn_mask, window, softcap, layout,
           backend, q_pos0, return_lse, dtype, check_finite, reference_max_bytes, query_only):
    """(desc, keep, o, lse): a filled dhsa_attn_desc (dense: its layout field
    is set by the caller), the arrays it points into, and the output arrays
    (lse None unless return_lse)."""
    if layout not in ("BHLD", "BLHD"):
        raise ValueError("layout must be 'BHLD' ([B, H, L, D]) or 'BLHD' ([B, L, H, D]) (or, in "
                         "attention(), a dhsa.Layout), not %r" % (layout,))
    if dtype not in (None, "bfloat16"):
        raise ValueError("dtype must be None or 'bfloat16' (uint16 arrays holding bfloat16 bits), "
                         "not %r" % (dtype,))
    bf16 = dtype == "bfloat16"
    desc = lib().dhsa_attn_default_desc()
    keep = []
    desc.q, qa = _tensor_view("q", q, layout, bf16)
    desc.k, ka = _tensor_view("k", k, layout, bf16)
    desc.v, va = _tensor_view("v", v, layout, bf16)
    keep += [qa, ka, va]
    B, Hq, Lq, _ = _logical_shape(qa, layout)
    Lk = _logical_shape(ka, layout)[2]
    dv = _logical_shape(va, layout)[3]

    odt = np.float16 if qa.dtype == np.float16 else np.float32
    oshape = (B, Hq, Lq, dv) if layout == "BHLD" else (B, Lq, Hq, dv)
    o = np.empty(oshape, dtype=odt)
    desc.o, _ = _tensor_view("o", o, layout)
    lse = None
    if return_lse:
        lse = np.empty((B, Hq, Lq), dtype=np.float32)
        desc.lse.data = lse.ctypes.data
        desc.lse.type = _capi.DHSA_F32
        desc.lse.shape[:] = [B, Hq, Lq, 1]
        desc.lse.stride[:] = [Hq * Lq, Lq, 1, 1]

    if scale is None:
        desc.scale = 0.0
    else:
        s = float(scale)
        if s == 0.0:
            raise ValueError("scale = 0 is not supported: the C API reads 0 as 'default "
                             "1/sqrt(d)'; pass scale=None for the default")
        desc.scale = s
    desc.softcap = float(softcap)
    desc.causal = 1 if causal else 0
    desc.q_pos0 = _int64("q_pos0", q_pos0)
    desc.window = _int64("window", window)
    if backend is None:
        desc.backend = _capi.DHSA_BACKEND_AUTO
    elif backend in _capi.BACKENDS:
        desc.backend = _capi.BACKENDS[backend]
    else:
        raise ValueError("backend must be None, 'auto', 'tiled' or 'reference', not %r" % (backend,))
    desc.check_finite = 1 if check_finite else 0
    rmb = 0 if reference_max_bytes is None else int(reference_max_bytes)
    if not 0 <= rmb <= _SIZE_MAX:
        raise ValueError("reference_max_bytes = %d is negative or too large" % rmb)
    desc.reference_max_bytes = rmb

    _set_masks(desc, keep, key_padding_mask, attn_mask, B, Hq, Lq, Lk, query_only)
    return desc, keep, o, lse

# ------------------------------------------------------------------- API ---


def attention(q, k, v, *, causal=False, scale=None, key_padding_mask=None, attn_mask=None,
              window=0, softcap=0.0, layout="BHLD", backend=None, q_pos0=0, return_lse=False,
              threads=None, ctx=None, dtype=None, check_finite=False, reference_max_bytes=None,
              sparse=None):
    """Scaled dot-product attention without an Lq x Lk matrix (tiled online
    softmax in C).

    q [B, Hq, Lq, d], k [B, Hkv, Lk, d], v [B, Hkv, Lk, dv] (layout="BHLD",
    PyTorch SDPA order) or [B, L, H, D] each (layout="BLHD", batch_first);
    Hq a multiple of Hkv (GQA/MQA, K/V not copied). float32 or float16
    arrays (mixing is allowed), or uint16 arrays of bfloat16 bits with
    dtype="bfloat16". Any non-negative strides are passed without a copy.

    causal: key j is kept for query i iff j <= q_pos0 + i (top-left aligned,
        like SDPA's is_causal when q_pos0 = 0; for a query block at the end
        of the keys, pass q_pos0 = Lk - Lq).
    scale: None = 1/sqrt(d). softcap > 0: s = softcap * tanh(s / softcap),
        before the masks are added. window > 0: keeps j > q_pos0 + i - window.
    key_padding_mask: [B, Lk] (or [1, Lk]); bool True = IGNORE the key
        (nn.MultiheadAttention); float = added to the scores.
    attn_mask: broadcastable to [B, Hq, Lq, Lk]; bool True = TAKE PART
        (F.scaled_dot_product_attention); float = added.
    backend: None/"auto" (tiled; env DHSA_ATTN may switch it), "tiled",
        "reference" (materialises scores in double: the test oracle).
    threads / ctx: which context runs the call (see dhsa.Context).
    check_finite: scan q, k, v for NaN/Inf first (DhsaError DHSA_ERR_NONFINITE).
    sparse: a dhsa.Layout (from dhsa.route(), KVIndex.route(), Layout.empty()):
        each query row attends only to the key ranges of its (batch, KV
        head, query block), every rule above still applied; cost follows
        the selected keys. It must have been made for these B, Hkv, Lq, Lk
        (else DhsaError DHSA_ERR_SHAPE). layout= also takes a dhsa.Layout
        (then the tensors are BHLD): attention(q, k, v, layout=lay).

    Returns o in q's layout ([B, Hq, Lq, dv] or [B, Lq, Hq, dv]), float16 if
    q is float16 else float32; with return_lse=True, (o, lse) where lse
    [B, Hq, Lq] float32 is the natural-log sum of exp of the scores. A query
    with no allowed key gets o = 0 and lse = -inf (PyTorch gives NaN).
    Errors found by C raise DhsaError ("DHSA_ERR_SHAPE: q has 6 heads, not a
    multiple of k's 4"); malformed Python arguments raise ValueError or
    TypeError before C is called.
    """
    layout, sparse = _split_layout(layout, sparse)
    desc, keep, o, lse = _build(
        q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask,
        attn_mask=attn_mask, window=window, softcap=softcap, layout=layout, backend=backend,
        q_pos0=q_pos0, return_lse=return_lse, dtype=dtype, check_finite=check_finite,
        reference_max_bytes=reference_max_bytes, query_only=False)
    c = resolve(ctx, threads)
    with c._lock, _using(sparse) as lay:
        desc.layout = lay
        check(lib().dhsa_attention(c._live_handle(), ctypes.byref(desc)))
    del keep  # the inputs C read stay alive until here
    return (o, lse) if return_lse else o


def workspace_size(q, k, v, *, causal=False, scale=None, key_padding_mask=None, attn_mask=None,
                   window=0, softcap=0.0, layout="BHLD", backend=None, q_pos0=0, return_lse=False,
                   threads=None, ctx=None, dtype=None, check_finite=False,
                   reference_max_bytes=None, sparse=None):
    """Exact bytes of workspace attention() with the same arguments would
    take from its context (dhsa_attn_workspace_size). The arguments are
    checked as attention() would; nothing is computed, and a dense bool
    attn_mask is not converted (only its shape matters). Outputs are not
    counted: they are numpy arrays, outside the context."""
    layout, sparse = _split_layout(layout, sparse)
    desc, keep, _, _ = _build(
        q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask,
        attn_mask=attn_mask, window=window, softcap=softcap, layout=layout, backend=backend,
        q_pos0=q_pos0, return_lse=return_lse, dtype=dtype, check_finite=False,
        reference_max_bytes=reference_max_bytes, query_only=True)
    c = resolve(ctx, threads)
    n = ctypes.c_size_t()
    with c._lock, _using(sparse) as lay:
        desc.layout = lay
        check(lib().dhsa_attn_workspace_size(c._live_handle(), ctypes.byref(desc), ctypes.byref(n)))
    del keep
    return int(n.value)


def backend_in_use(backend=None):
    """The backend name an attention call with this backend argument runs
    ("tiled" or "reference"), after the environment override DHSA_ATTN."""
    b = _capi.BACKENDS.get(backend if backend is not None else "auto")
    if b is None:
        raise ValueError("backend must be None, 'auto', 'tiled' or 'reference', not %r" % (backend,))
    L = lib()
    return L.dhsa_backend_name(L.dhsa_attn_resolve_backend(b)).decode("ascii")

# --------------------------------------------------------------- bfloat16 ---


def to_bfloat16(x):
    """float32 values -> uint16 bfloat16 bits, rounded to nearest even (NaN
    stays NaN). A new array."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def from_bfloat16(bits):
    """uint16 bfloat16 bits -> float32 values (exact). A new array."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError("from_bfloat16 takes a uint16 array, not %s" % b.dtype)
    return (b.astype(np.uint32) << 16).view(np.float32)
