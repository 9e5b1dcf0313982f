"""_capi.py: the ctypes layer over libdhsa.so. Finds and loads the library,
mirrors the C structs of include/dhsa.h exactly (field order and types), and
declares argtypes/restype for every function the binding calls. Nothing here
knows about numpy; see _attention.py and _context.py for the Python API.

Where the library comes from, in order: the environment variable DHSA_LIB
(a path; if it is set and cannot be loaded that is an error, never a silent
fall-through: an explicit choice wins over everything), then the library
bundled inside the package (dhsa/libdhsa.so, put there by `pip install .`,
python/dhsa_build_backend.py), then build/libdhsa.so of a checkout
(python/dhsa/../../build/libdhsa.so), then ctypes.util.find_library("dhsa").

Struct layout is checked by python/tests/test_capi.py: sizes against the
LP64 values below, and every field offset against a C program compiled from
include/dhsa.h when a C compiler is present.
"""

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

c_int64 = ctypes.c_int64
c_size_t = ctypes.c_size_t
c_int = ctypes.c_int
c_float = ctypes.c_float
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p

# ------------------------------------------------------------------ enums ---
# C enums are int-sized on every ABI dhsa builds for (gcc/clang, SysV/AAPCS).

DHSA_OK = 0

DHSA_F32, DHSA_F16, DHSA_BF16, DHSA_Q8_0 = 0, 1, 2, 3

DHSA_MASK_NO_POLARITY = 0
DHSA_MASK_TRUE_IGNORES = 1  # PyTorch nn.MultiheadAttention key_padding_mask
DHSA_MASK_TRUE_KEEPS = 2    # F.scaled_dot_product_attention bool attn_mask

DHSA_BACKEND_AUTO, DHSA_BACKEND_TILED, DHSA_BACKEND_REFERENCE = 0, 1, 2
BACKENDS = {"auto": DHSA_BACKEND_AUTO, "tiled": DHSA_BACKEND_TILED,
            "reference": DHSA_BACKEND_REFERENCE}

ISAS = {"scalar": 0, "avx2": 1, "avx512": 2}

# ---------------------------------------------------------------- structs ---


class Tensor(ctypes.Structure):
    """dhsa_tensor: a strided view, logical order [batch, heads, seq, dim],
    strides in elements."""
    _fields_ = [
        ("data", c_void_p),
        ("type", c_int),            # dhsa_type
        ("shape", c_int64 * 4),
        ("stride", c_int64 * 4),
    ]


class AttnDesc(ctypes.Structure):
    """dhsa_attn_desc, field for field."""
    _fields_ = [
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("o", Tensor),
        ("lse", Tensor),
        ("scale", c_float),
        ("softcap", c_float),
        ("causal", c_int),
        ("q_pos0", c_int64),
        ("window", c_int64),
        ("key_mask", c_void_p),             # const uint8_t *
        ("key_mask_batch_stride", c_int64),
        ("key_mask_polarity", c_int),       # dhsa_mask_polarity
        ("key_bias", c_void_p),             # const float *
        ("key_bias_batch_stride", c_int64),
        ("attn_mask", Tensor),
        ("layout", c_void_p),               # const dhsa_layout * (sparse; NULL = dense)
        ("backend", c_int),                 # dhsa_backend
        ("check_finite", c_int),
        ("reference_max_bytes", c_size_t),
        ("k_pos0", c_int64),
    ]


class CtxParams(ctypes.Structure):
    """dhsa_ctx_params."""
    _fields_ = [
        ("n_threads", c_int),
        ("mem_budget", c_size_t),
    ]


class MemStats(ctypes.Structure):
    """dhsa_mem_stats."""
    _fields_ = [
        ("in_use", c_size_t),
        ("peak", c_size_t),
        ("largest", c_size_t),
        ("n_allocs", ctypes.c_uint64),
        ("budget", c_size_t),
    ]


# Routing, layouts, synthetic workloads (the "Sparse layouts" to "Synthetic
# workloads and fidelity" sections of dhsa.h).

