"""_evaluate.py: the measurements of `dhsa eval` from Python, over the C API's
"Evaluation" block (include/dhsa.h; src/eval/evaluate.c), the same code the
CLI prints:

    m = dhsa.Model()
    r = dhsa.eval_fidelity(m, text, ["dense", ("dhsa", 0.125), ("stream", 0.125)], window=256)
    r["ppl_dense"], r["results"][1]["kl"], r["results"][1]["recall"]   # per layer

    tok = dhsa.Tokenizer(m.path)
    t = dhsa.retrieval_task(tok, "passkey", length=512, depth=0.25)
    a = dhsa.eval_retrieval(m, t, "dhsa", density=0.05)
    a["answer"], a["hit"], a["first_wrong"], a["needle_selected"], a["needle"]

A method is "dense", "dhsa", "block", "stream", "oracle", or (name, density).
Routing: dhsa.eval_router(L, density) gives the eval defaults scaled to L
(docs/eval.md), and keyword arguments override fields of dhsa_router_params
by name (q_block=, sink_tokens=, local_tokens=, dense_below=, min_chunk=,
max_chunk=, chunk=, sim_window=, nms_window=, budget_tokens=, score_mode=).
Every C error becomes dhsa.DhsaError; an unknown method or routing field
is ValueError. docs/python.md, "Evaluation", says more.
"""
import ctypes

import numpy as np

from . import _capi
from ._capi import check, lib
from ._context import resolve
from ._runner import ATTN, Model

c_int64, c_int, c_double, c_void_p = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_void_p
_p = ctypes.POINTER
MAX_LAYERS = 64  # DHSA_EVAL_MAX_LAYERS
_KEEP_SPACE = 2  # DHSA_DETOKENIZE_KEEP_SPACE
NEEDLE = ("everywhere", "partly", "nowhere")  # dhsa_eval_needle


class EvalMethod(ctypes.Structure):
    """dhsa_eval_method."""
    _fields_ = [("attn", c_int), ("router", _capi.RouterParams)]


class FidelityParams(ctypes.Structure):
    """dhsa_eval_fidelity_params."""
    _fields_ = [("window", c_int64), ("max_windows", c_int64), ("recall", c_int)]


class FidelityResult(ctypes.Structure):
    """dhsa_eval_fidelity_result."""
    _fields_ = [(n, c_double) for n in ("kl", "top1", "ppl", "ppl_dense", "kl_late", "top1_late",
                                        "density_used", "density_used_late")] + [
        ("n_predicted", c_int64), ("n_predicted_late", c_int64), ("recall", _p(c_double))]


class FidelityInfo(ctypes.Structure):
    """dhsa_eval_fidelity_info."""
    _fields_ = [("window", c_int64), ("n_windows", c_int64), ("n_text", c_int64), ("n_predicted", c_int64),
                ("ppl_dense", c_double)]


class AnswerParams(ctypes.Structure):
    """dhsa_eval_answer_params."""
    _fields_ = [("method", EvalMethod), ("max_tokens", c_int64), ("n_ctx", c_int64),
                ("stop", _p(ctypes.c_int32)), ("n_stop", c_int), ("detok_flags", ctypes.c_uint)]


class Answer(ctypes.Structure):
    """dhsa_eval_answer."""
    _fields_ = [("text", ctypes.c_char * 4096), ("n_tokens", c_int64), ("density_used", c_double),
                ("mean_chunk", c_double), ("hit", c_int), ("first_wrong", c_int64), ("n_layer", c_int64),
                ("needle_selected", c_double * MAX_LAYERS), ("selected_at_wrong", c_double * MAX_LAYERS),
                ("needle", c_int)]


class NiahParams(ctypes.Structure):
    """dhsa_niah_params."""
    _fields_ = [("length", c_int64), ("depth", c_double), ("needle", ctypes.c_char_p), ("sentences", c_void_p),
                ("n_sentences", c_int64), ("tmpl", c_int)]


class NiahPrompt(ctypes.Structure):
    """dhsa_niah_prompt."""
    _fields_ = [("ids", _p(ctypes.c_int32)), ("n_ids", c_int64), ("depth_used", c_double),
                ("n_sentences", c_int64), ("stop", ctypes.c_int32 * 16), ("n_stop", c_int)]


