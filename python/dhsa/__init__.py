"""dhsa: Python binding of the dhsa C library (memory-bounded attention).

ctypes over libdhsa.so and numpy arrays; no compiled extension. Install
with `pip install .` from the repository root (the library and the default
model go inside the package). The library is found through the environment
variable DHSA_LIB, else the one inside this package (pip install), else
../../build/libdhsa.so relative to it (a checkout), else the system's
library path; it is loaded on first use.

    PYTHONPATH=python DHSA_LIB=build/libdhsa.so python3 -c '
    import numpy as np, dhsa
    q = k = v = np.random.rand(1, 8, 1024, 64).astype(np.float32)
    print(dhsa.attention(q, k, v, causal=True).shape)'

Mask conventions follow PyTorch by name: key_padding_mask bool True =
ignore the key (nn.MultiheadAttention); attn_mask bool True = take part
(F.scaled_dot_product_attention); float masks are added. See docs/python.md.

Sparse attention: lay = dhsa.route(q, k, causal=True, density=0.0625)
(DHSA routing) gives a dhsa.Layout; dhsa.attention(q, k, v, causal=True,
sparse=lay) attends only to its key ranges. Also dhsa.KVIndex (decode),
dhsa.Predictor (learned boundaries), dhsa.synth() and dhsa.fidelity().
Evaluation tasks: dhsa.Tokenizer(gguf_path) and dhsa.retrieval_task(tok,
"passkey"|"multikey"|"multivalue", length, depth, seed) (the builders and
scoring of `dhsa eval passkey`); the measurements of `dhsa eval`:
dhsa.eval_fidelity(model, text, methods, window=) (KL, top-1, perplexity,
per-layer recall and density used against dense), dhsa.eval_retrieval(model,
task, method, density=) (greedy answer, hit, the per-miss explanation),
dhsa.eval_generate, dhsa.eval_router, dhsa.niah_prompt, dhsa.niah_answer_has,
dhsa.eval_copy with dhsa.copy_sequence, dhsa.sample_tokens, dhsa.passage_tokens;
the RULER-style suite: dhsa.ruler_prompt(model, task, length=, depth=, split=)
(dhsa.RULER_TASKS), answered, scored and each miss explained by
dhsa.eval_ruler(model, task, ..., method=, density=), or answered with
dhsa.eval_generate and scored by dhsa.ruler_score(expected, answer).
The model runner: dhsa.Model(path=None) (the shipped default model),
.tokenize / .detokenize / .chat_template, dhsa.Session(model, ctx=, attn=,
density=, kv=) with .eval(ids), .logits(), .generate(prompt, max_tokens,
temperature, ..., stream=True) yielding text pieces (the CLI's defaults).
Tests: python3 -m pytest -q python/tests (make test runs them).
"""

from ._capi import DhsaError, lib_path
from ._context import (Context, active_isa, default_context, mem_stats, peak_rss,
                       reset_peak_rss, rss, set_isa)
from ._attention import (attention, backend_in_use, from_bfloat16, to_bfloat16,
                         workspace_size)
from ._route import (KVIndex, Layout, Predictor, REST_HYBRID, REST_LONG, RouterParams, fidelity, layout_size,
                     route, route_sizes, synth)
from ._eval import Task, Tokenizer, retrieval_task
from ._runner import IncompleteJSONError, Model, Session
from ._evaluate import (copy_sequence, eval_copy, eval_fidelity, eval_generate, eval_retrieval, eval_router, eval_ruler,
                        niah_answer_has, niah_prompt, passage_tokens, RULER_TASKS, ruler_prompt, ruler_score,
                        sample_tokens)

__all__ = [
    "attention", "workspace_size", "backend_in_use",
    "route", "route_sizes", "RouterParams", "REST_HYBRID", "REST_LONG", "Layout", "layout_size",
    "Predictor", "KVIndex", "synth", "fidelity",
    "Tokenizer", "retrieval_task", "Task",
    "Model", "Session", "IncompleteJSONError",
    "eval_fidelity", "eval_retrieval", "eval_generate", "eval_router", "niah_prompt", "niah_answer_has",
    "RULER_TASKS", "ruler_prompt", "ruler_score", "eval_ruler",
    "eval_copy", "copy_sequence", "sample_tokens", "passage_tokens",
    "Context", "default_context", "mem_stats",
    "peak_rss", "rss", "reset_peak_rss",
    "active_isa", "set_isa",
    "to_bfloat16", "from_bfloat16",
    "DhsaError", "lib_path",
]

__version__ = "0.1.0"  # include/dhsa.h DHSA_VERSION