DHSA_BOUNDARY_FIXED, DHSA_BOUNDARY_SIMILARITY, DHSA_BOUNDARY_LEARNED = 0, 1, 2
DHSA_ROUTE_DHSA, DHSA_ROUTE_STREAM, DHSA_ROUTE_ORACLE = 0, 1, 2
DHSA_SCORE_POOLED, DHSA_SCORE_MOMENTS, DHSA_SCORE_HEADS, DHSA_SCORE_BOUND, DHSA_SCORE_ROWS = 0, 1, 2, 3, 4
DHSA_SYNTH_MAX_NEEDLES = 64
DHSA_CARRY_MAX = 16  # chunks a decode step carries per KV head (include/dhsa/route.h)


class RouterParams(ctypes.Structure):
    """dhsa_router_params, field for field."""
    _fields_ = [
        ("method", c_int),                  # dhsa_route_method
        ("boundary", c_int),                # dhsa_boundary
        ("predictor", c_void_p),            # const dhsa_predictor * (not owned)
        ("learned_threshold", c_float),
        ("chunk", c_int64),
        ("sim_window", c_int64),
        ("threshold", c_float),
        ("nms_window", c_int64),
        ("min_chunk", c_int64),
        ("max_chunk", c_int64),
        ("causal_boundaries", c_int),
        ("q_block", c_int64),
        ("budget_tokens", c_int64),
        ("density", ctypes.c_double),
        ("sink_tokens", c_int64),
        ("local_tokens", c_int64),
        ("dense_below", c_int64),
        ("share_heads", c_int),
        ("score_mode", c_int),              # dhsa_chunk_score
        ("scale_fixed", c_int),
        ("score_rows", c_int64),
        ("sink_window", c_int64),
        ("carry", ctypes.c_double),
        ("exact_rows", c_int64),
        ("rest", c_int64),
        ("hybrid_max_chunk", c_int64),
    ]


class LayoutStats(ctypes.Structure):
    """dhsa_layout_stats, field for field."""
    _fields_ = [
        ("B", c_int64), ("Hkv", c_int64), ("Lq", c_int64), ("Lk", c_int64),
        ("q_block", c_int64), ("n_blocks", c_int64), ("max_ranges", c_int64),
        ("q_pos0", c_int64),
        ("causal", c_int),
        ("window", c_int64),
        ("selected", ctypes.c_double),
        ("available", ctypes.c_double),
        ("density", ctypes.c_double),
        ("ranges", c_int64),
        ("dense_blocks", c_int64),
        ("chunks", c_int64),
        ("chunk_mean", ctypes.c_double),
        ("chunk_min", c_int64),
        ("chunk_max", c_int64),
    ]


class SynthParams(ctypes.Structure):
    """dhsa_synth_params, field for field."""
    _fields_ = [
        ("B", c_int64), ("Hq", c_int64), ("Hkv", c_int64), ("L", c_int64), ("d", c_int64),
        ("seg_min", c_int64), ("seg_max", c_int64),
        ("n_needles", c_int),
        ("depths", ctypes.c_double * DHSA_SYNTH_MAX_NEEDLES),
        ("needle_len", c_int64),
        ("q_block", c_int64),
        ("seed", ctypes.c_uint64),
    ]


class SynthNeedle(ctypes.Structure):
    """dhsa_synth_needle."""
    _fields_ = [("key", c_int64), ("len", c_int64), ("row", c_int64), ("rows", c_int64)]


class Fidelity(ctypes.Structure):
    """dhsa_fidelity."""
    _fields_ = [
        ("recall", ctypes.c_double),
        ("recall_min", ctypes.c_double),
        ("rel_err", ctypes.c_double),
        ("rows", c_int64),
    ]


# Sizes on LP64 (x86-64 / aarch64 Linux), computed by hand from dhsa.h and
# checked by the tests against both ctypes and a compiled C program.
LP64_SIZES = {"Tensor": 80, "AttnDesc": 584, "CtxParams": 16, "MemStats": 40,
              "RouterParams": 192, "LayoutStats": 152, "SynthParams": 600,
              "SynthNeedle": 32, "Fidelity": 32}

# ------------------------------------------------------------ prototypes ---