class RulerParams(ctypes.Structure):
    """dhsa_ruler_params."""
    _fields_ = [("task", c_int), ("length", c_int64), ("depth", c_double), ("seed", ctypes.c_uint64),
                ("split", c_int), ("key_kind", c_int), ("value_kind", c_int), ("haystack", c_int),
                ("prose", c_void_p), ("prose_len", c_int64), ("words", c_void_p), ("words_len", c_int64),
                ("n_keys", c_int), ("n_values", c_int), ("n_queries", c_int), ("n_chains", c_int), ("n_hops", c_int),
                ("n_common", c_int), ("freq_common", c_int), ("freq_uncommon", c_int), ("alpha", c_double),
                ("tmpl", c_int)]


class RulerPrompt(ctypes.Structure):
    """dhsa_ruler_prompt."""
    _fields_ = [("ids", _p(ctypes.c_int32)), ("n_ids", c_int64), ("text", c_void_p), ("n_expected", c_int),
                ("expected", (ctypes.c_char * 48) * 16), ("depth_used", c_double), ("n_units", c_int64),
                ("answer_tokens", c_int64), ("stop", ctypes.c_int32 * 16), ("n_stop", c_int),
                ("n_spans", c_int), ("span_of", c_int * 64), ("span_lo", c_int64 * 64), ("span_hi", c_int64 * 64)]


class CopyLayout(ctypes.Structure):
    """dhsa_eval_copy_layout."""
    _fields_ = [(n, c_int64) for n in ("first", "second", "control", "passage", "n_ids")]


class CopyResult(ctypes.Structure):
    """dhsa_eval_copy_result."""
    _fields_ = [(n, c_double) for n in ("first_loss", "rep_loss", "score", "density_used", "copy_keys_selected",
                                        "copy_mass", "control_mass", "copy_mass_kept")]


LP64_SIZES = {"CopyLayout": 40, "CopyResult": 64, "NiahParams": 48, "NiahPrompt": 104, "EvalMethod": 200, "FidelityParams": 24, "FidelityResult": 88, "FidelityInfo": 40,
              "AnswerParams": 232, "Answer": 5176, "RulerParams": 128, "RulerPrompt": 2176}

_PROTOTYPES = {
    "dhsa_eval_router_params": (_capi.RouterParams, [c_int64, c_double]),
    "dhsa_eval_fidelity_default_params": (FidelityParams, []),
    "dhsa_eval_fidelity": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, _p(FidelityParams), _p(EvalMethod),
                                   c_int64, _p(FidelityResult), _p(FidelityInfo)]),
    "dhsa_eval_answer_default_params": (AnswerParams, []),
    "dhsa_eval_generate": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, _p(AnswerParams), _p(Answer)]),
    "dhsa_eval_retrieval": (c_int, [c_void_p, c_void_p, _p(_capi.Task), _p(AnswerParams), _p(Answer)]),
    "dhsa_eval_copy_sequence": (c_int, [c_void_p, c_int64, c_void_p, c_int64, c_int64, c_double, ctypes.c_int32,
                                        c_void_p, _p(CopyLayout)]),
    "dhsa_eval_copy": (c_int, [c_void_p, c_void_p, _p(EvalMethod), c_void_p, _p(CopyLayout), _p(CopyResult)]),
    "dhsa_eval_sample_tokens": (c_int, [c_void_p, c_void_p, c_int64, ctypes.c_uint64, c_void_p]),
    "dhsa_eval_passage_tokens": (c_int, [c_void_p, c_int, c_void_p, c_int64, _p(c_int64)]),
    "dhsa_niah_default_params": (NiahParams, []),
    "dhsa_niah_build": (c_int, [c_void_p, _p(NiahParams), _p(NiahPrompt)]),
    "dhsa_niah_free": (None, [_p(NiahPrompt)]),
    "dhsa_niah_answer_has": (c_int, [ctypes.c_char_p, c_int64, ctypes.c_char_p]),
    "dhsa_chat_template_from_name": (c_int, [ctypes.c_char_p, _p(c_int)]),
    "dhsa_ruler_default_params": (RulerParams, []),
    "dhsa_ruler_preset": (c_int, [ctypes.c_char_p, _p(RulerParams)]),
    "dhsa_ruler_build": (c_int, [c_void_p, _p(RulerParams), _p(RulerPrompt)]),
    "dhsa_ruler_free": (None, [_p(RulerPrompt)]),
    "dhsa_ruler_score": (c_double, [_p(RulerPrompt), ctypes.c_char_p, c_int64]),
    "dhsa_eval_ruler": (c_int, [c_void_p, c_void_p, _p(RulerPrompt), _p(AnswerParams), _p(Answer)]),
    "dhsa_ruler_load_prose": (c_int, [ctypes.c_char_p, c_int, _p(c_void_p), _p(c_int64)]),
    "dhsa_ruler_load_words": (c_int, [ctypes.c_char_p, _p(c_void_p), _p(c_int64)]),
    "dhsa_ruler_text_free": (None, [c_void_p]),
}

