"""_runner.py: the model runner from Python: dhsa.Model and dhsa.Session, over
the C API (dhsa_model_load, dhsa_session_*, dhsa_sampler_*, the tokenizer
and chat templates of include/dhsa.h), with the CLI's defaults (`dhsa run`):

    m = dhsa.Model()                      # the shipped models/dhsa-retrieval-8m.gguf
    s = dhsa.Session(m, ctx=4096, attn="dhsa", density=0.0625)
    print(s.generate("The pass key is 40913. ... The pass key is", max_tokens=8, temperature=0))
    for piece in s.generate("Once upon a time", max_tokens=64, stream=True):
        print(piece, end="", flush=True)

Every C error becomes dhsa.DhsaError (its .name, e.g. "DHSA_ERR_MEMORY_BUDGET",
and the library's sentence); a bad Python argument is ValueError / TypeError.
The ctypes structs are declared here, field for field as in include/dhsa.h
(checked against a C compiler by python/tests/test_runner.py). docs/python.md,
"The model runner", says more.
"""
import codecs
import ctypes
import os
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
TEMPLATES = ("llama3", "chatml", "gemma", "mistral", "llama2")
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


LP64_SIZES = {"ModelParams": 16, "ModelInfo": 208, "SessionParams": 232, "MemPlan": 136,
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
    "dhsa_chat_template_from_name": (c_int, [c_char_p, _p(c_int)]),
    "dhsa_chat_template_name": (c_char_p, [c_int]),
    "dhsa_chat_apply": (c_int, [c_int, _p(ChatMessage), c_int64, c_int, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_chat_tokenize": (c_int, [c_int, c_void_p, _p(ChatMessage), c_int64, c_int, ctypes.c_uint, c_void_p,
                                   c_int64, _p(c_int64)]),
    "dhsa_chat_stop_ids": (c_int, [c_int, c_void_p, _p(ctypes.c_int32), c_int, _p(c_int)]),
}

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
    """As the CLI finds its default model: $DHSA_MODEL when set, else
    models/dhsa-retrieval-8m.gguf of this checkout (python/dhsa/../../models)."""
    env = os.environ.get("DHSA_MODEL")
    if env:
        return env
    return str(Path(__file__).resolve().parent.parent.parent / "models" / DEFAULT_MODEL)


