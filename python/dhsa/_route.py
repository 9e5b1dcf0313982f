"""_route.py: DHSA routing and sparse layouts from Python: RouterParams,
route(), Layout, Predictor, KVIndex, synth() and fidelity(), over the
"Sparse layouts", "DHSA routing (prefill)", "DHSA at decode time" and
"Synthetic workloads and fidelity" sections of include/dhsa.h.

Ownership: a Layout or a KVIndex is allocated from a dhsa.Context and freed
through it. It keeps its context alive; close() (or the end of a `with`
block, or garbage collection) frees it; closing the context first closes
the objects allocated from it. A Predictor is not tied to a context.
Every object serialises its own calls with a lock; a context's lock is taken
before an object's (see _context.py).

Parameter checks are left to C wherever C has them, so the error is the
library's own sentence (DhsaError); Python raises TypeError / ValueError only
for arguments it must understand first (names, enum strings, integer types).
Tested by python/tests/test_route.py; documented in docs/python.md.
"""

import contextlib
import ctypes
import dataclasses
import itertools
import operator
import os
import threading
import weakref

import numpy as np

from . import _capi
from ._capi import check, lib
from ._context import resolve
from ._attention import _logical_shape, _tensor_view

_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1
_keys = itertools.count()


def _i64(name, x):
    """x as an int64 (a Python or numpy integer; floats and bools refused)."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("%s must be an integer, not a bool" % name)
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError("%s must be an integer, not %s" % (name, type(x).__name__)) from None
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise ValueError("%s = %d does not fit in int64" % (name, v))
    return v


def _u64(name, x):
    """x as a uint64 (an integer in [0, 2^64))."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("%s must be an integer, not a bool" % name)
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError("%s must be an integer, not %s" % (name, type(x).__name__)) from None
    if not 0 <= v < 2**64:
        raise ValueError("%s = %d: use 0 .. 2^64 - 1" % (name, v))
    return v


def _check_layout_name(layout):
    if layout not in ("BHLD", "BLHD"):
        raise ValueError("layout must be 'BHLD' ([B, H, L, D]) or 'BLHD' ([B, L, H, D]), not %r"
                         % (layout,))

# ------------------------------------------------------------ ownership ---


def _release(free_name, handle, ctx, key):
    getattr(lib(), free_name)(handle)
    if ctx is not None:
        ctx._disown(key)


class _Owned:
    """A C object freed by `free_name`; with ctx, allocated from it."""

    _what = "object"

    def _own(self, handle, free_name, ctx=None):
        self._lock = threading.Lock()
        self._handle = handle
        self._ctx = ctx
        key = next(_keys)
        self._fin = weakref.finalize(self, _release, free_name, handle, ctx, key)
        if ctx is not None:
            ctx._adopt(key, self._lock, self._fin)

    @property
    def closed(self):
        return not self._fin.alive

    def close(self):
        """Frees the C object. Idempotent."""
        with self._lock:
            self._fin()

    def __enter__(self):
        if self.closed:
            raise ValueError("this dhsa.%s is closed" % self._what)
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @contextlib.contextmanager
    def _use(self):
        """Holds the object's lock and yields the live C handle."""
        with self._lock:
            if not self._fin.alive:
                gone = self._ctx is not None and self._ctx.closed
                why = " (its context was closed)" if gone else ""
                raise ValueError("this dhsa.%s is closed%s" % (self._what, why))
            yield self._handle

# ----------------------------------------------------------- predictor ---