_L = None


def _lib():
    global _L
    if _L is None:
        L = lib()
        for name, (res, args) in _PROTOTYPES.items():
            fn = getattr(L, name)  # AttributeError names a symbol an older library lacks
            fn.restype = res
            fn.argtypes = args
        _L = L
    return _L


_ROUTER_FIELDS = {n for n, _ in _capi.RouterParams._fields_} - {"predictor", "method"}


def eval_router(length, density=0.125, **fields):
    """dhsa_eval_router_params(length, density) as a dict of its fields, with
    `fields` (names of dhsa_router_params) overriding."""
    r = _router(length, density, fields)
    return {n: getattr(r, n) for n, _ in _capi.RouterParams._fields_ if n != "predictor"}


def _router(length, density, fields):
    r = _lib().dhsa_eval_router_params(int(length), float(density))
    for k, v in fields.items():
        if k not in _ROUTER_FIELDS:
            raise ValueError("%r is not a routing field (%s)" % (k, ", ".join(sorted(_ROUTER_FIELDS))))
        setattr(r, k, v)
    return r


def _method(spec, length, default_density, routing):
    if isinstance(spec, (tuple, list)):
        name, density = spec
    else:
        name, density = spec, default_density
    if name not in ATTN:
        raise ValueError("a method is one of %s, not %r" % (", ".join(ATTN), name))
    if name == "dense":
        density = 1.0
    if not 0 < float(density) <= 1:
        raise ValueError("density must be in (0, 1], not %r" % (density,))
    return name, float(density), EvalMethod(ATTN[name], _router(length, density, routing))


def _ctx(ctx, threads):
    return resolve(ctx, threads)


def eval_fidelity(model, text, methods=("dhsa", "block", "stream"), window=None, max_windows=8, recall=True,
                  density=0.125, ctx=None, threads=None, **routing):
    """KL, top-1, perplexities, density used and per-layer recall of each method
    against dense (dhsa_eval_fidelity). text: str (tokenized without BOS, as
    `dhsa eval fidelity -f` does) or token ids. window: tokens per window, BOS
    included (None: the trained context). Returns a dict like the CLI's --json:
    window, n_windows, n_text, n_predicted, ppl_dense, results (one dict per
    method: method, density, kl, top1, ppl, ppl_dense, kl_late, top1_late,
    density_used, density_used_late, n_predicted, n_predicted_late, recall)."""
    if not isinstance(model, Model):
        raise TypeError("model must be a dhsa.Model")
    ids = model.tokenize(text, add_bos=False) if isinstance(text, (str, bytes)) else list(text)
    arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).astype(np.int32))
    W = int(window) if window else int(model.n_ctx_train)
    specs = [_method(s, W, density, routing) for s in methods]
    n = len(specs)
    ms = (EvalMethod * max(1, n))(*[s[2] for s in specs])
    nl = int(model.info["n_layer"])
    recs = [(c_double * nl)() for _ in range(n)]
    res = (FidelityResult * max(1, n))()
    for i in range(n):
        res[i].recall = ctypes.cast(recs[i], _p(c_double))
    L = _lib()
    p = L.dhsa_eval_fidelity_default_params()
    p.window, p.max_windows, p.recall = W, int(max_windows), int(bool(recall))
    info = FidelityInfo()
    c = _ctx(ctx, threads)
    with c._lock, model._use() as mh:
        check(L.dhsa_eval_fidelity(c._live_handle(), mh, arr.ctypes.data, arr.size, ctypes.byref(p),
                                   ms, n, res, ctypes.byref(info)))
    out = {"window": info.window, "n_windows": info.n_windows, "n_text": info.n_text,
           "n_predicted": info.n_predicted, "ppl_dense": info.ppl_dense, "results": []}
    for i, (name, dens, _) in enumerate(specs):
        r = res[i]
        d = {f: getattr(r, f) for f, _ in FidelityResult._fields_ if f != "recall"}
        d.update(method=name, density=dens, recall=list(recs[i]))
        out["results"].append(d)
    return out


