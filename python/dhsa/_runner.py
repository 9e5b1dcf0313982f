"""_runner.py: the model runner from Python: dhsa.Model and dhsa.Session, over
the C API (dhsa_model_load, dhsa_session_*, dhsa_sampler_*, the tokenizer
and chat templates of include/dhsa.h), with the CLI's defaults (`dhsa run`):

    m = dhsa.Model()                      # the shipped models/dhsa-retrieval-8m.gguf
    s = dhsa.Session(m, ctx=4096, attn="dhsa", density=0.0625)
    print(s.generate("The pass key is 40913. ... The pass key is", max_tokens=8, temperature=0))
    for piece in s.generate("Once upon a time", max_tokens=64, stream=True):
        print(piece, end="", flush=True)

Every C error becomes dhsa.DhsaError (its .name, e.g. "DHSA_ERR_MEMORY_BUDGET",
and the library's sentence); a bad Python argument is ValueError / TypeError,
raised before C sees it (every number is range-checked here: nothing wraps).
Safe to misuse from threads: calls on a session run one at a time, a second
generate() while one runs (or a stream is live) raises RuntimeError, and
close() of a session or its model from another thread waits for the C call in
progress instead of freeing memory under it (the interrupted generate() raises
ValueError). python/tests/test_runner_safety.py tests each.
The ctypes structs are declared here, field for field as in include/dhsa.h
(checked against a C compiler by python/tests/test_runner.py). docs/python.md,
"The model runner", says more.
"""
import codecs
import collections.abc
import contextlib
import ctypes
import json as _json
import numbers
import operator
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from . import _capi
from ._capi import check, lib

c_int64, c_int, c_float, c_void_p, c_char_p = (ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                                              ctypes.c_void_p, ctypes.c_char_p)
_p = ctypes.POINTER

DEFAULT_MODEL = "dhsa-retrieval-8m.gguf"  # tools/cli.h DHSA_DEFAULT_MODEL
ATTN = {"dense": 0, "dhsa": 1, "block": 2, "stream": 3, "oracle": 4}
KV = {"f32": _capi.DHSA_F32, "f16": _capi.DHSA_F16, "q8_0": _capi.DHSA_Q8_0}
TEMPLATES = ("llama3", "chatml", "qwen2.5", "smollm2", "gemma", "mistral", "llama2", "phi3")
_ADD_BOS, _PARSE_SPECIAL = 1, 4
_DETOK_SPECIAL = 1


class ModelParams(ctypes.Structure):
    """dhsa_model_params."""
    _fields_ = [("tokenizer_path", c_char_p), ("check_finite", c_int)]


class ModelInfo(ctypes.Structure):
    """dhsa_model_info, field for field."""
    _fields_ = [
        ("arch", c_int), ("arch_name", c_char_p),
        ("n_vocab", c_int64), ("n_ctx_train", c_int64), ("n_embd", c_int64), ("n_layer", c_int64),
        ("n_ff", c_int64), ("n_head", c_int64), ("n_head_kv", c_int64), ("head_dim_k", c_int64),
        ("head_dim_v", c_int64), ("n_rot", c_int64),
        ("rms_eps", c_float), ("rope_base", c_float), ("rope_linear_factor", c_float),
        ("rope_neox", c_int), ("has_rope_freqs", c_int),
        ("rope_base_swa", c_float), ("rope_linear_factor_swa", c_float), ("rope_attn_factor", c_float),
        ("has_rope_factors", c_int), ("n_ctx_orig", c_int64), ("qk_norm", c_int), ("fused_ffn", c_int),
        ("attn_softcap", c_float), ("final_softcap", c_float), ("attn_scale", c_float),
        ("sliding_window", c_int64), ("n_swa_layers", c_int64), ("tied_output", c_int),
        ("weight_type", ctypes.c_uint32),
        ("n_params", c_int64), ("weight_bytes", c_int64),
    ]


class SessionParams(ctypes.Structure):
    """dhsa_session_params, field for field (the callbacks stay NULL)."""
    _fields_ = [
        ("n_ctx", c_int64), ("n_ubatch", c_int64), ("kv_type", c_int), ("mem_limit", ctypes.c_size_t),
        ("attn", c_int), ("router", _capi.RouterParams), ("logits_all", c_int), ("exact", c_int),
        ("progress", c_void_p), ("progress_user", c_void_p),
        ("layer_hook", c_void_p), ("layer_hook_user", c_void_p),
        ("dist", c_void_p), ("dist_stripe", c_int64),  # context parallelism: NULL, one process
        ("dist_fetch_share", ctypes.c_double),
    ]


class MemPlan(ctypes.Structure):
    """dhsa_mem_plan, field for field."""
    _fields_ = [("n_ctx", c_int64), ("n_ubatch", c_int64)] + [
        (n, ctypes.c_size_t) for n in ("weights", "kv_cache", "activations", "attn_workspace",
                                       "matmul_workspace", "routing", "process", "model_file",
                                       "model_heap", "code", "other", "stacks", "slack")] + [
        ("measured", c_int), ("total", ctypes.c_size_t)]


class SamplerParams(ctypes.Structure):
    """dhsa_sampler_params, field for field."""
    _fields_ = [("temperature", c_float), ("top_k", c_int64), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int64), ("seed", ctypes.c_uint64)]


class ChatMessage(ctypes.Structure):
    """dhsa_chat_message."""
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


LP64_SIZES = {"ModelParams": 16, "ModelInfo": 208, "SessionParams": 296, "MemPlan": 136,
              "SamplerParams": 48, "ChatMessage": 16}