class Predictor:
    """The learned DHSA boundary predictor (dhsa_predictor; file format in
    docs/predictor.md). Pass it as route(..., boundary=predictor).

    Predictor.load(path), Predictor.from_bytes(data),
    Predictor.random(C, w=4, hidden=256, seed=0); .save(path),
    .score(k, b=0) -> boundary probabilities, .width (C = Hkv * d),
    .window (w), .close()."""

    _what = "Predictor"

    def __init__(self, _handle):
        if not isinstance(_handle, int) or not _handle:
            raise TypeError("make a Predictor with Predictor.load(), .from_bytes() or .random()")
        _Owned._own(self, _handle, "dhsa_predictor_free")

    closed = _Owned.closed
    close = _Owned.close
    __enter__ = _Owned.__enter__
    __exit__ = _Owned.__exit__
    _use = _Owned._use

    @classmethod
    def load(cls, path):
        """Reads a predictor file (sizes, finiteness and CRC checked by C)."""
        h = ctypes.c_void_p()
        check(lib().dhsa_predictor_load(os.fsencode(path), ctypes.byref(h)))
        return cls(h.value)

    @classmethod
    def from_bytes(cls, data):
        """A predictor from the bytes of a predictor file."""
        buf = bytes(data)
        h = ctypes.c_void_p()
        check(lib().dhsa_predictor_load_memory(buf, len(buf), ctypes.byref(h)))
        return cls(h.value)

    @classmethod
    def random(cls, C, w=4, hidden=256, seed=0):
        """Random weights (Xavier-like, deterministic for a seed) for C
        features per token (C = Hkv * d), a window of 2w tokens, and `hidden`
        MLP units."""
        h = ctypes.c_void_p()
        check(lib().dhsa_predictor_create_random(_i64("C", C), _i64("w", w), _i64("hidden", hidden),
                                                 _u64("seed", seed), ctypes.byref(h)))
        return cls(h.value)

    def save(self, path):
        """Writes the predictor file (with its CRC)."""
        with self._use() as h:
            check(lib().dhsa_predictor_save(h, os.fsencode(path)))

    @property
    def width(self):
        """C, the features per token it reads (KV heads x head dim)."""
        with self._use() as h:
            return int(lib().dhsa_predictor_width(h))

    @property
    def window(self):
        """w: it reads 2w tokens around each candidate boundary."""
        with self._use() as h:
            return int(lib().dhsa_predictor_window(h))

    def score(self, k, b=0, *, layout="BHLD", ctx=None, threads=None):
        """Boundary probabilities p [L] (float32) for batch b of the keys
        k [B, Hkv, L, d] (or [B, L, Hkv, d] with layout="BLHD");
        Hkv * d must equal .width; p[0] = 0."""
        _check_layout_name(layout)
        kt, ka = _tensor_view("k", k, layout)
        L = int(kt.shape[2])
        p = np.zeros(L, dtype=np.float32)
        c = resolve(ctx, threads)
        with c._lock, self._use() as h:
            check(lib().dhsa_predictor_score(c._live_handle(), h, ctypes.byref(kt), _i64("b", b),
                                             p.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        del ka
        return p

    def __repr__(self):
        if self.closed:
            return "<dhsa.Predictor closed>"
        return "<dhsa.Predictor C=%d w=%d>" % (self.width, self.window)

# -------------------------------------------------------- router params ---


_METHODS = {"dhsa": _capi.DHSA_ROUTE_DHSA, "block": _capi.DHSA_ROUTE_DHSA,
            "stream": _capi.DHSA_ROUTE_STREAM, "oracle": _capi.DHSA_ROUTE_ORACLE}
_BOUNDARIES = {"fixed": _capi.DHSA_BOUNDARY_FIXED, "similarity": _capi.DHSA_BOUNDARY_SIMILARITY}
_SCORES = {"pooled": _capi.DHSA_SCORE_POOLED, "moments": _capi.DHSA_SCORE_MOMENTS,
           "heads": _capi.DHSA_SCORE_HEADS, "bound": _capi.DHSA_SCORE_BOUND,
           "rows": _capi.DHSA_SCORE_ROWS}


@dataclasses.dataclass
class RouterParams:
    """dhsa_router_params with Python names; the defaults are the C
    defaults (dhsa_router_default_params).

    method: "dhsa" (chunks scored by pooled q.k), "block" (= "dhsa" with
        fixed boundaries of `chunk` keys: the block-sparse baseline, as the
        CLI's --method block), "stream" (sinks + recent keys), "oracle"
        (chunks ranked by true attention mass: a dense pass, evaluation only).
    boundary: None (similarity; fixed for method "block"), "similarity",
        "fixed", or a dhsa.Predictor (learned boundaries).
    budget: keys per query block (sinks and local included); None or 0 =
        use density (share of the keys each block may see).
    sink, local: sink_tokens, local_tokens; with scale_fixed (default)
        each block reads at most budget / 8 sinks (at least one) and
        budget / 4 local keys.
    score: "moments" (default), "pooled", "heads", "bound" or "rows": the
        DHSA chunk score (include/dhsa.h, dhsa_chunk_score); score_rows: the
        rows "rows" scores per block and head (0 = all); sink_window: > sink
        picks the sink keys among the first sink_window by the block's mean
        query (0 = the first `sink` keys).
    carry: a session's decode step reads again the chunks that held at
        least this share of the previous step's attention (0 = off; 0.1 in
        for_length). Only sessions apply it; route() sees one call.
    exact_rows: a session's eval of more than one token ranks the chunks for
        its last exact_rows rows by their exact attention mass (0 = off; 64
        in for_length). Only sessions apply it.
    rest: n > 0 = in layers n - 1 and after, a session's eval of more than
        one token also attends every earlier chunk a block left out as one
        summary (mean key and value, weighed by its key count; 0 = off).
        REST_HYBRID (-1; for_length's below 32K): in the global layers of a
        model that interleaves sliding-window layers (gemma-2/3), off in
        others; for_length gives REST_LONG (3: layers 2 and after, every
        model) from 32K.
        Only sessions apply it.
    hybrid_max_chunk: n > 0 = a session on a model that interleaves
        sliding-window layers cuts its chunks at most n keys long (max_chunk
        lowered to n, min_chunk to at most that; 0 = off; 16 in for_length).
        Only sessions apply it.
    RouterParams.for_length(n, density): the routing every entry point runs
        by default for n tokens (dhsa_router_params_for; sessions get it
        for their context unless given other router params).
    Other names as in C.
    """
    method: str = "dhsa"
    boundary: object = None
    learned_threshold: float = 0.5
    chunk: int = 64
    sim_window: int = 8
    threshold: float = 1.0
    nms_window: int = 8
    min_chunk: int = 16
    max_chunk: int = 256
    causal_boundaries: bool = False
    q_block: int = 64
    budget: object = None
    density: float = 0.0625
    sink: int = 64
    local: int = 256
    dense_below: int = 2048
    share_heads: bool = False
    score: str = "moments"
    scale_fixed: bool = True
    score_rows: int = 0
    sink_window: int = 0
    carry: float = 0.0
    exact_rows: int = 0
    rest: int = 0
    hybrid_max_chunk: int = 0

    @classmethod
    def for_length(cls, n, density=0.0625):
        """dhsa_router_params_for(n, density) as a RouterParams."""
        c = _capi.lib().dhsa_router_params_for(_i64("n", n), float(density))
        names = {v: k for k, v in _SCORES.items()}
        return cls(method="dhsa", boundary=None, learned_threshold=c.learned_threshold, chunk=c.chunk,
                   sim_window=c.sim_window, threshold=c.threshold, nms_window=c.nms_window,
                   min_chunk=c.min_chunk, max_chunk=c.max_chunk, causal_boundaries=bool(c.causal_boundaries),
                   q_block=c.q_block, budget=None, density=c.density, sink=c.sink_tokens,
                   local=c.local_tokens, dense_below=c.dense_below, share_heads=bool(c.share_heads),
                   score=names[c.score_mode], scale_fixed=bool(c.scale_fixed), score_rows=c.score_rows,
                   sink_window=c.sink_window, carry=c.carry, exact_rows=c.exact_rows,
                   rest=c.rest, hybrid_max_chunk=c.hybrid_max_chunk)

    def to_c(self):
        """(the _capi.RouterParams struct, the Predictor or None). Keep the
        predictor alive (and locked, see route()) while C uses the struct."""
        if self.method not in _METHODS:
            raise ValueError("method must be 'dhsa', 'block', 'stream' or 'oracle', not %r"
                             % (self.method,))
        rp = _capi.RouterParams()
        rp.method = _METHODS[self.method]
        pred = None
        b = self.boundary
        if isinstance(b, Predictor):
            if self.method == "block":
                raise ValueError("method='block' means fixed boundaries; it takes no predictor")
            pred = b
            rp.boundary = _capi.DHSA_BOUNDARY_LEARNED
        elif b is None:
            rp.boundary = _capi.DHSA_BOUNDARY_FIXED if self.method == "block" \
                else _capi.DHSA_BOUNDARY_SIMILARITY
        elif isinstance(b, str) and b in _BOUNDARIES:
            if self.method == "block" and b != "fixed":
                raise ValueError("method='block' means fixed boundaries, not %r" % (b,))
            rp.boundary = _BOUNDARIES[b]
        else:
            raise ValueError("boundary must be None, 'similarity', 'fixed' or a dhsa.Predictor, "
                             "not %r" % (b,))
        rp.learned_threshold = float(self.learned_threshold)
        for name in ("chunk", "sim_window", "nms_window", "min_chunk", "max_chunk", "q_block",
                     "dense_below"):
            setattr(rp, name, _i64(name, getattr(self, name)))
        rp.threshold = float(self.threshold)
        rp.causal_boundaries = 1 if self.causal_boundaries else 0
        rp.budget_tokens = 0 if self.budget is None else _i64("budget", self.budget)
        rp.density = float(self.density)
        rp.sink_tokens = _i64("sink", self.sink)
        rp.local_tokens = _i64("local", self.local)
        rp.share_heads = 1 if self.share_heads else 0
        if self.score not in _SCORES:
            raise ValueError("score must be one of %s, not %r" % (", ".join(sorted(_SCORES)), self.score))
        rp.score_mode = _SCORES[self.score]
        rp.scale_fixed = 1 if self.scale_fixed else 0
        rp.score_rows = _i64("score_rows", self.score_rows)
        rp.sink_window = _i64("sink_window", self.sink_window)
        rp.carry = float(self.carry)
        rp.exact_rows = _i64("exact_rows", self.exact_rows)
        rp.rest = _i64("rest", self.rest)
        rp.hybrid_max_chunk = _i64("hybrid_max_chunk", self.hybrid_max_chunk)
        return rp, pred


REST_HYBRID = -1  # RouterParams.rest: include/dhsa/route.h DHSA_REST_HYBRID
REST_LONG = 3  # RouterParams.rest from 32K: include/dhsa/route.h DHSA_REST_LONG

_PARAM_NAMES = frozenset(f.name for f in dataclasses.fields(RouterParams))


def _router_params(params, kwargs, where):
    """RouterParams from params= (or the defaults) with kwargs replacing
    fields; unknown names raise TypeError."""
    bad = sorted(set(kwargs) - _PARAM_NAMES)
    if bad:
        raise TypeError("%s got unexpected keyword argument%s %s (router parameters are: %s)"
                        % (where, "s" if len(bad) > 1 else "", ", ".join(map(repr, bad)),
                           ", ".join(f.name for f in dataclasses.fields(RouterParams))))
    if params is None:
        params = RouterParams()
    elif not isinstance(params, RouterParams):
        raise TypeError("params must be a dhsa.RouterParams, not %s" % type(params).__name__)
    return dataclasses.replace(params, **kwargs) if kwargs else params


@contextlib.contextmanager
def _c_params(params):
    """Yields the C struct, with the predictor (if any) locked and set."""
    rp, pred = params.to_c()
    if pred is None:
        yield rp
    else:
        with pred._use() as h:
            rp.predictor = h
            yield rp

# --------------------------------------------------------------- layout ---


def layout_size(B, Hkv, Lq, Lk, q_block, max_ranges):
    """Exact bytes a layout of these sizes takes from its context
    (dhsa_layout_size)."""
    n = ctypes.c_size_t()
    check(lib().dhsa_layout_size(_i64("B", B), _i64("Hkv", Hkv), _i64("Lq", Lq), _i64("Lk", Lk),
                                 _i64("q_block", q_block), _i64("max_ranges", max_ranges),
                                 ctypes.byref(n)))
    return int(n.value)


_STAT_FIELDS = [f for f, _ in _capi.LayoutStats._fields_]


class Layout:
    """A sparse layout (dhsa_layout): for each (batch b, KV head g, query
    block qb of q_block rows) a sorted list of disjoint key ranges
    [start, end). Made by route(), KVIndex.route() or Layout.empty(); used
    by attention(..., sparse=layout). Freed by close(), the end of a `with`
    block, garbage collection, or closing its context.

    Attributes (fixed at creation): B, Hkv, Lq, Lk, q_block, n_blocks,
    max_ranges, ctx."""

    _what = "Layout"

    def __init__(self, _handle, _ctx):
        if not isinstance(_handle, int) or not _handle:
            raise TypeError("make a Layout with dhsa.route(), KVIndex.route() or Layout.empty()")
        _Owned._own(self, _handle, "dhsa_layout_free", _ctx)
        st = self._raw_stats()
        self.B, self.Hkv, self.Lq, self.Lk = int(st.B), int(st.Hkv), int(st.Lq), int(st.Lk)
        self.q_block, self.n_blocks = int(st.q_block), int(st.n_blocks)
        self.max_ranges = int(st.max_ranges)

    closed = _Owned.closed
    close = _Owned.close
    __enter__ = _Owned.__enter__
    __exit__ = _Owned.__exit__
    _use = _Owned._use

    @property
    def ctx(self):
        """The dhsa.Context the layout is allocated from."""
        return self._ctx

    @classmethod
    def empty(cls, B, Hkv, Lq, Lk, q_block, max_ranges, *, ctx=None, threads=None):
        """A layout in which every block selects nothing (fill it with
        .set()); layout_size(...) bytes from the context."""
        c = resolve(ctx, threads)
        h = ctypes.c_void_p()
        with c._lock:
            check(lib().dhsa_layout_create(
                c._live_handle(), _i64("B", B), _i64("Hkv", Hkv), _i64("Lq", Lq), _i64("Lk", Lk),
                _i64("q_block", q_block), _i64("max_ranges", max_ranges), ctypes.byref(h)))
            return cls(h.value, c)

    def set(self, b, g, qb, ranges):
        """Sets the ranges of block (b, g, qb): `ranges` is [n, 2] integers
        (start, end) (any order; overlapping or adjacent ranges are merged
        by C), n may be 0. Checked against [0, Lk) and max_ranges by C; on
        error the block is unchanged."""
        r = np.asarray(ranges)
        if r.size == 0:
            r = np.zeros((0, 2), dtype=np.int64)
        if r.ndim != 2 or r.shape[1] != 2:
            raise ValueError("ranges must be [n, 2] (start, end) pairs, got shape %s" % (r.shape,))
        if not np.issubdtype(r.dtype, np.integer):
            raise TypeError("ranges must be integers, not %s" % r.dtype)
        r = np.ascontiguousarray(r, dtype=np.int64)
        with self._use() as h:
            check(lib().dhsa_layout_set(h, _i64("b", b), _i64("g", g), _i64("qb", qb),
                                        r.ctypes.data if len(r) else None, len(r)))

    def ranges(self, b, g, qb):
        """The ranges of block (b, g, qb): a new int64 array [n, 2] of
        (start, end), sorted and disjoint."""
        ptr = ctypes.POINTER(ctypes.c_int64)()
        n = ctypes.c_int64()
        with self._use() as h:
            check(lib().dhsa_layout_get(h, _i64("b", b), _i64("g", g), _i64("qb", qb),
                                        ctypes.byref(ptr), ctypes.byref(n)))
            if n.value == 0:
                return np.zeros((0, 2), dtype=np.int64)
            return np.ctypeslib.as_array(ptr, shape=(n.value, 2)).copy()

    def selects(self, b, g, row, key):
        """Whether query row `row` of (b, g) may attend to `key` under the
        layout (its block's ranges; causality and window not applied)."""
        with self._use() as h:
            r = lib().dhsa_layout_selects(h, _i64("b", b), _i64("g", g), _i64("row", row),
                                          _i64("key", key))
        if r < 0:
            check(r)
        return bool(r)

    def _raw_stats(self):
        st = _capi.LayoutStats()
        with self._use() as h:
            check(lib().dhsa_layout_get_stats(h, ctypes.byref(st)))
        return st

    def stats(self):
        """dhsa_layout_stats as a dict: B, Hkv, Lq, Lk, q_block, n_blocks,
        max_ranges, q_pos0, causal (bool), window, selected, available,
        density (selected / available over every (b, g, row), counting the
        keys each row may see under the causal/window/q_pos0 the layout was
        routed for; every key for a hand-made layout), ranges, dense_blocks,
        chunks, chunk_mean, chunk_min, chunk_max (routing chunks; 0 if made
        by hand)."""
        st = self._raw_stats()
        out = {}
        for f in _STAT_FIELDS:
            v = getattr(st, f)
            out[f] = bool(v) if f == "causal" else (float(v) if isinstance(v, float) else int(v))
        return out

    def __repr__(self):
        if self.closed:
            return "<dhsa.Layout closed>"
        return "<dhsa.Layout B=%d Hkv=%d Lq=%d Lk=%d q_block=%d density=%.4f>" % (
            self.B, self.Hkv, self.Lq, self.Lk, self.q_block, self.stats()["density"])

# -------------------------------------------------------------- routing ---


def _qk_desc(q, k, layout, causal, window, q_pos0):
    """A descriptor with q, k and the position rules set (what the router
    reads), and the arrays it points into."""
    _check_layout_name(layout)
    desc = lib().dhsa_attn_default_desc()
    desc.q, qa = _tensor_view("q", q, layout)
    desc.k, ka = _tensor_view("k", k, layout)
    desc.causal = 1 if causal else 0
    desc.window = _i64("window", window)
    desc.q_pos0 = _i64("q_pos0", q_pos0)
    return desc, (qa, ka)


def route(q, k, *, causal=True, window=0, q_pos0=0, layout="BHLD", params=None, ctx=None,
          threads=None, **router):
    """DHSA routing of one layer (dhsa_route): a Layout for attention of q
    [B, Hq, Lq, d] over k [B, Hkv, Lk, d] (post-RoPE; layout="BLHD" for
    [B, L, H, D]) under causal / window / q_pos0 (as in attention()).

    Router parameters: params=RouterParams(...), and/or keywords that
    replace its fields: method="dhsa"|"block"|"stream"|"oracle",
    boundary=None|"similarity"|"fixed"|Predictor, density=0.0625,
    budget=None, q_block=64, sink=64, local=256, dense_below=2048,
    chunk=64, min_chunk=16, max_chunk=256, nms_window=8, sim_window=8,
    threshold=1.0, learned_threshold=0.5, causal_boundaries=False,
    share_heads=False. The layout is allocated from the context the call
    runs on (ctx= / threads= / the current one). Masks are not seen by the
    router (attention applies them)."""
    p = _router_params(params, router, "route()")
    desc, keep = _qk_desc(q, k, layout, causal, window, q_pos0)
    c = resolve(ctx, threads)
    h = ctypes.c_void_p()
    with c._lock, _c_params(p) as rp:
        check(lib().dhsa_route(c._live_handle(), ctypes.byref(rp), ctypes.byref(desc),
                               ctypes.byref(h)))
        lay = Layout(h.value, c)
    del keep
    return lay


def route_sizes(q, k, *, causal=True, window=0, q_pos0=0, layout="BHLD", params=None, ctx=None,
                threads=None, **router):
    """(layout_bytes, workspace_bytes) that route() with the same arguments
    takes from its context (dhsa_route_sizes); checks the parameters."""
    p = _router_params(params, router, "route_sizes()")
    desc, keep = _qk_desc(q, k, layout, causal, window, q_pos0)
    c = resolve(ctx, threads)
    lb, wb = ctypes.c_size_t(), ctypes.c_size_t()
    with c._lock, _c_params(p) as rp:
        check(lib().dhsa_route_sizes(c._live_handle(), ctypes.byref(rp), ctypes.byref(desc),
                                     ctypes.byref(lb), ctypes.byref(wb)))
    del keep
    return int(lb.value), int(wb.value)

# ------------------------------------------------------------ KV index ---


class KVIndex:
    """DHSA at decode time (dhsa_kv_index): an index beside one sequence's
    KV cache. KVIndex(Hkv, d, capacity, *, params=None, ctx=None, **router)
    with router keywords as for route() (boundary "similarity", "fixed" or a
    dhsa.Predictor, always in the causal form; method "dhsa" or "block"). A
    predictor scores each key once as it is appended; it must stay open
    while keys are appended (append raises ValueError once it is closed).

    .append(k_new) adds keys [1, Hkv, n, d] (or [1, n, Hkv, d] with
    layout="BLHD") at positions length .. length + n - 1; .length;
    .chunks() the first positions of the closed chunks; .route(q, k_cache,
    q_pos0) a Layout for the queries. Memory from the context; freed by
    close() (or `with`, garbage collection, closing the context)."""

    _what = "KVIndex"

    def __init__(self, Hkv, d, capacity, *, params=None, ctx=None, threads=None, **router):
        p = _router_params(params, router, "KVIndex()")
        c = resolve(ctx, threads)
        h = ctypes.c_void_p()
        with c._lock, _c_params(p) as rp:
            check(lib().dhsa_kv_index_create(c._live_handle(), ctypes.byref(rp), _i64("Hkv", Hkv),
                                             _i64("d", d), _i64("capacity", capacity),
                                             ctypes.byref(h)))
            _Owned._own(self, h.value, "dhsa_kv_index_free", c)
        self.Hkv, self.d, self.capacity = int(Hkv), int(d), int(capacity)
        self.params = p
        # C keeps the predictor's pointer and runs it on every append
        self._pred = p.boundary if isinstance(p.boundary, Predictor) else None

    closed = _Owned.closed
    close = _Owned.close
    __enter__ = _Owned.__enter__
    __exit__ = _Owned.__exit__
    _use = _Owned._use

    @property
    def ctx(self):
        return self._ctx

    def append(self, k_new, *, layout="BHLD"):
        """Appends keys k_new [1, Hkv, n, d] (layout="BHLD") or [1, n, Hkv, d]
        ("BLHD"); float32 / float16 / bfloat16, any strides."""
        _check_layout_name(layout)
        kt, ka = _tensor_view("k_new", k_new, layout)
        pred = self._pred._use() if self._pred is not None else contextlib.nullcontext()
        with self._use() as h, pred:
            check(lib().dhsa_kv_index_append(h, ctypes.byref(kt)))
        del ka

    @property
    def length(self):
        """Keys appended so far."""
        with self._use() as h:
            return int(lib().dhsa_kv_index_length(h))

    def __len__(self):
        return self.length

    def chunks(self):
        """First positions of the closed chunks (int64 array); the open tail
        starts where the last closed chunk ends (the next boundary)."""
        ptr = ctypes.POINTER(ctypes.c_int64)()
        with self._use() as h:
            n = int(lib().dhsa_kv_index_chunks(h, ctypes.byref(ptr)))
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def bounds(self):
        """The closed chunks' bounds (int64 array of n + 1: chunk c is
        [bounds[c], bounds[c + 1]); the open tail starts at bounds[n]),
        the chunks a session summarises."""
        ptr = ctypes.POINTER(ctypes.c_int64)()
        with self._use() as h:
            n = int(lib().dhsa_kv_index_chunks(h, ctypes.byref(ptr)))
            return np.ctypeslib.as_array(ptr, shape=(n + 1,)).copy()

    def route(self, q, k_cache, q_pos0=None, *, window=0, layout="BHLD", ctx=None, threads=None,
              exact=False, keep=None, scale=None, softcap=0.0):
        """A Layout for causal attention of q [1, Hq, Lq, d] at positions
        q_pos0 .. (None = length - Lq: the newest Lq positions) over the
        cache k_cache [1, Hkv, length, d] the index describes. Allocated
        from ctx (default: the index's context). exact=True ranks each
        block's chunks by the exact attention mass its rows put on them
        (dhsa_kv_index_route_exact: what a session runs for a prompt's
        last exact_rows rows and its first decode step; reads every key
        those rows may see), with the scale (None = 1/sqrt(d)) and softcap
        the attention will apply. keep: the chunks the previous decode step carries (carry()'s
        [Hkv, DHSA_CARRY_MAX] array, -1 = none), ranked before every
        other candidate of their KV head (dhsa_kv_index_route_keep: what
        a session runs for a decode step)."""
        _check_layout_name(layout)
        if exact and keep is not None:
            raise ValueError("KVIndex.route: exact=True and keep= together (a session ranks a "
                             "prompt's last rows exactly and carries chunks between decode steps)")
        if q_pos0 is None:
            q_pos0 = self.length - _logical_shape(np.asarray(q), layout)[2]
        desc, hold = _qk_desc(q, k_cache, layout, True, window, q_pos0)
        if scale is not None:
            if float(scale) <= 0:
                raise ValueError("scale must be > 0 (None = 1/sqrt(d)), not %r" % (scale,))
            desc.scale = float(scale)
        desc.softcap = float(softcap)
        kp = None
        if keep is not None:
            kp = np.ascontiguousarray(np.asarray(keep), dtype=np.int64)
            if kp.shape != (self.Hkv, _capi.DHSA_CARRY_MAX):
                raise ValueError("keep must be [Hkv, %d] = [%d, %d] (carry()'s array), got shape %s"
                                 % (_capi.DHSA_CARRY_MAX, self.Hkv, _capi.DHSA_CARRY_MAX, kp.shape))
        c = self._ctx if ctx is None and threads is None else resolve(ctx, threads)
        out = ctypes.c_void_p()
        with c._lock, self._use() as h:
            if kp is not None:
                check(lib().dhsa_kv_index_route_keep(
                    c._live_handle(), h, ctypes.byref(desc),
                    kp.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), ctypes.byref(out)))
            else:
                fn = lib().dhsa_kv_index_route_exact if exact else lib().dhsa_kv_index_route
                check(fn(c._live_handle(), h, ctypes.byref(desc), ctypes.byref(out)))
            lay = Layout(out.value, c)
        del hold
        return lay

    def carry(self, q, k_cache, lay, share, *, scale=None, softcap=0.0, attn_mask=None,
              key_padding_mask=None, layout="BHLD"):
        """The chunks a decode step hands the next (dhsa_kv_index_carry):
        for one row q [1, Hq, 1, d] at the newest position that attended
        k_cache (the index's cache) through the Layout lay, with scale
        (None = 1/sqrt(d)), softcap and masks as that attention applied
        them (attn_mask / key_padding_mask as in attention(), per key), the
        index's closed chunks that held at least `share` of the row's
        attention (mean over each KV head's query heads): an int64 array
        [Hkv, DHSA_CARRY_MAX], largest share first, -1 after. Pass it to
        the next step's route(keep=)."""
        from ._attention import _set_masks
        if not isinstance(lay, Layout):
            raise TypeError("lay must be a dhsa.Layout, not %s" % type(lay).__name__)
        desc, hold = _qk_desc(q, k_cache, layout, True, 0, self.length - 1)
        hold = list(hold)
        if scale is not None:
            if float(scale) <= 0:
                raise ValueError("scale must be > 0 (None = 1/sqrt(d)), not %r" % (scale,))
            desc.scale = float(scale)
        desc.softcap = float(softcap)
        B, Hq, Lq, _ = _logical_shape(np.asarray(q), layout)
        _set_masks(desc, hold, key_padding_mask, attn_mask, B, Hq, Lq, self.length, False)
        out = np.full((self.Hkv, _capi.DHSA_CARRY_MAX), -1, dtype=np.int64)
        with self._use() as h, lay._use() as lh:
            check(lib().dhsa_kv_index_carry(h, ctypes.byref(desc), lh, float(share),
                                            out.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))))
        del hold
        return out

    def __repr__(self):
        if self.closed:
            return "<dhsa.KVIndex closed>"
        return "<dhsa.KVIndex Hkv=%d d=%d length=%d/%d chunks=%d>" % (
            self.Hkv, self.d, self.length, self.capacity, len(self.chunks()))

