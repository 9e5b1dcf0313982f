"""The chat templates of the catalog's real models (models/catalog), rendered
by jinja2 as transformers renders them, against dhsa's rendering.

For each catalog model whose file is pulled ($DHSA_MODELS, default
~/.cache/dhsa/models; `dhsa pull NAME`), the template text is read from the
GGUF (tokenizer.chat_template, by a small reader here, not by dhsa), rendered
with jinja2 in transformers' environment (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson,
messages / tools=None / documents=None / add_generation_prompt / bos_token /
eos_token) for a set of conversations, and compared byte for byte with
dhsa.Model.chat_template (dhsa_chat_apply in the format dhsa_chat_choose
picks from the file, as `dhsa run --chat`, `dhsa chat` and `dhsa serve` do).
A model that is not pulled, a file without a template, or a missing jinja2
(pip install jinja2; .ci/run installs it) is skipped, saying so. The
comparison can fail: ChatML without the model's default system message is
caught on the user-only conversation.

Run: PYTHONPATH=python DHSA_LIB=build/libdhsa.so python3 -m pytest -q python/tests/test_chat_jinja.py
(about 8 s with the four catalog chat models pulled).
"""
import json
import os
import pathlib
import struct

import pytest

import dhsa

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS = pathlib.Path(os.environ.get("DHSA_MODELS") or pathlib.Path.home() / ".cache" / "dhsa" / "models")

CONVERSATIONS = [
    ("system + user", True, [("system", "You are a helpful assistant."), ("user", "Hello!")]),
    ("user only", True, [("user", "What is 2+2?")]),
    ("multi-turn with system", True,
     [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")]),
    ("multi-turn without system", True,
     [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")]),
    ("empty user message", True, [("user", "")]),
    ("empty system message", True, [("system", ""), ("user", "Hi")]),
    ("no generation prompt", False, [("user", "Hi"), ("assistant", "Hello.")]),
    ("whitespace around contents", True, [("user", "  spaces around \n\n"), ("assistant", "  and here  "), ("user", "ok")]),
    ("non-Latin and emoji", True, [("system", "R\u00e9ponds en fran\u00e7ais."), ("user", "\u65e5\u672c\u8a9e \U0001f44b")]),
    ("code", True, [("user", "def f(x):\n    return x * 2\n# explain")]),
    ("a system message later", True, [("user", "Hi"), ("system", "Answer in one word."), ("user", "Why?")]),
]


def catalog():
    """(name, file) of the catalog's downloaded models."""
    out, name = [], None
    for line in (REPO / "models" / "catalog").read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1]
        elif line.startswith("file =") and name:
            out.append((name, line.split("=", 1)[1].strip()))
    return out


def gguf_metadata(path, keys):
    """The values of keys (strings, and the token list's entries at the ids
    asked for in keys as ("tokens", id)) from a GGUF's metadata."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    out = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError("%s: not a GGUF file" % path)
        _, _, n_kv = struct.unpack("<IQQ", f.read(20))

        def rstr():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        for _ in range(n_kv):
            k = rstr().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if t == 8:
                v = rstr()
                if k in keys:
                    out[k] = v.decode()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et == 8:
                    items = [rstr() for _ in range(n)]
                    if k == "tokenizer.ggml.tokens":
                        out[k] = items
                else:
                    f.seek(sizes[et] * n, 1)
            else:
                v = struct.unpack(fmt[t], f.read(sizes[t]))[0]
                if k in keys:
                    out[k] = v
    return out


def jinja_render(template, messages, add_generation_prompt, bos_token, eos_token):
    """The text transformers' apply_chat_template(tokenize=False) writes."""
    jinja2 = pytest.importorskip("jinja2", reason="jinja2 is not installed (pip install jinja2; .ci/run does)")
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=add_generation_prompt,
                                            bos_token=bos_token, eos_token=eos_token)


@pytest.mark.parametrize("name,path", [pytest.param(n, MODELS / f, id=n) for n, f in catalog()])
def test_template_as_jinja2(name, path):
    pytest.importorskip("jinja2", reason="jinja2 is not installed (pip install jinja2; .ci/run does)")
    if not path.exists():
        pytest.skip("%s is not pulled (dhsa pull %s): its template is not checked" % (path, name))
    meta = gguf_metadata(path, {"tokenizer.chat_template", "tokenizer.ggml.bos_token_id",
                                "tokenizer.ggml.eos_token_id"})
    template = meta.get("tokenizer.chat_template")
    if template is None:
        pytest.skip("%s has no tokenizer.chat_template: nothing to render with jinja2 (dhsa picks the format by "
                    "architecture, docs/chat.md)" % name)
    tokens = meta.get("tokenizer.ggml.tokens", [])

    def token(key):
        i = meta.get(key)
        return tokens[i].decode("utf-8", "replace") if i is not None and i < len(tokens) else ""

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    with dhsa.Model(str(path)) as m:
        fmt, how = m.chat_format()
        assert "checked against jinja2" in how, (name, fmt, how)
        bad = []
        for what, gen, conv in CONVERSATIONS:
            msgs = [{"role": r, "content": c} for r, c in conv]
            want = jinja_render(template, msgs, gen, bos, eos)
            # dhsa's text never holds the template's {{ bos_token }}: the
            # tokenizer adds BOS where the vocabulary asks (docs/chat.md)
            if "bos_token" in template and bos and want.startswith(bos):
                want = want[len(bos):]
            got = m.chat_template(msgs, gen)
            if got != want:
                bad.append("%s (%s):\n  jinja2: %r\n  dhsa:   %r" % (what, fmt, want, got))
        assert not bad, "%s: %d of %d conversations differ:\n%s" % (name, len(bad), len(CONVERSATIONS),
                                                                     "\n".join(bad))
        # the comparison can fail: plain ChatML leaves out the default system message
        msgs = [{"role": "user", "content": "What is 2+2?"}]
        assert m.chat_template(msgs, True, template="chatml") != jinja_render(template, msgs, True, bos, eos)