def _answer_params(model, method, density, length, max_tokens, stop, routing):
    name, dens, me = _method(method, length, density, routing)
    L = _lib()
    p = L.dhsa_eval_answer_default_params()
    p.method = me
    if max_tokens is not None and int(max_tokens) < 0:
        raise ValueError("max_tokens must be >= 0 (0 = the default), not %r" % (max_tokens,))
    p.max_tokens = int(max_tokens or 0)
    keep = None
    if stop is not None:
        keep = (ctypes.c_int32 * max(1, len(stop)))(*[int(x) for x in stop])
        p.stop, p.n_stop = ctypes.cast(keep, _p(ctypes.c_int32)), len(stop)
    return p, keep


def _answer_dict(a, task):
    d = {"answer": a.text.decode("utf-8", "replace"), "n_tokens": a.n_tokens, "density_used": a.density_used,
         "mean_chunk": a.mean_chunk}
    if task:
        nl = a.n_layer
        d.update(hit=bool(a.hit), first_wrong=a.first_wrong, needle_selected=list(a.needle_selected[:nl]),
                 selected_at_wrong=list(a.selected_at_wrong[:nl]), needle=NEEDLE[a.needle])
    return d


def eval_generate(model, ids, method="dense", density=0.125, max_tokens=12, stop=None, keep_space=False,
                  length=None, ctx=None, threads=None, **routing):
    """The greedy answer to the prompt ids under a method (dhsa_eval_generate):
    dict answer, n_tokens, density_used, mean_chunk (dhsa and block: the prompt's
    keys per chunk; 0 otherwise). stop: ids that end it (None: EOS);
    length: the L the routing defaults are scaled to (None: len(ids))."""
    if not isinstance(model, Model):
        raise TypeError("model must be a dhsa.Model")
    arr = np.ascontiguousarray(np.asarray(list(ids), dtype=np.int64).astype(np.int32))
    p, keep = _answer_params(model, method, density, length or arr.size, max_tokens, stop, routing)
    p.detok_flags = _KEEP_SPACE if keep_space else 0
    a = Answer()
    c = _ctx(ctx, threads)
    with c._lock, model._use() as mh:
        check(_lib().dhsa_eval_generate(c._live_handle(), mh, arr.ctypes.data, arr.size,
                                        ctypes.byref(p), ctypes.byref(a)))
    del keep
    return _answer_dict(a, False)


def eval_retrieval(model, task, method="dense", density=0.125, max_tokens=None, length=None, ctx=None,
                   threads=None, **routing):
    """A retrieval task (dhsa.retrieval_task) answered greedily under a method,
    scored and explained (dhsa_eval_retrieval): dict answer, n_tokens,
    density_used, mean_chunk, hit, first_wrong (the first answer token that leaves the
    expected answer), needle_selected / selected_at_wrong (per layer, the share
    of the needle's keys the layouts selected: least over the answer's rows /
    at the row of the first wrong token), needle ("everywhere", "partly",
    "nowhere": what a miss is put down to). length: the L the routing is
    scaled to (None: the task's prompt length; the CLI uses the target
    length)."""
    if not isinstance(model, Model):
        raise TypeError("model must be a dhsa.Model")
    p, keep = _answer_params(model, method, density, length or task._t.n_ids, max_tokens, None, routing)
    a = Answer()
    c = _ctx(ctx, threads)
    with c._lock, model._use() as mh:
        check(_lib().dhsa_eval_retrieval(c._live_handle(), mh, ctypes.byref(task._t), ctypes.byref(p),
                                         ctypes.byref(a)))
    return _answer_dict(a, True)