# ----------------------------------------------------- synth, fidelity ---


def synth(L, Hq=8, Hkv=2, d=128, seed=1, *, B=1, seg_min=32, seg_max=512,
          depths=(0.1, 0.35, 0.6, 0.85), needle_len=16, q_block=64):
    """The synthetic workload of dhsa_synth_generate: (q, k, v, needles)
    with q [B, Hq, L, d], k and v [B, Hkv, L, d] float32 (BHLD) and needles
    a list of dicts {key, len, row, rows}: the passage [key, key + len) is
    asked for by query rows [row, row + rows). depths: one needle per entry
    (at depth * L), at most 64. Deterministic for a seed."""
    depths = [float(x) for x in depths]
    if len(depths) > _capi.DHSA_SYNTH_MAX_NEEDLES:
        raise ValueError("%d depths: at most %d needles"
                         % (len(depths), _capi.DHSA_SYNTH_MAX_NEEDLES))
    sp = lib().dhsa_synth_default_params()
    for name, v in (("B", B), ("Hq", Hq), ("Hkv", Hkv), ("L", L), ("d", d), ("seg_min", seg_min),
                    ("seg_max", seg_max), ("needle_len", needle_len), ("q_block", q_block)):
        setattr(sp, name, _i64(name, v))
    sp.seed = _u64("seed", seed)
    sp.n_needles = len(depths)
    for i in range(_capi.DHSA_SYNTH_MAX_NEEDLES):
        sp.depths[i] = depths[i] if i < len(depths) else 0.0
    needles = (_capi.SynthNeedle * max(1, len(depths)))()
    if min(sp.B, sp.Hq, sp.Hkv, sp.L, sp.d) < 1 or sp.d > 65536 or sp.L > 2**34:
        # C refuses these sizes before writing anything: let it say so (with
        # placeholders, not buffers of a meaningless size)
        x = np.zeros(1, dtype=np.float32)
        check(lib().dhsa_synth_generate(ctypes.byref(sp), x.ctypes.data, x.ctypes.data,
                                        x.ctypes.data, needles))
        raise ValueError("synthetic sizes B=%d Hq=%d Hkv=%d L=%d d=%d" % (B, Hq, Hkv, L, d))
    shapes = [(sp.B, sp.Hq, sp.L, sp.d), (sp.B, sp.Hkv, sp.L, sp.d), (sp.B, sp.Hkv, sp.L, sp.d)]
    q, k, v = (np.empty(s, dtype=np.float32) for s in shapes)
    check(lib().dhsa_synth_generate(ctypes.byref(sp), q.ctypes.data, k.ctypes.data, v.ctypes.data,
                                    needles))
    out = [{"key": int(n.key), "len": int(n.len), "row": int(n.row), "rows": int(n.rows)}
           for n in needles[:len(depths)]]
    return q, k, v, out