_PROTOTYPES = {
    # name: (restype, [argtypes])
    "dhsa_status_str": (c_char_p, [c_int]),
    "dhsa_last_error": (c_char_p, []),
    "dhsa_active_isa": (c_int, []),
    "dhsa_isa_name": (c_char_p, [c_int]),
    "dhsa_set_isa": (c_int, [c_int]),
    "dhsa_ctx_default_params": (CtxParams, []),
    "dhsa_ctx_create": (c_int, [ctypes.POINTER(CtxParams), ctypes.POINTER(c_void_p)]),
    "dhsa_ctx_free": (None, [c_void_p]),
    "dhsa_ctx_n_threads": (c_int, [c_void_p]),
    "dhsa_ctx_mem_stats": (MemStats, [c_void_p]),
    "dhsa_ctx_reset_peak": (None, [c_void_p]),
    "dhsa_ctx_set_budget": (c_int, [c_void_p, c_size_t]),
    "dhsa_ctx_trim": (None, [c_void_p]),
    "dhsa_type_size": (c_size_t, [c_int]),
    "dhsa_type_name": (c_char_p, [c_int]),
    "dhsa_tensor_bhld": (Tensor, [c_void_p, c_int, c_int64, c_int64, c_int64, c_int64]),
    "dhsa_tensor_blhd": (Tensor, [c_void_p, c_int, c_int64, c_int64, c_int64, c_int64]),
    "dhsa_f32_to_f16": (ctypes.c_uint16, [c_float]),
    "dhsa_f16_to_f32": (c_float, [ctypes.c_uint16]),
    "dhsa_f32_to_bf16": (ctypes.c_uint16, [c_float]),
    "dhsa_bf16_to_f32": (c_float, [ctypes.c_uint16]),
    "dhsa_attn_default_desc": (AttnDesc, []),
    "dhsa_attn_workspace_size": (c_int, [c_void_p, ctypes.POINTER(AttnDesc),
                                         ctypes.POINTER(c_size_t)]),
    "dhsa_attention": (c_int, [c_void_p, ctypes.POINTER(AttnDesc)]),
    "dhsa_attn_resolve_backend": (c_int, [c_int]),
    "dhsa_backend_name": (c_char_p, [c_int]),
    "dhsa_proc_peak_rss": (c_size_t, []),
    "dhsa_proc_rss": (c_size_t, []),
    "dhsa_proc_reset_peak_rss": (c_int, []),
}