def niah_prompt(model, needle, length=1024, depth=0.5, sentences=None, template=None):
    """An `eval niah` prompt (dhsa_niah_build) with the model's tokenizer: dict
    ids (list), depth_used, n_sentences, stop (the ids that end an answer).
    sentences: a list of str (None: the built-in haystack); template: None
    (plain completion prompt) or a chat template name ("chatml", "llama3", ...)."""
    if not isinstance(model, Model):
        raise TypeError("model must be a dhsa.Model")
    L = _lib()
    p = L.dhsa_niah_default_params()
    p.length, p.depth = int(length), float(depth)
    nb = needle.encode("utf-8")
    p.needle = nb
    keep = None
    if sentences is not None:
        keep = (ctypes.c_char_p * max(1, len(sentences)))(*[x.encode("utf-8") for x in sentences])
        p.sentences, p.n_sentences = ctypes.cast(keep, c_void_p), len(sentences)
    if template is not None:
        t = c_int()
        check(L.dhsa_chat_template_from_name(str(template).encode(), ctypes.byref(t)))
        p.tmpl = t.value
    pr = NiahPrompt()
    try:
        with model._use():
            check(L.dhsa_niah_build(model._tok, ctypes.byref(p), ctypes.byref(pr)))
        return {"ids": list(pr.ids[:pr.n_ids]), "depth_used": pr.depth_used, "n_sentences": pr.n_sentences,
                "stop": list(pr.stop[:pr.n_stop])}
    finally:
        L.dhsa_niah_free(ctypes.byref(pr))
        del keep


def niah_answer_has(answer, number):
    """True when the answer states the needle's number (dhsa_niah_answer_has: a
    maximal digit run, thousands groups allowed, no decimal part)."""
    b = answer.encode("utf-8")
    r = _lib().dhsa_niah_answer_has(b, len(b), str(number).encode())
    if r < 0:
        raise ValueError("number must be 1..32 decimal digits, not %r" % (number,))
    return bool(r)


def _i32(x):
    return np.ascontiguousarray(np.asarray(list(x), dtype=np.int64).astype(np.int32))


def sample_tokens(model, n, seed=1, ctx=None, threads=None):
    """n tokens of stories the model samples itself (dhsa_eval_sample_tokens:
    temperature 1, fresh 256-token sessions, BOS/EOS dropped): eval copy's filler."""
    out = np.zeros(max(1, int(n)), dtype=np.int32)
    c = _ctx(ctx, threads)
    with c._lock, model._use() as mh:
        check(_lib().dhsa_eval_sample_tokens(c._live_handle(), mh, int(n), int(seed), out.ctypes.data))
    return out[:int(n)].tolist()


def passage_tokens(model, words=False):
    """The ordinary tokens a copy passage is drawn from (whole-word pieces with words)."""
    L = _lib()
    out = np.zeros(model.n_vocab, dtype=np.int32)
    n = c_int64()
    with model._use():
        check(L.dhsa_eval_passage_tokens(model._tok, int(bool(words)), out.ctypes.data, out.size, ctypes.byref(n)))
    return out[:n.value].tolist()


def copy_sequence(filler, passage, length, depth, bos=-1):
    """[BOS] filler passage filler passage of exactly `length` tokens
    (dhsa_eval_copy_sequence): (ids, spans) with spans a dict first, second,
    control, passage, n_ids. bos < 0: no BOS."""
    f, p = _i32(filler), _i32(passage)
    ids = np.zeros(max(1, int(length)), dtype=np.int32)
    at = CopyLayout()
    check(_lib().dhsa_eval_copy_sequence(f.ctypes.data, f.size, p.ctypes.data, p.size, int(length), float(depth),
                                         int(bos), ids.ctypes.data, ctypes.byref(at)))
    return ids[:at.n_ids].tolist(), {n: getattr(at, n) for n, _ in CopyLayout._fields_}


