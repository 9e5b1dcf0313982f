"""Tokenizer and retrieval tasks: dhsa.Tokenizer, dhsa.retrieval_task, dhsa.Task.

The same builders and scoring the CLI's `dhsa eval passkey|multikey|multivalue`
and `dhsa demo` use (src/eval/retrieval.c; dhsa.h "Retrieval tasks" block):

    tok = dhsa.Tokenizer("models/dhsa-retrieval-8m.gguf")
    t = dhsa.retrieval_task(tok, "passkey", length=4096, depth=0.25, seed=3)
    t.ids (numpy int32, BOS first), t.prompt, t.answer (" 48213"),
    t.numbers, t.spans (token ranges of the asked numbers), t.depth_used
    t.check(" 48213.") -> True;  t.selected(layout, g, row) -> share of the
    needle's keys a Layout selects for one query row of KV head g.
"""
import ctypes

import numpy as np

from . import _capi
from ._capi import check, lib

_KINDS = {"passkey": _capi.DHSA_TASK_PASSKEY, "multikey": _capi.DHSA_TASK_MULTIKEY,
          "multivalue": _capi.DHSA_TASK_MULTIVALUE}


class Tokenizer:
    """A GGUF file's tokenizer (the weights are not read)."""

    def __init__(self, path):
        L = lib()
        g = ctypes.c_void_p()
        check(L.dhsa_gguf_open(str(path).encode(), ctypes.byref(g)))
        t = ctypes.c_void_p()
        try:
            check(L.dhsa_tokenizer_from_gguf(g, ctypes.byref(t)))
        finally:
            L.dhsa_gguf_close(g)
        self._h = t

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            lib().dhsa_tokenizer_free(h)

    @property
    def n_vocab(self):
        return int(lib().dhsa_tokenizer_n_vocab(self._h))

    def encode(self, text, bos=True):
        """Token ids (numpy int32) of text, with the tokenizer's default flags (BOS) when bos."""
        L = lib()
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = L.dhsa_tokenizer_default_flags(self._h)
        if not bos:
            flags &= ~1  # DHSA_TOKENIZE_ADD_BOS
        n = ctypes.c_int64()
        L.dhsa_tokenize(self._h, b, len(b), flags, None, 0, ctypes.byref(n))
        out = np.zeros(max(1, n.value), dtype=np.int32)
        check(L.dhsa_tokenize(self._h, b, len(b), flags, out.ctypes.data, out.size, ctypes.byref(n)))
        return out[:n.value]

    def decode(self, ids):
        """Text of ids (the SPM leading space removed, as dhsa_detokenize does)."""
        L = lib()
        a = np.ascontiguousarray(ids, dtype=np.int32)
        n = ctypes.c_int64()
        L.dhsa_detokenize(self._h, a.ctypes.data, a.size, 0, None, 0, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        check(L.dhsa_detokenize(self._h, a.ctypes.data, a.size, 0, buf, n.value, ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8", "replace")


class Task:
    """One built task; its C struct is freed with the object."""

    def __init__(self, kind):
        self.kind = kind
        self._t = _capi.Task()

    def __del__(self):
        if getattr(self, "_t", None) is not None and self._t.ids:
            lib().dhsa_task_free(ctypes.byref(self._t))

    @property
    def ids(self):
        return np.ctypeslib.as_array(self._t.ids, shape=(self._t.n_ids,)).copy()

    @property
    def prompt(self):
        return self._t.prompt.decode("utf-8", "replace")

    @property
    def answer(self):
        return self._t.answer.decode()

    @property
    def numbers(self):
        return [int(self._t.numbers[i]) for i in range(self._t.n_numbers)]

    @property
    def spans(self):
        return [(int(self._t.span_lo[i]), int(self._t.span_hi[i])) for i in range(self._t.n_spans)]

    @property
    def depth_used(self):
        return float(self._t.depth_used)

    def check(self, text):
        """True when text's first numbers are the answer's, in order."""
        b = text.encode("utf-8")
        return bool(lib().dhsa_task_check(ctypes.byref(self._t), b, len(b)))

    def selected(self, layout, g, row):
        """Share of the asked numbers' keys the dhsa.Layout selects for query row `row` of KV head g."""
        if layout is None:
            return float(lib().dhsa_task_selected(ctypes.byref(self._t), None, g, row))
        with layout._use() as h:
            return float(lib().dhsa_task_selected(ctypes.byref(self._t), h, g, row))


def retrieval_task(tokenizer, kind, length=1024, depth=0.5, seed=1, filler=None, keywords=None,
                   n_keys=0, n_distract=1, heldout_numbers=True):
    """Builds a passkey / multikey / multivalue task of at most `length` tokens (dhsa_task_build).

    filler: text (str) or None for the library's built-in sentences; keywords: a list
    of str (multikey / multivalue) or None for the built-in list."""
    if kind not in _KINDS:
        raise ValueError("kind is passkey, multikey or multivalue, not %r" % (kind,))
    L = lib()
    p = L.dhsa_task_default_params()
    p.kind, p.length, p.depth, p.seed = _KINDS[kind], int(length), float(depth), int(seed)
    p.n_keys, p.n_distract, p.heldout_numbers = int(n_keys), int(n_distract), int(bool(heldout_numbers))
    keep = []
    if filler is not None:
        fb = ctypes.create_string_buffer(filler.encode("utf-8"))
        keep.append(fb)
        p.filler, p.filler_len = ctypes.cast(fb, ctypes.c_void_p), len(fb.raw) - 1
    if keywords is not None:
        arr = (ctypes.c_char_p * len(keywords))(*[w.encode("utf-8") for w in keywords])
        keep.append(arr)
        p.keywords, p.n_keywords = ctypes.cast(arr, ctypes.c_void_p), len(keywords)
    t = Task(kind)
    check(L.dhsa_task_build(tokenizer._h, ctypes.byref(p), ctypes.byref(t._t)))
    return t