_p = ctypes.POINTER
# Routing and layouts: set when the library has them (an older library still
# serves dense attention; calling one of these on it raises AttributeError
# naming the symbol).
_ROUTE_PROTOTYPES = {
    "dhsa_layout_size": (c_int, [c_int64, c_int64, c_int64, c_int64, c_int64, c_int64,
                                 _p(c_size_t)]),
    "dhsa_layout_create": (c_int, [c_void_p, c_int64, c_int64, c_int64, c_int64, c_int64, c_int64,
                                   _p(c_void_p)]),
    "dhsa_layout_free": (None, [c_void_p]),
    "dhsa_layout_set": (c_int, [c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int64]),
    "dhsa_layout_get": (c_int, [c_void_p, c_int64, c_int64, c_int64, _p(_p(c_int64)),
                                _p(c_int64)]),
    "dhsa_layout_get_stats": (c_int, [c_void_p, _p(LayoutStats)]),
    "dhsa_layout_selects": (c_int, [c_void_p, c_int64, c_int64, c_int64, c_int64]),
    "dhsa_predictor_load": (c_int, [c_char_p, _p(c_void_p)]),
    "dhsa_predictor_load_memory": (c_int, [c_void_p, c_size_t, _p(c_void_p)]),
    "dhsa_predictor_save": (c_int, [c_void_p, c_char_p]),
    "dhsa_predictor_create_random": (c_int, [c_int64, c_int64, c_int64, ctypes.c_uint64,
                                             _p(c_void_p)]),
    "dhsa_predictor_free": (None, [c_void_p]),
    "dhsa_predictor_width": (c_int64, [c_void_p]),
    "dhsa_predictor_window": (c_int64, [c_void_p]),
    "dhsa_predictor_score": (c_int, [c_void_p, c_void_p, _p(Tensor), c_int64, _p(c_float)]),
    "dhsa_router_default_params": (RouterParams, []),
    "dhsa_router_params_for": (RouterParams, [c_int64, ctypes.c_double]),
    "dhsa_route_sizes": (c_int, [c_void_p, _p(RouterParams), _p(AttnDesc), _p(c_size_t),
                                 _p(c_size_t)]),
    "dhsa_route": (c_int, [c_void_p, _p(RouterParams), _p(AttnDesc), _p(c_void_p)]),
    "dhsa_kv_index_create": (c_int, [c_void_p, _p(RouterParams), c_int64, c_int64, c_int64,
                                     _p(c_void_p)]),
    "dhsa_kv_index_free": (None, [c_void_p]),
    "dhsa_kv_index_append": (c_int, [c_void_p, _p(Tensor)]),
    "dhsa_kv_index_length": (c_int64, [c_void_p]),
    "dhsa_kv_index_chunks": (c_int64, [c_void_p, _p(_p(c_int64))]),
    "dhsa_kv_index_route": (c_int, [c_void_p, c_void_p, _p(AttnDesc), _p(c_void_p)]),
    "dhsa_kv_index_route_exact": (c_int, [c_void_p, c_void_p, _p(AttnDesc), _p(c_void_p)]),
    "dhsa_kv_index_route_keep": (c_int, [c_void_p, c_void_p, _p(AttnDesc), _p(c_int64), _p(c_void_p)]),
    "dhsa_kv_index_carry": (c_int, [c_void_p, _p(AttnDesc), c_void_p, ctypes.c_double, _p(c_int64)]),
    "dhsa_synth_default_params": (SynthParams, []),
    "dhsa_synth_generate": (c_int, [_p(SynthParams), c_void_p, c_void_p, c_void_p,
                                    _p(SynthNeedle)]),
    "dhsa_fidelity_compare": (c_int, [_p(Tensor), _p(Tensor), _p(Tensor), _p(Tensor),
                                      _p(Fidelity)]),
}

# Retrieval tasks (the "Retrieval tasks" block of dhsa.h) and the tokenizer
# they need.

DHSA_TASK_PASSKEY, DHSA_TASK_MULTIKEY, DHSA_TASK_MULTIVALUE = 1, 2, 3
DHSA_TASK_MAX_NEEDLES = 16