def eval_copy(model, ids, spans, method="dense", density=0.125, length=None, ctx=None, threads=None, **routing):
    """One copy sequence under a method (dhsa_eval_copy): dict first_loss,
    rep_loss, score (the loss drop), density_used, copy_keys_selected,
    copy_mass, control_mass, copy_mass_kept. spans: as copy_sequence gives."""
    if not isinstance(model, Model):
        raise TypeError("model must be a dhsa.Model")
    arr = _i32(ids)
    at = CopyLayout(**{n: int(spans[n]) for n, _ in CopyLayout._fields_})
    if at.n_ids != arr.size:
        raise ValueError("spans say %d ids, %d given" % (at.n_ids, arr.size))
    _, _, me = _method(method, length or arr.size, density, routing)
    r = CopyResult()
    c = _ctx(ctx, threads)
    with c._lock, model._use() as mh:
        check(_lib().dhsa_eval_copy(c._live_handle(), mh, ctypes.byref(me), arr.ctypes.data,
                                    ctypes.byref(at), ctypes.byref(r)))
    return {n: getattr(r, n) for n, _ in CopyResult._fields_}


# ------------------------------------------------------------------ ruler ---

RULER_TASKS = ("single_noise", "single_prose", "single_uuid", "single_word", "multikey", "multikey_needles",
               "multikey_uuid", "multivalue", "multiquery", "vt", "cwe", "fwe")
_RULER_COUNTS = ("n_keys", "n_values", "n_queries", "n_chains", "n_hops", "n_common", "freq_common",
                 "freq_uncommon", "alpha")


def _ruler_data(kind, split, path):
    """The Debian-packaged prose (split) or word list, as the library reads them."""
    L = _lib()
    buf, n = c_void_p(), c_int64()
    b = None if path is None else str(path).encode()
    if kind == "prose":
        check(L.dhsa_ruler_load_prose(b, split, ctypes.byref(buf), ctypes.byref(n)))
    else:
        check(L.dhsa_ruler_load_words(b, ctypes.byref(buf), ctypes.byref(n)))
    try:
        return ctypes.string_at(buf.value, n.value)
    finally:
        L.dhsa_ruler_text_free(buf)


def _ruler_build(model, task, length, depth, seed, split, template, prose_dir, words, counts):
    """dhsa_ruler_build of one prompt: (RulerPrompt, buffers to keep alive
    until dhsa_ruler_free)."""
    if not isinstance(model, Model):
        raise TypeError("model must be a dhsa.Model")
    if split not in ("dev", "test"):
        raise ValueError("split is 'dev' or 'test', not %r" % (split,))
    bad = set(counts) - set(_RULER_COUNTS)
    if bad:
        raise TypeError("unknown ruler parameters: %s" % ", ".join(sorted(bad)))
    L = _lib()
    p = L.dhsa_ruler_default_params()
    check(L.dhsa_ruler_preset(str(task).encode(), ctypes.byref(p)))
    p.length, p.depth, p.seed, p.split = int(length), float(depth), int(seed), 0 if split == "dev" else 1
    for k, v in counts.items():
        setattr(p, k, v)
    keep = []
    if p.haystack == 1 and p.task not in (6, 7):  # PROSE
        t = ctypes.create_string_buffer(_ruler_data("prose", p.split, prose_dir))
        keep.append(t)
        p.prose, p.prose_len = ctypes.cast(t, c_void_p), len(t.raw) - 1
    if p.task == 6:  # CWE
        t = ctypes.create_string_buffer(_ruler_data("words", p.split, words))
        keep.append(t)
        p.words, p.words_len = ctypes.cast(t, c_void_p), len(t.raw) - 1
    if template is not None:
        tm = c_int()
        check(L.dhsa_chat_template_from_name(str(template).encode(), ctypes.byref(tm)))
        p.tmpl = tm.value
    pr = RulerPrompt()
    model._handle()
    check(L.dhsa_ruler_build(model._tok, ctypes.byref(p), ctypes.byref(pr)))
    return pr, keep