_PROTOTYPES = {
    "dhsa_model_default_params": (ModelParams, []),
    "dhsa_model_load": (c_int, [c_char_p, _p(ModelParams), _p(c_void_p)]),
    "dhsa_model_free": (None, [c_void_p]),
    "dhsa_model_get_info": (_p(ModelInfo), [c_void_p]),
    "dhsa_model_routes": (c_int, [c_void_p, c_int, c_char_p, ctypes.c_size_t]),
    "dhsa_model_gguf": (c_void_p, [c_void_p]),
    "dhsa_model_tokenizer": (c_void_p, [c_void_p]),
    "dhsa_session_default_params": (SessionParams, []),
    "dhsa_session_plan": (c_int, [c_void_p, c_void_p, _p(SessionParams), _p(MemPlan)]),
    "dhsa_session_create": (c_int, [c_void_p, c_void_p, _p(SessionParams), _p(c_void_p)]),
    "dhsa_session_free": (None, [c_void_p]),
    "dhsa_session_get_plan": (_p(MemPlan), [c_void_p]),
    "dhsa_session_length": (c_int64, [c_void_p]),
    "dhsa_session_reset": (c_int, [c_void_p]),
    "dhsa_session_truncate": (c_int, [c_void_p, c_int64]),
    "dhsa_session_eval": (c_int, [c_void_p, c_void_p, c_int64, c_void_p]),
    "dhsa_session_save": (c_int, [c_void_p, c_void_p, c_int64, c_void_p, c_char_p]),
    "dhsa_session_load": (c_int, [c_void_p, c_char_p, c_void_p, c_int64, _p(c_int64), c_void_p, _p(c_int)]),
    "dhsa_sampler_default_params": (SamplerParams, []),
    "dhsa_sampler_create": (c_int, [_p(SamplerParams), c_int64, _p(c_void_p)]),
    "dhsa_sampler_free": (None, [c_void_p]),
    "dhsa_sampler_sample": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, _p(ctypes.c_int32)]),
    "dhsa_tokenizer_bos": (ctypes.c_int32, [c_void_p]),
    "dhsa_tokenizer_eos": (ctypes.c_int32, [c_void_p]),
    "dhsa_tokenizer_n_vocab": (c_int64, [c_void_p]),
    "dhsa_tokenizer_default_flags": (ctypes.c_uint, [c_void_p]),
    "dhsa_tokenize": (c_int, [c_void_p, c_char_p, c_int64, ctypes.c_uint, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_detokenize": (c_int, [c_void_p, c_void_p, c_int64, ctypes.c_uint, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_token_to_piece": (c_int, [c_void_p, ctypes.c_int32, ctypes.c_uint, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_chat_detect": (c_int, [c_void_p]),
    "dhsa_chat_choose": (c_int, [c_void_p, _p(c_int), _p(c_char_p)]),
    "dhsa_chat_template_from_name": (c_int, [c_char_p, _p(c_int)]),
    "dhsa_chat_template_name": (c_char_p, [c_int]),
    "dhsa_chat_apply": (c_int, [c_int, _p(ChatMessage), c_int64, c_int, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_chat_tokenize": (c_int, [c_int, c_void_p, _p(ChatMessage), c_int64, c_int, ctypes.c_uint, c_void_p,
                                   c_int64, _p(c_int64)]),
    "dhsa_chat_stop_ids": (c_int, [c_int, c_void_p, _p(ctypes.c_int32), c_int, _p(c_int)]),
    "dhsa_json_schema_compile": (c_int, [c_char_p, c_int64, _p(c_void_p)]),
    "dhsa_json_schema_free": (None, [c_void_p]),
    "dhsa_json_vocab_create": (c_int, [c_void_p, _p(c_void_p)]),
    "dhsa_json_vocab_free": (None, [c_void_p]),
    "dhsa_json_constraint_create": (c_int, [c_void_p, c_void_p, _p(c_void_p)]),
    "dhsa_json_constraint_free": (None, [c_void_p]),
    "dhsa_json_constraint_mask": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_json_constraint_accept": (c_int, [c_void_p, ctypes.c_int32]),
    "dhsa_json_constraint_can_end": (c_int, [c_void_p]),
    "dhsa_json_constraint_finished": (c_int, [c_void_p]),
}


class IncompleteJSONError(RuntimeError):
    """generate(json=True / json_schema=...) reached max_tokens (or a full context)
    before the JSON value was complete: the text is not valid JSON. .text holds
    what was generated (a stream has yielded it already)."""

    def __init__(self, text, n_tokens):
        super().__init__("generation stopped (finish: length, after %d tokens) before the JSON value was "
                         "complete: the text is not valid JSON (raise max_tokens)" % n_tokens)
        self.text = text
        self.n_tokens = n_tokens

_L = None


def _lib():
    """The library with the runner's prototypes set (once)."""
    global _L
    if _L is None:
        L = lib()
        for name, (res, args) in _PROTOTYPES.items():
            fn = getattr(L, name)  # AttributeError names a symbol an older library lacks
            fn.restype = res
            fn.argtypes = args
        _L = L
    return _L


def default_model_path():
    """As the CLI finds its default model: $DHSA_MODEL when set, else the
    copy bundled inside an installed package (dhsa/models/, put there by
    `pip install .`), else models/dhsa-retrieval-8m.gguf of this checkout
    (python/dhsa/../../models)."""
    env = os.environ.get("DHSA_MODEL")
    if env:
        return env
    here = Path(__file__).resolve().parent
    bundled = here / "models" / DEFAULT_MODEL
    if bundled.is_file():
        return str(bundled)
    return str(here.parent.parent / "models" / DEFAULT_MODEL)


# ------------------------------------------------------- argument checks ---
# Every number is checked here before it reaches C, so that nothing wraps or
# truncates on the way (a -1 context read as "the default", 2**64 + 256 as
# 256, a float id cut to an int): a value of the wrong type is TypeError, one
# out of range ValueError, each naming the argument.

_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1
_INT64_MAX = 2**63 - 1
_SIZE_MAX = 2**64 - 1
_MAX_THREADS = 1024  # dhsa_ctx_create's limit


def _int(name, v, lo, hi):
    """v as an int in [lo, hi]: TypeError for a float, a str, a bool; ValueError out of range."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError("%s must be an integer, not a bool" % name)
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError("%s must be an integer, not %s" % (name, type(v).__name__)) from None
    if not lo <= i <= hi:
        raise ValueError("%s = %d is out of range [%d, %d]" % (name, i, lo, hi))
    return i


def _real(name, v, lo, hi, lo_open=False):
    """v as a finite float in [lo, hi] ((lo, hi] with lo_open)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError("%s must be a number, not %s" % (name, type(v).__name__))
    x = float(v)
    if not (lo < x <= hi if lo_open else lo <= x <= hi):
        raise ValueError("%s = %r is out of range %s%g, %g]" % (name, v, "(" if lo_open else "[", lo, hi))
    return x


def _optional_int(name, v, lo, hi):
    """None -> 0 (the library's default), else _int."""
    return 0 if v is None else _int(name, v, lo, hi)


def _token_ids(ids, what="token ids"):
    """ids (a sequence of ints, an integer numpy array, or one int) as a C-contiguous
    int32 array: floats and bools are TypeError, ids outside int32 ValueError (the
    library then checks them against the vocabulary)."""
    if isinstance(ids, np.ndarray):
        a = ids.reshape(-1)
        if a.dtype.kind not in "iu":
            raise TypeError("%s are integers, not %s" % (what, a.dtype))
        if a.size and (int(a.min()) < _INT32_MIN or int(a.max()) > _INT32_MAX):
            raise ValueError("%s must fit in int32: %d .. %d given" % (what, int(a.min()), int(a.max())))
        return np.ascontiguousarray(a, dtype=np.int32)
    if isinstance(ids, (str, bytes, bytearray, dict)):
        raise TypeError("%s are a sequence of integers, not %s" % (what, type(ids).__name__))
    if isinstance(ids, numbers.Integral) and not isinstance(ids, (bool, np.bool_)):
        ids = [ids]
    try:
        seq = list(ids)
    except TypeError:
        raise TypeError("%s are a sequence of integers, not %s" % (what, type(ids).__name__)) from None
    return np.array([_int("%s[%d]" % (what, i), x, _INT32_MIN, _INT32_MAX) for i, x in enumerate(seq)],
                    dtype=np.int32)


def _c_string(name, v):
    """A str (or PathLike) as UTF-8 bytes for a C string: a NUL would cut it short."""
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if isinstance(v, bytes):
        b = v
    elif isinstance(v, str):
        b = v.encode("utf-8")
    else:
        raise TypeError("%s must be a str, not %s" % (name, type(v).__name__))
    if b"\0" in b:
        raise ValueError("%s holds a NUL character" % name)
    return b


def _messages(messages):
    """Chat messages as (role, content) UTF-8 pairs. messages is a list (or tuple) of
    dicts with str "role" and "content" (other keys are ignored): anything else is
    TypeError, a missing key or a NUL character ValueError. Which roles a format takes,
    and in what order, the library checks (DhsaError with its sentence)."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError("messages is a list of {'role': str, 'content': str} dicts, not %s"
                        % type(messages).__name__)
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, collections.abc.Mapping):
            raise TypeError("message %d is %s, not a dict with 'role' and 'content'" % (i, type(m).__name__))
        pair = []
        for key in ("role", "content"):
            if key not in m:
                raise ValueError("message %d has no %r" % (i, key))
            if not isinstance(m[key], str):
                raise TypeError("message %d: %r is %s, not a str" % (i, key, type(m[key]).__name__))
            pair.append(_c_string("message %d's %r" % (i, key), m[key]))
        out.append(tuple(pair))
    return out


def _online_cpus():
    try:
        n = os.sysconf("SC_NPROCESSORS_ONLN")
    except (ValueError, OSError, AttributeError):
        n = os.cpu_count() or 1
    return max(1, int(n))


def _threads(threads, stacklevel=3):
    """The CLI's rule for --threads (docs/python.md): None or 0 = the online CPUs;
    above them, capped to them with a RuntimeWarning (the results do not depend on
    the thread count; more threads than CPUs only wait for each other)."""
    n = _optional_int("threads", threads, 0, _MAX_THREADS)
    cpus = _online_cpus()
    if n > cpus:
        warnings.warn("threads=%d is above the %d online CPUs: using %d" % (n, cpus, cpus), RuntimeWarning,
                      stacklevel=stacklevel)
        n = cpus
    return n


def resolve_model(arg):
    """What Model(arg) opens, as the CLI's -m does it (tools/pull.c,
    docs/models.md): arg itself when a file is there or it has a folder; a
    name of models/catalog (or $DHSA_CATALOG) is the pulled file in
    $DHSA_MODELS (default ~/.cache/dhsa/models), or the repository's file
    for the shipped model; a catalog name not pulled yet raises
    FileNotFoundError naming `dhsa pull NAME`."""
    if not isinstance(arg, str) or os.path.exists(arg) or "/" in arg or os.sep in arg:
        return arg
    here = Path(__file__).resolve().parent
    bundled = here / "models" / "catalog"  # an installed package (pip install .)
    catalog = Path(os.environ.get("DHSA_CATALOG") or
                   (bundled if bundled.is_file() else here.parent.parent / "models" / "catalog"))
    if not catalog.is_file():
        return arg
    entry, entries = None, {}
    for line in catalog.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            entry = entries.setdefault(line[1:-1], {})
        elif entry is not None and "=" in line and not line.startswith("#"):
            k, v = (x.strip() for x in line.split("=", 1))
            entry.setdefault(k, v)
    if arg not in entries:
        return arg
    e = entries[arg]
    if "repo" in e:
        return str((catalog.parent.parent if "DHSA_CATALOG" not in os.environ else Path(".")) / e["repo"])
    cache = os.environ.get("DHSA_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "dhsa", "models")
    path = os.path.join(cache, e["file"])
    if not os.path.isfile(path):
        raise FileNotFoundError("model '%s' is in the catalog but not pulled yet (no %s): run `dhsa pull %s`"
                                % (arg, path, arg))
    if "size" in e and os.path.getsize(path) != int(e["size"]):
        raise FileNotFoundError("model '%s': %s has %d bytes, the catalog says %s: run `dhsa pull %s` again"
                                % (arg, path, os.path.getsize(path), e["size"], arg))
    return path


class Model:
    """A GGUF model (or a llama2.c checkpoint with tokenizer_path), read-only once
    loaded: any number of Sessions may use it. Model() loads the shipped default;
    Model("NAME") a model of the catalog pulled with `dhsa pull NAME`.

    Safe to share between threads. close() (also from another thread, also while
    a session of it generates) closes its sessions first (Session.close: waits for
    the call in progress), then frees the weights; every later use raises
    ValueError. Lock order: a model's lock before its sessions' locks."""

    def __init__(self, path=None, tokenizer_path=None, check_finite=True):
        self._h, self._tok, self._sessions = None, None, []
        self._jvocab = None  # each token's bytes for JSON constraints, made at the first use
        self._mu = threading.RLock()  # reentrant: close() -> Session.close() -> _forget()
        self._idle = threading.Condition(self._mu)
        self._users = 0               # calls on the handle in progress (_use)
        self._closing = False
        L = _lib()
        self.path = resolve_model(os.fspath(path)) if path is not None else default_model_path()
        p = L.dhsa_model_default_params()
        tp = _c_string("tokenizer_path", tokenizer_path) if tokenizer_path is not None else None
        p.tokenizer_path = tp
        p.check_finite = 1 if check_finite else 0
        h = c_void_p()
        check(L.dhsa_model_load(_c_string("path", self.path), ctypes.byref(p), ctypes.byref(h)))
        self._h = h
        self._tok = L.dhsa_model_tokenizer(h)
        inf = L.dhsa_model_get_info(h).contents
        self.info = {n: (getattr(inf, n).decode() if n == "arch_name" else getattr(inf, n))
                     for n, _ in ModelInfo._fields_}

    def close(self):
        """Closes its sessions (each waits for its call in progress), then frees the
        model. Idempotent."""
        mu = self.__dict__.get("_mu")
        if mu is None:  # __init__ failed before the lock existed
            return
        with mu:
            self._closing = True  # no new session, no new call
            for s in list(self._sessions):
                s.close()
            self._sessions = []
            while self._users:  # tokenizer and evaluation calls of other threads
                self._idle.wait()
            h, self._h, self._tok = self._h, None, None
            jv, self._jvocab = self._jvocab, None
            if jv:
                _lib().dhsa_json_vocab_free(jv)
            if h:
                _lib().dhsa_model_free(h)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        """The C handle; call with self._mu held."""
        if not self._h or self._closing:
            raise ValueError("the model is closed")
        return self._h

    @contextlib.contextmanager
    def _use(self):
        """The C handle for one call (the tokenizer's too, self._tok): calls run
        side by side, and close() waits until none runs; ValueError once closed."""
        with self._mu:
            h = self._handle()
            self._users += 1
        try:
            yield h
        finally:
            with self._mu:
                self._users -= 1
                if not self._users:
                    self._idle.notify_all()

    @property
    def closed(self):
        return not self._h

    @property
    def n_vocab(self):
        return int(self.info["n_vocab"])

    @property
    def n_ctx_train(self):
        return int(self.info["n_ctx_train"])

    @property
    def bos(self):
        with self._use():
            return int(_lib().dhsa_tokenizer_bos(self._tok))

    @property
    def eos(self):
        with self._use():
            return int(_lib().dhsa_tokenizer_eos(self._tok))

    def routes(self, exact=False):
        """What the weight products run per weight type, e.g. "Q4_K, Q6_K:
        int8 avx512-vnni; F32: f32 avx512" (dhsa_model_routes)."""
        buf = ctypes.create_string_buffer(256)
        with self._use() as h:
            check(_lib().dhsa_model_routes(h, 1 if exact else 0, buf, 256))
        return buf.value.decode()

    def tokenize(self, text, add_bos=None, parse_special=False):
        """Token ids (list of int) of text (str or bytes). add_bos: None = as the
        vocabulary asks (the CLI's default), True / False to force."""
        if isinstance(text, str):
            b = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            b = bytes(text)
        else:
            raise TypeError("text is a str or bytes, not %s" % type(text).__name__)
        L = _lib()
        with self._use():
            flags = L.dhsa_tokenizer_default_flags(self._tok) & _ADD_BOS
            if add_bos is not None:
                flags = _ADD_BOS if add_bos else 0
            if parse_special:
                flags |= _PARSE_SPECIAL
            n = c_int64()
            L.dhsa_tokenize(self._tok, b, len(b), flags, None, 0, ctypes.byref(n))
            out = (ctypes.c_int32 * max(1, n.value))()
            check(L.dhsa_tokenize(self._tok, b, len(b), flags, out, n.value, ctypes.byref(n)))
        return list(out[:n.value])

    def detokenize(self, ids, special=False):
        """Text of ids (the SentencePiece prefix space removed, as dhsa_detokenize does)."""
        a = _token_ids(ids)
        L = _lib()
        flags = _DETOK_SPECIAL if special else 0
        n = c_int64()
        with self._use():
            L.dhsa_detokenize(self._tok, a.ctypes.data, a.size, flags, None, 0, ctypes.byref(n))
            buf = ctypes.create_string_buffer(max(1, n.value))
            check(L.dhsa_detokenize(self._tok, a.ctypes.data, a.size, flags, buf, n.value, ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8", "replace")

    def token_to_piece(self, token):
        """The bytes of one token (control tokens: b"")."""
        t = _int("token", token, _INT32_MIN, _INT32_MAX)
        buf = ctypes.create_string_buffer(512)
        n = c_int64()
        with self._use():
            check(_lib().dhsa_token_to_piece(self._tok, t, 0, buf, 512, ctypes.byref(n)))
        return buf.raw[:n.value]

    def _template(self, template):
        """The chat format's number; call inside self._use()."""
        L = _lib()
        if template is None:
            # the model's own template only when dhsa renders it exactly
            # (dhsa_chat_choose: DhsaError naming the closest format otherwise)
            t, how = c_int(), c_char_p()
            check(L.dhsa_chat_choose(L.dhsa_model_gguf(self._h), ctypes.byref(t), ctypes.byref(how)))
            t = t.value
        else:
            t = c_int()
            check(L.dhsa_chat_template_from_name(_c_string("template", template), ctypes.byref(t)))
            t = t.value
        if t == 0:
            raise ValueError("the model names no chat template dhsa writes: pass template= one of "
                             + ", ".join(TEMPLATES))
        return t

    def chat_format(self):
        """(name, how): the chat format chat_template() uses without template=,
        and which way it was chosen (dhsa_chat_choose); DhsaError when the
        model's template is not one dhsa renders exactly."""
        L = _lib()
        t, how = c_int(), c_char_p()
        with self._use():
            check(L.dhsa_chat_choose(L.dhsa_model_gguf(self._h), ctypes.byref(t), ctypes.byref(how)))
        return L.dhsa_chat_template_name(t.value).decode(), how.value.decode()

    def chat_template(self, messages, add_generation_prompt=True, template=None):
        """The prompt text of messages ([{"role": ..., "content": ...}]) in the model's
        chat format (or template=NAME), as `dhsa run --chat` writes it."""
        keep = _messages(messages)
        L = _lib()
        arr = (ChatMessage * max(1, len(keep)))(*[ChatMessage(r, c) for r, c in keep])
        gen = int(bool(add_generation_prompt))
        n = c_int64()
        with self._use():
            t = self._template(template)
            L.dhsa_chat_apply(t, arr, len(keep), gen, None, 0, ctypes.byref(n))
            buf = ctypes.create_string_buffer(max(1, n.value))
            check(L.dhsa_chat_apply(t, arr, len(keep), gen, buf, n.value, ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8", "replace")

    def chat_tokenize(self, messages, add_generation_prompt=True, template=None):
        """Token ids of messages in the model's chat format (or template=NAME), as
        `dhsa run --chat` feeds them: the template's markers are special tokens, the
        messages' text is plain text (a "<|im_end|>" in a message stays text), BOS as
        the vocabulary asks (dhsa_chat_tokenize)."""
        keep = _messages(messages)
        L = _lib()
        arr = (ChatMessage * max(1, len(keep)))(*[ChatMessage(r, c) for r, c in keep])
        gen = int(bool(add_generation_prompt))
        n = c_int64()
        with self._use():
            t = self._template(template)
            flags = L.dhsa_tokenizer_default_flags(self._tok) & _ADD_BOS
            L.dhsa_chat_tokenize(t, self._tok, arr, len(keep), gen, flags, None, 0, ctypes.byref(n))
            out = (ctypes.c_int32 * max(1, n.value))()
            check(L.dhsa_chat_tokenize(t, self._tok, arr, len(keep), gen, flags, out, n.value, ctypes.byref(n)))
        return list(out[:n.value])

    def chat_stop_ids(self, template=None):
        """The ids that end a model's turn in its chat format."""
        out = (ctypes.c_int32 * 16)()
        n = c_int()
        with self._use():
            t = self._template(template)
            check(_lib().dhsa_chat_stop_ids(t, self._tok, out, 16, ctypes.byref(n)))
        return list(out[:n.value])

    def _json_vocab(self):
        """The token bytes table of dhsa_json_vocab_create (made once; the model owns it)."""
        with self._mu:
            self._handle()
            if self._jvocab is None:
                v = c_void_p()
                check(_lib().dhsa_json_vocab_create(self._tok, ctypes.byref(v)))
                self._jvocab = v
            return self._jvocab

    def _forget(self, session, blocking=True):
        """Drops a closed session from the list close() walks."""
        if self._mu.acquire(blocking):
            try:
                if session in self._sessions:
                    self._sessions.remove(session)
            finally:
                self._mu.release()


class Session:
    """One sequence through a Model: KV cache, routing index, last logits.

    Defaults are the library's: ctx the trained context, attn "dense", the router's
    density (0.0625) for the sparse methods, kv "f16" (llama.cpp's default;
    "f32", or "q8_0": 8-bit blocks of 32 read in place by attention), threads = online CPUs (more are
    capped to them with a RuntimeWarning), ubatch the largest <= 512 that fits
    mem_limit. mem_limit (bytes) bounds the process's peak RSS; a plan over it
    raises DhsaError(DHSA_ERR_MEMORY_BUDGET). exact=True runs the weight products
    on the exact F32 route (the CLI's --exact); the default is the fast integer
    route for quantized weights (docs/quant.md); Model.routes(exact) says which
    route each type takes.

    Threads: calls on one session run one at a time (a lock); while a generate()
    runs (a stream not yet exhausted or closed included), a second generate(),
    eval(), truncate() or reset() raises RuntimeError. close() from another
    thread marks the session closed, waits for the C call in progress (one
    evaluation) and frees it; the interrupted generate() raises ValueError."""

    def __init__(self, model, ctx=None, attn="dense", density=None, budget=None, kv="f16", mem_limit=None,
                 threads=None, ubatch=None, dense_below=None, exact=False):
        self._h = self._ctx = None
        self._mu = threading.RLock()  # reentrant: a dropped stream's __del__ may run under it
        self._gen = None          # the running generate(), which owns the session
        self._closing = False
        if not isinstance(model, Model):
            raise TypeError("model must be a dhsa.Model, not %s" % type(model).__name__)
        if attn not in ATTN:
            raise ValueError("attn is one of %s, not %r" % (", ".join(ATTN), attn))
        if kv not in KV:
            raise ValueError("kv is f32, f16 or q8_0, not %r" % (kv,))
        if density is not None and budget is not None:
            raise ValueError("give density or budget, not both")
        L = _lib()
        self.model = model
        p = L.dhsa_session_default_params()
        p.n_ctx = _optional_int("ctx", ctx, 0, _INT64_MAX)  # 0 = the trained context
        p.n_ubatch = _optional_int("ubatch", ubatch, 0, _INT64_MAX)
        p.kv_type = KV[kv]
        p.mem_limit = _optional_int("mem_limit", mem_limit, 0, _SIZE_MAX)  # 0 = no limit
        p.attn = ATTN[attn]
        p.exact = 1 if exact else 0
        if density is not None:
            p.router.density = _real("density", density, 0.0, 1.0, lo_open=True)
        if budget is not None:
            p.router.budget_tokens = _int("budget", budget, 1, _INT64_MAX)
        if dense_below is not None:
            p.router.dense_below = _int("dense_below", dense_below, 0, _INT64_MAX)
        cp = L.dhsa_ctx_default_params()
        cp.n_threads = _threads(threads)
        ctxh = c_void_p()
        check(L.dhsa_ctx_create(ctypes.byref(cp), ctypes.byref(ctxh)))
        h = c_void_p()
        with model._mu:  # a Model.close() on another thread waits, or came first
            try:
                check(L.dhsa_session_create(ctxh, model._handle(), ctypes.byref(p), ctypes.byref(h)))
            except Exception:
                L.dhsa_ctx_free(ctxh)
                raise
            self._ctx, self._h = ctxh, h
            model._sessions.append(self)
        self.attn = attn
        self._n_ctx = int(L.dhsa_session_get_plan(h).contents.n_ctx)
        self._logits = np.zeros(model.n_vocab, dtype=np.float32)
        self._have_logits = False
        self.tokens = []          # what the cache holds
        self.finish_reason = None # the last generate()'s: "stop" or "length"
        self.n_reused = 0         # prompt tokens the last generate took from the cache

    def close(self, _blocking=True):
        """Frees the session. From another thread while a call runs: marks the
        session closed, waits for the C call in progress, then frees it (the call's
        generate() raises ValueError). Idempotent."""
        mu = self.__dict__.get("_mu")
        if mu is None:  # __init__ failed before the lock existed
            return
        self._closing = True
        with mu:
            h, self._h = self._h, None
            c, self._ctx = self._ctx, None
            L = _lib() if (h or c) else None
            if h:
                L.dhsa_session_free(h)
            if c:
                L.dhsa_ctx_free(c)
        m = self.__dict__.get("model")
        if m is not None:
            m._forget(self, _blocking)

    def __del__(self):
        # by the garbage collector, on whatever thread and under whatever lock
        # it runs: the model's list is left to Model.close if it is busy
        self.close(_blocking=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return not self._h

    @contextlib.contextmanager
    def _call(self, what, gen=None):
        """Holds the session for one C call: the handle, or ValueError once closed,
        RuntimeError while a generate() other than gen owns the session."""
        if self._closing:
            raise ValueError("the session is closed" + (" (during generate())" if gen else ""))
        with self._mu:
            if not self._h:
                raise ValueError("the session is closed" + (" (during generate())" if gen else ""))
            if self._gen is not None and self._gen is not gen:
                raise RuntimeError("%s: a generate() of this session is still running (a stream not exhausted "
                                   "or closed, or a call on another thread): finish it or close() it first" % what)
            yield self._h

    def _handle(self):
        if not self._h:
            raise ValueError("the session is closed")
        return self._h

    @property
    def length(self):
        """Tokens in the cache."""
        with self._mu:
            return int(_lib().dhsa_session_length(self._handle()))

    @property
    def n_ctx(self):
        self._handle()
        return self._n_ctx

    @property
    def plan(self):
        """The memory plan (dict of bytes; dhsa_mem_plan)."""
        with self._mu:
            pl = _lib().dhsa_session_get_plan(self._handle()).contents
            return {n: getattr(pl, n) for n, _ in MemPlan._fields_}

    def reset(self):
        with self._call("reset()") as h:
            check(_lib().dhsa_session_reset(h))
            self.tokens = []
            self._have_logits = False

    def truncate(self, n):
        """Keeps the first n tokens of the cache (dhsa_session_truncate)."""
        self._truncate(n, None)

    def _truncate(self, n, gen):
        n = _int("n", n, 0, _INT64_MAX)
        with self._call("truncate()", gen) as h:
            if n > len(self.tokens):
                raise ValueError("truncate(%d): the cache holds %d tokens" % (n, len(self.tokens)))
            check(_lib().dhsa_session_truncate(h, n))
            del self.tokens[n:]
            self._have_logits = False

    def eval(self, ids):
        """Appends ids to the cache; afterwards logits() are those after the last one."""
        self._eval(_token_ids(ids), None)

    def _eval(self, a, gen):
        if a.size == 0:
            return
        with self._call("eval()", gen) as h:
            st = _lib().dhsa_session_eval(h, a.ctypes.data, a.size, self._logits.ctypes.data)
            if st:
                self._have_logits = False
                check(st)
            self.tokens.extend(int(x) for x in a)
            self._have_logits = True

    def save_state(self, path):
        """Saves the session's state (its tokens, KV cache, the logits after the last
        token) to path, written to a temporary name and renamed (dhsa_session_save,
        docs/prompt-cache.md)."""
        with self._call("save_state()") as h:
            ids = np.ascontiguousarray(self.tokens, dtype=np.int32)
            lg = self._logits.ctypes.data if self._have_logits else None
            check(_lib().dhsa_session_save(h, ids.ctypes.data, ids.size, lg, os.fsencode(path)))

    def load_state(self, path):
        """Replaces the session's state with the one saved in path (save_state, or
        `dhsa run --prompt-cache`); returns the number of tokens it holds. A file of
        another model or option raises DhsaError (DHSA_ERR_INVALID_ARG) with the
        reason and leaves the session as it was; a corrupt one leaves it empty.
        A later generate() whose prompt starts with these tokens evaluates only the
        rest."""
        with self._call("load_state()") as h:
            ids = np.zeros(self._n_ctx, dtype=np.int32)
            n, has = c_int64(0), c_int(0)
            st = _lib().dhsa_session_load(h, os.fsencode(path), ids.ctypes.data, ids.size, ctypes.byref(n),
                                          self._logits.ctypes.data, ctypes.byref(has))
            if st:
                self.tokens = self.tokens[:int(_lib().dhsa_session_length(h))]
                if not self.tokens:
                    self._have_logits = False
                check(st)
            self.tokens = [int(x) for x in ids[:n.value]]
            self._have_logits = bool(has.value)
            return n.value

    def logits(self):
        """The logits after the last evaluated token (a copy, float32 [n_vocab])."""
        with self._mu:
            if not self._have_logits:
                raise ValueError("no logits: eval some tokens first")
            return self._logits.copy()

    def _prompt_ids(self, prompt, chat, template):
        m = self.model
        messages = isinstance(prompt, (list, tuple)) and len(prompt) > 0 and \
            isinstance(prompt[0], collections.abc.Mapping)
        if chat and (isinstance(prompt, str) or messages):
            # the messages stay plain text: only the template's markers are special
            return m.chat_tokenize([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
                                   template=template)
        if messages:
            raise TypeError("a list of messages is a prompt with chat=True")
        if isinstance(prompt, str):
            return m.tokenize(prompt)
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(x) for x in _token_ids(prompt, "prompt ids")]
        raise TypeError("prompt is a str, a list of token ids, or (chat=True) a list of messages")

    def generate(self, prompt=None, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.0, repeat_last_n=64, seed=42, stop=None, ignore_eos=False, chat=False,
                 template=None, stream=False, tokens=False, json=False, json_schema=None):
        """Generates up to max_tokens tokens after prompt (the CLI's `dhsa run` with the
        same options: the same defaults and, for the same seed, the same tokens).

        prompt: text (BOS added as the vocabulary asks), token ids, or with chat=True a
        user message or a list of messages put through the chat template; None
        continues from what the session holds. A prompt that shares a prefix with the
        cache reuses it (the rest is evaluated; n_reused says how much). Stops at EOS
        (and the chat format's end-of-turn ids with chat), at a stop string (the text
        ends before it) or at a full context. Returns the text, or with stream=True
        yields it in pieces (never inside a UTF-8 character); tokens=True gives the
        generated ids instead of text. The session is the call's until it returns (a
        stream's until it is exhausted or closed): another generate(), eval(),
        truncate() or reset() meanwhile raises RuntimeError.

        json=True: the text is one JSON object; json_schema (a dict, or its JSON
        text): the text is JSON valid under that schema (the subset of
        docs/server.md; a keyword outside it raises DhsaError naming it, before
        anything runs). Sampling is constrained token by token and ends when the
        value closes; max_tokens reached first raises IncompleteJSONError (with
        the text). Not with stop strings or tokens=True. After a call,
        finish_reason is "stop" or "length"."""
        max_tokens = _int("max_tokens", max_tokens, 0, _INT64_MAX)
        sp = SamplerParams()
        sp.temperature = _real("temperature", temperature, 0.0, 1e6)
        sp.top_k = _int("top_k", top_k, 0, _INT64_MAX)
        sp.top_p = _real("top_p", top_p, 0.0, 1.0, lo_open=True)
        sp.min_p = _real("min_p", min_p, 0.0, 1.0)
        sp.repeat_penalty = _real("repeat_penalty", repeat_penalty, 0.0, 1e6, lo_open=True)
        sp.repeat_last_n = _int("repeat_last_n", repeat_last_n, 0, _INT64_MAX)
        sp.seed = _int("seed", seed, 0, 2**64 - 1)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError("stop is a non-empty string or a list of them")
        if template is not None and not isinstance(template, str):
            raise TypeError("template is a str (a chat format's name), not %s" % type(template).__name__)
        m, L = self.model, _lib()
        schema = None
        if json_schema is not None or json:
            if json_schema is not None and json:
                raise ValueError("give json=True or json_schema, not both")
            if stops:
                raise ValueError("stop strings with json / json_schema would cut the JSON value short")
            if tokens:
                raise ValueError("tokens=True gives ids; json / json_schema constrain text: give one")
            if json_schema is not None:
                if isinstance(json_schema, str):
                    text = json_schema
                elif isinstance(json_schema, (collections.abc.Mapping, bool)):
                    text = _json.dumps(json_schema)
                else:
                    raise TypeError("json_schema is a dict or its JSON text, not %s" % type(json_schema).__name__)
                b = text.encode("utf-8")
            else:
                b = None
        eos = m.eos
        stop_ids = [] if ignore_eos else ([eos] if eos >= 0 else [])
        if chat and not ignore_eos:
            stop_ids += [i for i in m.chat_stop_ids(template) if i not in stop_ids]
        ids = self._prompt_ids(prompt, chat, template) if prompt is not None else None
        if ids is not None and not ids:
            raise ValueError("the prompt is empty and the vocabulary adds no BOS")
        if ids is not None and len(ids) > self.n_ctx:
            raise ValueError("the prompt has %d tokens but the context holds %d" % (len(ids), self.n_ctx))
        if json_schema is not None or json:  # compiled last: nothing above may raise and leak it
            schema = c_void_p()
            check(L.dhsa_json_schema_compile(b, len(b) if b is not None else 0, ctypes.byref(schema)))
        owner = object()  # the claim; the stream holds it, the inner generator too (no cycle)
        run = _Generation(self, L, owner)
        run._schema = schema
        try:
            with self._call("generate()"):  # claims the session, or raises
                self._gen = owner
        except BaseException:
            run.close()
            raise
        try:
            if ids is not None:
                keep = 0
                while keep < min(len(ids), len(self.tokens)) and ids[keep] == self.tokens[keep]:
                    keep += 1
                keep = min(keep, len(ids) - 1)  # the last one runs again for its logits
                self._truncate(keep, owner)
                self.n_reused = keep
                self._eval(np.asarray(ids[keep:], dtype=np.int32), owner)
            elif not self._have_logits:
                raise ValueError("no prompt and nothing evaluated: give a prompt")
            jc = None
            if schema is not None:
                jc = c_void_p()
                check(L.dhsa_json_constraint_create(schema, m._json_vocab(), ctypes.byref(jc)))
                run._jc = jc
            smp = c_void_p()
            check(L.dhsa_sampler_create(ctypes.byref(sp), m.n_vocab, ctypes.byref(smp)))
            run._start(smp, self._run(owner, smp, max_tokens, stop_ids, stops, tokens, jc))
        except BaseException:
            run.close()
            raise
        if stream:
            return run
        out = list(run)
        return out if tokens else "".join(out)

    def _release(self, owner):
        with self._mu:
            if self._gen is owner:
                self._gen = None

    def _run(self, owner, smp, max_tokens, stop_ids, stops, tokens, jc=None):
        L = _lib()
        m = self.model
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, sent = "", 0
        hold = max((len(s) for s in stops), default=0)
        self.finish_reason = "length"
        scratch = np.empty_like(self._logits) if jc else None
        ends = np.asarray(stop_ids, dtype=np.int32)
        n_gen = 0
        for i in range(max_tokens):
            if self._closing:
                raise ValueError("the session is closed (during generate())")
            hist = np.ascontiguousarray(self.tokens, dtype=np.int32)
            lg = self._logits
            if jc:  # only the ids that continue the JSON value (the end ids once it is complete)
                np.copyto(scratch, self._logits)
                check(L.dhsa_json_constraint_mask(jc, scratch.ctypes.data, ends.ctypes.data, ends.size, None))
                lg = scratch
            nxt = ctypes.c_int32()
            check(L.dhsa_sampler_sample(smp, lg.ctypes.data, hist.ctypes.data, hist.size,
                                        ctypes.byref(nxt)))
            t = int(nxt.value)
            if t in stop_ids:
                self.finish_reason = "stop"
                break
            if jc:
                check(L.dhsa_json_constraint_accept(jc, t))
            n_gen += 1
            if tokens:
                yield t
            else:
                text += dec.decode(m.token_to_piece(t))
                # a stop string starts at or after `sent` (what could begin one was held back)
                cut = min((text.find(s, sent) for s in stops if text.find(s, sent) >= 0), default=-1)
                if cut >= 0:
                    self.finish_reason = "stop"
                    if cut > sent:
                        yield text[sent:cut]
                    return
                ready = len(text) - (hold - 1 if hold else 0)
                # hold back only what could begin a stop string
                while ready < len(text) and not any(s.startswith(text[ready:]) for s in stops):
                    ready += 1
                if ready > sent:
                    yield text[sent:ready]
                    sent = ready
            if jc and L.dhsa_json_constraint_finished(jc):
                self.finish_reason = "stop"  # the value closed: nothing may follow
                break
            if i + 1 == max_tokens or len(self.tokens) >= self._n_ctx:
                break
            self._eval(np.array([t], dtype=np.int32), owner)
        if not tokens:
            text += dec.decode(b"", final=True)
            if len(text) > sent:
                yield text[sent:]
        if jc and not L.dhsa_json_constraint_can_end(jc):
            raise IncompleteJSONError(text, n_gen)


class _Generation:
    """A running Session.generate(): an iterator over its pieces (or ids) that owns
    the session until it is exhausted, fails or is closed (close(), or garbage
    collection of a stream dropped early); closing frees its sampler and gives the
    session back. Its steps run one at a time (a lock), so a close() from another
    thread waits for the step in progress."""

    def __init__(self, session, L, owner):
        self._session, self._L, self._owner = session, L, owner
        self._smp, self._inner = None, None
        self._schema, self._jc = None, None  # JSON: the compiled schema and the constraint
        self._mu = threading.RLock()
        self._done = False

    def _start(self, smp, inner):
        self._smp, self._inner = smp, inner

    def __iter__(self):
        return self

    def __next__(self):
        with self._mu:
            if self._done:
                raise StopIteration
            try:
                return next(self._inner)
            except BaseException:
                self.close()
                raise

    def close(self):
        """Stops the generation (the text so far stays in the session's cache)."""
        with self._mu:
            if self._done:
                return
            self._done = True
            inner, self._inner = self._inner, None
            if inner is not None:
                inner.close()
            smp, self._smp = self._smp, None
            if smp:
                self._L.dhsa_sampler_free(smp)
            jc, self._jc = self._jc, None
            if jc:
                self._L.dhsa_json_constraint_free(jc)
            schema, self._schema = self._schema, None
            if schema:
                self._L.dhsa_json_schema_free(schema)
            self._session._release(self._owner)

    def __del__(self):
        if self.__dict__.get("_mu") is not None:
            self.close()