class TaskParams(ctypes.Structure):
    """dhsa_task_params, field for field."""
    _fields_ = [
        ("kind", c_int),
        ("length", c_int64),
        ("depth", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("n_keys", c_int),
        ("n_distract", c_int),
        ("filler", c_void_p),
        ("filler_len", c_int64),
        ("keywords", c_void_p),             # const char *const *
        ("n_keywords", c_int64),
        ("heldout_numbers", c_int),
    ]


class Task(ctypes.Structure):
    """dhsa_task, field for field."""
    _fields_ = [
        ("ids", ctypes.POINTER(ctypes.c_int32)),
        ("n_ids", c_int64),
        ("prompt", c_char_p),
        ("answer", ctypes.c_char * 192),
        ("n_numbers", c_int),
        ("numbers", ctypes.c_uint64 * DHSA_TASK_MAX_NEEDLES),
        ("n_spans", c_int),
        ("span_lo", c_int64 * DHSA_TASK_MAX_NEEDLES),
        ("span_hi", c_int64 * DHSA_TASK_MAX_NEEDLES),
        ("depth_used", ctypes.c_double),
    ]


LP64_SIZES.update({"TaskParams": 80, "Task": 624})

_TASK_PROTOTYPES = {
    "dhsa_gguf_open": (c_int, [c_char_p, _p(c_void_p)]),
    "dhsa_gguf_close": (None, [c_void_p]),
    "dhsa_tokenizer_from_gguf": (c_int, [c_void_p, _p(c_void_p)]),
    "dhsa_tokenizer_free": (None, [c_void_p]),
    "dhsa_tokenizer_default_flags": (ctypes.c_uint, [c_void_p]),
    "dhsa_tokenizer_n_vocab": (c_int64, [c_void_p]),
    "dhsa_tokenize": (c_int, [c_void_p, c_char_p, c_int64, ctypes.c_uint, c_void_p, c_int64,
                              _p(c_int64)]),
    "dhsa_detokenize": (c_int, [c_void_p, c_void_p, c_int64, ctypes.c_uint, c_void_p, c_int64,
                                _p(c_int64)]),
    "dhsa_task_kind_name": (c_char_p, [c_int]),
    "dhsa_task_default_params": (TaskParams, []),
    "dhsa_task_build": (c_int, [c_void_p, _p(TaskParams), _p(Task)]),
    "dhsa_task_free": (None, [_p(Task)]),
    "dhsa_task_check": (c_int, [_p(Task), c_char_p, c_int64]),
    "dhsa_task_selected": (ctypes.c_double, [_p(Task), c_void_p, c_int64, c_int64]),
}

# ---------------------------------------------------------------- loading ---

_lib = None
_lib_path = None
_load_lock = threading.Lock()


def _candidates():
    env = os.environ.get("DHSA_LIB")
    if env:
        return [("DHSA_LIB", env)]
    out = []
    here = Path(__file__).resolve().parent
    out.append(("bundled", str(here / "libdhsa.so")))
    out.append(("package-relative", str(here.parent.parent / "build" / "libdhsa.so")))
    found = ctypes.util.find_library("dhsa")
    if found:
        out.append(("find_library", found))
    return out


def lib():
    """The loaded library (loaded on first use), with every prototype set."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _load_lock:
        if _lib is not None:
            return _lib
        tried = []
        for how, path in _candidates():
            if how in ("bundled", "package-relative") and not os.path.exists(path):
                tried.append("%s (%s: no such file)" % (path, how))
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                if how == "DHSA_LIB":
                    raise OSError("DHSA_LIB=%s cannot be loaded: %s" % (path, e)) from e
                tried.append("%s (%s: %s)" % (path, how, e))
                continue
            # The C API has no size query for dhsa_attn_desc; a library older
            # than its `layout` field (added with the sparse layouts) would read
            # our descriptor with shifted fields. Its layout functions mark it.
            if not hasattr(handle, "dhsa_layout_create"):
                raise OSError("%s predates dhsa_attn_desc.layout (no dhsa_layout_create): it does "
                              "not match this binding; rebuild it with `make`" % path)
            for name, (res, args) in _PROTOTYPES.items():
                fn = getattr(handle, name)  # AttributeError names a missing symbol
                fn.restype = res
                fn.argtypes = args
            for name, (res, args) in list(_ROUTE_PROTOTYPES.items()) + list(_TASK_PROTOTYPES.items()):
                if hasattr(handle, name):
                    fn = getattr(handle, name)
                    fn.restype = res
                    fn.argtypes = args
            _lib, _lib_path = handle, path
            return _lib
        raise OSError("libdhsa not found; build it with `make` in the repository root or "
                      "set DHSA_LIB to its path. Tried: " + "; ".join(tried or ["nothing"]))


def lib_path():
    """Path of the loaded library (loads it)."""
    lib()
    return _lib_path

# ----------------------------------------------------------------- errors ---


class DhsaError(RuntimeError):
    """An error status from the C library, with its sentence.

    Attributes: status (the negative int), name (dhsa_status_str(status),
    e.g. "DHSA_ERR_SHAPE"), message (dhsa_last_error() right after the
    failing call). str() gives "NAME: message"."""

    def __init__(self, status, name, message):
        self.status = int(status)
        self.name = name
        self.message = message
        super().__init__("%s: %s" % (name, message) if message else name)


def check(status):
    """Raise DhsaError for a non-zero dhsa_status. Must run on the thread
    that made the call (dhsa_last_error is thread-local); ctypes calls run on
    the calling thread, so calling this right after the call is enough."""
    if status != DHSA_OK:
        L = lib()
        raw = L.dhsa_last_error()
        name = L.dhsa_status_str(status).decode("ascii", "replace")
        raise DhsaError(status, name, raw.decode("utf-8", "replace") if raw else "")
    return status