def _ruler_dict(pr):
    exp = [pr.expected[i].value.decode() for i in range(pr.n_expected)]
    return {"ids": list(pr.ids[:pr.n_ids]), "text": ctypes.string_at(pr.text).decode("utf-8", "replace"),
            "expected": exp, "depth_used": pr.depth_used, "n_units": pr.n_units,
            "answer_tokens": pr.answer_tokens, "stop": list(pr.stop[:pr.n_stop]),
            "spans": [(pr.span_lo[i], pr.span_hi[i], exp[pr.span_of[i]]) for i in range(pr.n_spans)]}


def ruler_prompt(model, task, length=4096, depth=0.5, seed=1, split="test", template=None, prose_dir=None,
                 words=None, **counts):
    """A prompt of `dhsa eval ruler` (dhsa_ruler_build) with the model's tokenizer:
    dict ids (list), text, expected (the strings the answer should hold),
    depth_used (-1 for cwe / fwe), n_units, answer_tokens (RULER's budget), stop,
    spans (lo, hi, expected string): the token ranges where the needles state
    the expected strings (none for cwe / fwe).
    task: one of dhsa.RULER_TASKS; split: "dev" or "test" (disjoint pools of
    values and filler); template: None (plain completion prompt) or a chat
    template name; prose_dir / words: the prose and word list (None: the
    Debian packages gnu-standards and wamerican); counts: n_keys, n_values,
    n_queries, n_chains, n_hops, n_common, freq_common, freq_uncommon, alpha."""
    pr, keep = _ruler_build(model, task, length, depth, seed, split, template, prose_dir, words, counts)
    try:
        return _ruler_dict(pr)
    finally:
        _lib().dhsa_ruler_free(ctypes.byref(pr))
        del keep


def eval_ruler(model, task, length=4096, depth=0.5, seed=1, split="test", template=None, method="dense",
               density=0.125, max_tokens=None, ctx=None, threads=None, prose_dir=None, words=None, counts=None,
               **routing):
    """One RULER prompt (as ruler_prompt builds it) answered greedily under a
    method, scored and explained (dhsa_eval_ruler): dict prompt (ruler_prompt's
    dict), answer, n_tokens, density_used, mean_chunk, score (RULER's
    string_match_all), hit (score 1), needle_selected / selected_at_wrong (per
    layer, the share of the spans' keys the layouts selected: least over the
    answer's rows / at the prompt's last row), needle ("everywhere", "partly",
    "nowhere", over the layers that route). max_tokens None: RULER's budget
    for the task; counts: a dict as ruler_prompt's keywords; routing: as
    eval_generate's (the defaults scaled to `length`)."""
    pr, keep = _ruler_build(model, task, length, depth, seed, split, template, prose_dir, words, counts or {})
    try:
        p, keep2 = _answer_params(model, method, density, int(length), max_tokens, None, routing)
        a = Answer()
        c = _ctx(ctx, threads)
        with c._lock, model._use() as mh:
            check(_lib().dhsa_eval_ruler(c._live_handle(), mh, ctypes.byref(pr), ctypes.byref(p), ctypes.byref(a)))
        d = _answer_dict(a, True)
        d.pop("first_wrong")
        d["prompt"] = _ruler_dict(pr)
        d["score"] = float(_lib().dhsa_ruler_score(ctypes.byref(pr), a.text, len(a.text)))
        del keep2
        return d
    finally:
        _lib().dhsa_ruler_free(ctypes.byref(pr))
        del keep


def ruler_score(expected, answer):
    """RULER's string_match_all (dhsa_ruler_score): the share of the expected
    strings found in the answer, case-insensitively, as substrings."""
    exp = list(expected)
    if len(exp) > 16 or any(len(e.encode()) > 47 for e in exp):
        raise ValueError("at most 16 expected strings of at most 47 bytes")
    pr = RulerPrompt()
    pr.n_expected = len(exp)
    for i, e in enumerate(exp):
        pr.expected[i].value = e.encode()
    b = answer.encode("utf-8")
    return float(_lib().dhsa_ruler_score(ctypes.byref(pr), b, len(b)))