class Model:
    """A GGUF model (or a llama2.c checkpoint with tokenizer_path), read-only once
    loaded: any number of Sessions may use it. Model() loads the shipped default."""

    def __init__(self, path=None, tokenizer_path=None, check_finite=True):
        self._h, self._sessions = None, []
        L = _lib()
        self.path = str(path) if path is not None else default_model_path()
        p = L.dhsa_model_default_params()
        tp = str(tokenizer_path).encode() if tokenizer_path is not None else None
        p.tokenizer_path = tp
        p.check_finite = 1 if check_finite else 0
        h = c_void_p()
        check(L.dhsa_model_load(self.path.encode(), ctypes.byref(p), ctypes.byref(h)))
        self._h = h
        self._tok = L.dhsa_model_tokenizer(h)
        inf = L.dhsa_model_get_info(h).contents
        self.info = {n: (getattr(inf, n).decode() if n == "arch_name" else getattr(inf, n))
                     for n, _ in ModelInfo._fields_}

    def close(self):
        """Frees the model (its sessions first)."""
        for s in list(self._sessions):
            s.close()
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib().dhsa_model_free(h)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._h:
            raise ValueError("the model is closed")
        return self._h

    @property
    def n_vocab(self):
        return int(self.info["n_vocab"])

    @property
    def n_ctx_train(self):
        return int(self.info["n_ctx_train"])

    @property
    def bos(self):
        return int(_lib().dhsa_tokenizer_bos(self._tok))

    @property
    def eos(self):
        return int(_lib().dhsa_tokenizer_eos(self._tok))

    def routes(self, exact=False):
        """What the weight products run per weight type, e.g. "Q4_K, Q6_K:
        int8 avx512-vnni; F32: f32 avx512" (dhsa_model_routes)."""
        buf = ctypes.create_string_buffer(256)
        check(_lib().dhsa_model_routes(self._handle(), 1 if exact else 0, buf, 256))
        return buf.value.decode()

    def tokenize(self, text, add_bos=None, parse_special=False):
        """Token ids (list of int) of text (str or bytes). add_bos: None = as the
        vocabulary asks (the CLI's default), True / False to force."""
        self._handle()
        L = _lib()
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
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
        self._handle()
        L = _lib()
        a = np.ascontiguousarray(ids, dtype=np.int32)
        flags = _DETOK_SPECIAL if special else 0
        n = c_int64()
        L.dhsa_detokenize(self._tok, a.ctypes.data, a.size, flags, None, 0, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        check(L.dhsa_detokenize(self._tok, a.ctypes.data, a.size, flags, buf, n.value, ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8", "replace")

    def token_to_piece(self, token):
        """The bytes of one token (control tokens: b"")."""
        self._handle()
        buf = ctypes.create_string_buffer(512)
        n = c_int64()
        check(_lib().dhsa_token_to_piece(self._tok, int(token), 0, buf, 512, ctypes.byref(n)))
        return buf.raw[:n.value]

    def _template(self, template):
        L = _lib()
        if template is None:
            t = L.dhsa_chat_detect(L.dhsa_model_gguf(self._handle()))
        else:
            t = c_int()
            check(L.dhsa_chat_template_from_name(str(template).encode(), ctypes.byref(t)))
            t = t.value
        if t == 0:
            raise ValueError("the model names no chat template dhsa writes: pass template= one of "
                             + ", ".join(TEMPLATES))
        return t

    def chat_template(self, messages, add_generation_prompt=True, template=None):
        """The prompt text of messages ([{"role": ..., "content": ...}]) in the model's
        chat format (or template=NAME), as `dhsa run --chat` writes it."""
        L = _lib()
        t = self._template(template)
        keep = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
        arr = (ChatMessage * max(1, len(keep)))(*[ChatMessage(r, c) for r, c in keep])
        n = c_int64()
        L.dhsa_chat_apply(t, arr, len(keep), int(bool(add_generation_prompt)), None, 0, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        check(L.dhsa_chat_apply(t, arr, len(keep), int(bool(add_generation_prompt)), buf, n.value,
                                ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8", "replace")

    def chat_tokenize(self, messages, add_generation_prompt=True, template=None):
        """Token ids of messages in the model's chat format (or template=NAME), as
        `dhsa run --chat` feeds them: the template's markers are special tokens, the
        messages' text is plain text (a "<|im_end|>" in a message stays text), BOS as
        the vocabulary asks (dhsa_chat_tokenize)."""
        L = _lib()
        t = self._template(template)
        keep = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
        arr = (ChatMessage * max(1, len(keep)))(*[ChatMessage(r, c) for r, c in keep])
        flags = L.dhsa_tokenizer_default_flags(self._tok) & _ADD_BOS
        gen = int(bool(add_generation_prompt))
        n = c_int64()
        L.dhsa_chat_tokenize(t, self._tok, arr, len(keep), gen, flags, None, 0, ctypes.byref(n))
        out = (ctypes.c_int32 * max(1, n.value))()
        check(L.dhsa_chat_tokenize(t, self._tok, arr, len(keep), gen, flags, out, n.value, ctypes.byref(n)))
        return list(out[:n.value])

    def chat_stop_ids(self, template=None):
        """The ids that end a model's turn in its chat format."""
        t = self._template(template)
        out = (ctypes.c_int32 * 16)()
        n = c_int()
        check(_lib().dhsa_chat_stop_ids(t, self._tok, out, 16, ctypes.byref(n)))
        return list(out[:n.value])


class Session:
    """One sequence through a Model: KV cache, routing index, last logits.

    Defaults are the CLI's: ctx the trained context, attn "dense", the router's
    density (0.0625) for the sparse methods, kv "f32" ("f16", or "q8_0": 8-bit
    blocks of 32 read in place by attention), threads = online CPUs,
    ubatch the largest <= 512 that fits mem_limit. mem_limit (bytes) bounds the
    process's peak RSS; a plan over it raises DhsaError(DHSA_ERR_MEMORY_BUDGET).
    exact=True runs the weight products on the exact F32 route (the CLI's
    --exact); the default is the fast integer route for quantized weights
    (docs/quant.md); Model.routes(exact) says which route each type takes."""

    def __init__(self, model, ctx=None, attn="dense", density=None, budget=None, kv="f32", mem_limit=None,
                 threads=None, ubatch=None, dense_below=None, exact=False):
        if attn not in ATTN:
            raise ValueError("attn is one of %s, not %r" % (", ".join(ATTN), attn))
        if kv not in KV:
            raise ValueError("kv is f32, f16 or q8_0, not %r" % (kv,))
        if density is not None and budget is not None:
            raise ValueError("give density or budget, not both")
        self._h = self._ctx = None
        L = _lib()
        self.model = model
        model._handle()
        p = L.dhsa_session_default_params()
        p.n_ctx = int(ctx or 0)
        p.n_ubatch = int(ubatch or 0)
        p.kv_type = KV[kv]
        p.mem_limit = int(mem_limit or 0)
        p.attn = ATTN[attn]
        p.exact = 1 if exact else 0
        if density is not None:
            if not 0 < float(density) <= 1:
                raise ValueError("density must be in (0, 1], not %r" % (density,))
            p.router.density = float(density)
        if budget is not None:
            p.router.budget_tokens = int(budget)
        if dense_below is not None:
            p.router.dense_below = int(dense_below)
        cp = L.dhsa_ctx_default_params()
        cp.n_threads = int(threads or 0)
        ctxh = c_void_p()
        check(L.dhsa_ctx_create(ctypes.byref(cp), ctypes.byref(ctxh)))
        self._ctx = ctxh
        h = c_void_p()
        try:
            check(L.dhsa_session_create(ctxh, model._handle(), ctypes.byref(p), ctypes.byref(h)))
        except Exception:
            L.dhsa_ctx_free(ctxh)
            self._ctx = None
            raise
        self._h = h
        self.attn = attn
        self._logits = np.zeros(model.n_vocab, dtype=np.float32)
        self._have_logits = False
        self.tokens = []          # what the cache holds
        self.n_reused = 0         # prompt tokens the last generate took from the cache
        model._sessions.append(self)

    def close(self):
        L = _lib()
        h, self._h = getattr(self, "_h", None), None
        if h:
            L.dhsa_session_free(h)
        c, self._ctx = getattr(self, "_ctx", None), None
        if c:
            L.dhsa_ctx_free(c)
        m = getattr(self, "model", None)
        if m is not None and self in m._sessions:
            m._sessions.remove(self)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._h:
            raise ValueError("the session is closed")
        return self._h

    @property
    def length(self):
        """Tokens in the cache."""
        return int(_lib().dhsa_session_length(self._handle()))

    @property
    def n_ctx(self):
        return int(_lib().dhsa_session_get_plan(self._handle()).contents.n_ctx)

    @property
    def plan(self):
        """The memory plan (dict of bytes; dhsa_mem_plan)."""
        pl = _lib().dhsa_session_get_plan(self._handle()).contents
        return {n: getattr(pl, n) for n, _ in MemPlan._fields_}

    def reset(self):
        check(_lib().dhsa_session_reset(self._handle()))
        self.tokens = []
        self._have_logits = False

    def truncate(self, n):
        """Keeps the first n tokens of the cache (dhsa_session_truncate)."""
        check(_lib().dhsa_session_truncate(self._handle(), int(n)))
        del self.tokens[int(n):]
        self._have_logits = False

    def eval(self, ids):
        """Appends ids to the cache; afterwards logits() are those after the last one."""
        a = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        if a.size == 0:
            return
        st = _lib().dhsa_session_eval(self._handle(), a.ctypes.data, a.size, self._logits.ctypes.data)
        if st:
            self._have_logits = False
            check(st)
        self.tokens.extend(int(x) for x in a)
        self._have_logits = True

    def logits(self):
        """The logits after the last evaluated token (a copy, float32 [n_vocab])."""
        if not self._have_logits:
            raise ValueError("no logits: eval some tokens first")
        return self._logits.copy()

    def _prompt_ids(self, prompt, chat, template):
        m = self.model
        messages = isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], dict)
        if chat and (isinstance(prompt, str) or messages):
            # the messages stay plain text: only the template's markers are special
            return m.chat_tokenize([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
                                   template=template)
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(x) for x in prompt]
        if isinstance(prompt, str):
            return m.tokenize(prompt)
        raise TypeError("prompt is a str, a list of token ids, or (chat=True) a list of messages")

    def generate(self, prompt=None, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.0, repeat_last_n=64, seed=42, stop=None, ignore_eos=False, chat=False,
                 template=None, stream=False, tokens=False):
        """Generates up to max_tokens tokens after prompt (the CLI's `dhsa run` with the
        same options: the same defaults and, for the same seed, the same tokens).

        prompt: text (BOS added as the vocabulary asks), token ids, or with chat=True a
        user message or a list of messages put through the chat template; None
        continues from what the session holds. A prompt that shares a prefix with the
        cache reuses it (the rest is evaluated; n_reused says how much). Stops at EOS
        (and the chat format's end-of-turn ids with chat), at a stop string (the text
        ends before it) or at a full context. Returns the text, or with stream=True
        yields it in pieces (never inside a UTF-8 character); tokens=True gives the
        generated ids instead of text."""
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError("stop is a non-empty string or a list of them")
        m, L = self.model, _lib()
        stop_ids = [] if ignore_eos else ([m.eos] if m.eos >= 0 else [])
        if chat and not ignore_eos:
            stop_ids += [i for i in m.chat_stop_ids(template) if i not in stop_ids]
        if prompt is not None:
            ids = self._prompt_ids(prompt, chat, template)
            if not ids:
                raise ValueError("the prompt is empty and the vocabulary adds no BOS")
            if len(ids) > self.n_ctx:
                raise ValueError("the prompt has %d tokens but the context holds %d" % (len(ids), self.n_ctx))
            keep = 0
            while keep < min(len(ids), len(self.tokens)) and ids[keep] == self.tokens[keep]:
                keep += 1
            keep = min(keep, len(ids) - 1)  # the last one runs again for its logits
            self.truncate(keep)
            self.n_reused = keep
            self.eval(ids[keep:])
        elif not self._have_logits:
            raise ValueError("no prompt and nothing evaluated: give a prompt")
        sp = L.dhsa_sampler_default_params()
        sp.temperature, sp.top_k, sp.top_p, sp.min_p = float(temperature), int(top_k), float(top_p), float(min_p)
        sp.repeat_penalty, sp.repeat_last_n, sp.seed = float(repeat_penalty), int(repeat_last_n), int(seed) & (2**64 - 1)
        smp = c_void_p()
        check(L.dhsa_sampler_create(ctypes.byref(sp), m.n_vocab, ctypes.byref(smp)))
        gen = self._run(smp, max_tokens, stop_ids, stops, tokens)
        if stream:
            return gen
        out = list(gen)
        return out if tokens else "".join(out)

    def _run(self, smp, max_tokens, stop_ids, stops, tokens):
        L = _lib()
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, sent = "", 0
        hold = max((len(s) for s in stops), default=0)
        try:
            for i in range(max_tokens):
                hist = np.ascontiguousarray(self.tokens, dtype=np.int32)
                nxt = ctypes.c_int32()
                check(L.dhsa_sampler_sample(smp, self._logits.ctypes.data, hist.ctypes.data, hist.size,
                                            ctypes.byref(nxt)))
                t = int(nxt.value)
                if t in stop_ids:
                    break
                if tokens:
                    yield t
                else:
                    text += dec.decode(self.model.token_to_piece(t))
                    # a stop string starts at or after `sent` (what could begin one was held back)
                    cut = min((text.find(s, sent) for s in stops if text.find(s, sent) >= 0), default=-1)
                    if cut >= 0:
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
                if i + 1 == max_tokens or self.length >= self.n_ctx:
                    break
                self.eval([t])
            if not tokens:
                text += dec.decode(b"", final=True)
                if len(text) > sent:
                    yield text[sent:]
        finally:
            L.dhsa_sampler_free(smp)