def _f32_view(name, a, layout, lse):
    """A float32 Tensor for an o ([B, H, L, dv] in `layout`) or lse ([B, H, L]
    or [B, H, L, 1]) array, converting other float dtypes."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError("%s has dtype %s: a float array is needed" % (name, a.dtype))
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    if lse:
        if a.ndim == 3:
            a = a[..., None]
        if a.ndim != 4 or a.shape[3] != 1:
            raise ValueError("%s must be [B, H, L] (as attention(return_lse=True) gives) or "
                             "[B, H, L, 1], got shape %s" % (name, a.shape))
        return _tensor_view(name, a, "BHLD")
    return _tensor_view(name, a, layout)


def fidelity(o_dense, lse_dense, o_sparse, lse_sparse, *, layout="BHLD"):
    """Compares a sparse attention result with the dense one
    (dhsa_fidelity_compare): o arrays [B, H, L, dv] (or [B, L, H, dv] with
    layout="BLHD") and lse [B, H, L], from attention(..., return_lse=True)
    without and with a layout. Returns a dict: recall (mean over rows and
    heads of the dense softmax mass on the keys the sparse call attended to,
    exp(lse_sparse - lse_dense)), recall_min (worst row), rel_err
    (||o_sparse - o_dense||_F / ||o_dense||_F), rows (rows counted: those
    with an allowed key)."""
    _check_layout_name(layout)
    od, a1 = _f32_view("o_dense", o_dense, layout, False)
    ld, a2 = _f32_view("lse_dense", lse_dense, layout, True)
    os_, a3 = _f32_view("o_sparse", o_sparse, layout, False)
    ls, a4 = _f32_view("lse_sparse", lse_sparse, layout, True)
    f = _capi.Fidelity()
    check(lib().dhsa_fidelity_compare(ctypes.byref(od), ctypes.byref(ld), ctypes.byref(os_),
                                      ctypes.byref(ls), ctypes.byref(f)))
    del a1, a2, a3, a4
    return {"recall": float(f.recall), "recall_min": float(f.recall_min),
            "rel_err": float(f.rel_err), "rows": int(f.rows)}
