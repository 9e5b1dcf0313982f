#!/usr/bin/env python3
"""bench/real_models_peer.py: llama.cpp's vectors for the real models and for
every pre-tokenizer regex set dhsa runs.

Writes two fixtures that `make test` checks without llama.cpp:

  tests/real_models.tsv (tests/test_real_models.c), per pulled model of the
  catalog (smollm2-135m-instruct, gemma-3-270m, qwen2.5-coder-0.5b-instruct):
    tok    <TAB> MODEL <TAB> HEX(text) <TAB> ids
           a short mixed text (prose, numbers, code, Cyrillic, Japanese,
           Arabic, emoji), tokenized as llama.cpp does by default (BOS as the
           vocabulary says, special tokens parsed)
    greedy <TAB> MODEL <TAB> HEX(prompt) <TAB> prompt ids <TAB> generated ids <TAB> margins
           16 greedy tokens (F32 K/V, 2 threads; llamacpp_greedy_text.c), with
           llama.cpp's margin between its best and second logit at each step
    chat   <TAB> MODEL <TAB> HEX(user message) <TAB> prompt ids <TAB> generated ids <TAB> margins
           the same on the model's chat format (the text llama.cpp's
           llama_chat_apply_template writes for one user message with the
           generation prompt; tests/test_chat_peer.c shows dhsa writes it too)

  tests/pre_sets_peer.tsv (tests/test_real_models.c), for one name of every
  regex set dhsa runs: SmolLM2's vocabulary (49152 tokens, its merges) with
  tokenizer.ggml.pre replaced by that name (a vocabulary-only GGUF written
  with llama.cpp's gguf-py), and llama.cpp's ids for bench/tokenizer_peer.py's
  strings and a few aimed at each set:
    PRE <TAB> HEX(text) <TAB> ids

The prompts were chosen where llama.cpp's margins are wide (>= 1.7 logits
for 16 steps), so that dhsa's --exact route, which multiplies weights by
F32 activations where llama.cpp rounds them to 8 bits, is held to the same
tokens: docs/models.md.

Not part of `make test`. Needs a llama.cpp build (LLAMA_CPP, with
build/bin/libllama.so) and its gguf-py (numpy). Usage, from the repository
root, the models pulled into $DHSA_MODELS:
  LLAMA_CPP=/work/peer/llama.cpp python3 bench/real_models_peer.py \\
      [--write tests/real_models.tsv] [--write-pre tests/pre_sets_peer.tsv]
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_peer import STRINGS  # noqa: E402

MIXED = ("The café's 3 owners sold 1,234,567 croissants in 2024 (a record!) - naïve? "
         "Don't, won't, I'LL.\nКошка спит на окне. 日本語のテキストです。 مرحبا بالعالم 👋🏽\n"
         "def area(r):\n    return 3.14159 * r ** 2  # circle\n\tHTTPServer; x+=1; y = x**10\n")

GREEDY = {
    "smollm2-135m-instruct": "1, 2, 3, 4, 5, 6,",
    "gemma-3-270m": "A B C D E F G",
    "qwen2.5-coder-0.5b-instruct": "1, 2, 3, 4, 5, 6,",
}
CHAT = {
    "smollm2-135m-instruct": ("chatml", "What is the capital of France?"),
    "qwen2.5-coder-0.5b-instruct": ("chatml", "Write a Python function that returns the square of x."),
}

# one name per regex set (tokenizer.c's pre_table), and texts aimed at each
PRE_NAMES = ["gpt-2", "default", "smollm", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
             "bloom", "viking", "ufakzeka", "minicpm5", "seed-coder", "laguna", "jais-2", "gpt-4o", "tekken",
             "glm4", "qwen35", "granite-embed-multi-97m"]
PRE_EXTRA = [
    "HELLOworld HTTPServer HeLLo ÉCOLE Ünïcödé McDonald's",
    "12345678 1,000,000 3.14159 ٣٤٥ ½",
    "a;\nb\n\n  c  \r\n d",
    "Ankara'da İstanbul'un I'm YOU'RE",
    "x" + " " * 9 + "y" + " " * 600 + "z\t\t\tw",
    "Hi, you (there). Wow! Really? 。，、। ۔ ، …",
    "中文分词测试 かなカナ 한국어 テスト123",
    "`code` $x + y = z^2 | a ~ b <tag>",
    "cafe\u0301 nai\u0308ve \u0928\u092e\u0938\u094d\u0924\u0947 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 .\u0301 5\u0301 Z\u0335\u0321A\u0336L\u0338G\u0337O",
]

MODEL_FILES = {}


def catalog():
    name, files = None, {}
    for line in open("models/catalog"):
        line = line.strip()
        if line.startswith("["):
            name = line[1:-1]
        elif line.startswith("file =") and name:
            files[name] = line.split("=", 1)[1].strip()
    return files


def build(llama, prog):
    out = "/tmp/real_models_peer_" + prog
    subprocess.run(["cc", "-O2", "-I%s/include" % llama, "-I%s/ggml/include" % llama, "bench/%s.c" % prog, "-o", out,
                    "-L%s/build/bin" % llama, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath,%s/build/bin" % llama],
                   check=True)
    return out


def tokens(exe, model, texts):
    p = subprocess.run([exe, model], input="".join(t.encode().hex() + "\n" for t in texts).encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    lines = p.stdout.decode().splitlines()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return lines


def greedy(exe, model, prompt, n=16):
    p = subprocess.run([exe, model, str(n), prompt], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    return p.stdout.decode().splitlines()[:3]


def chat_text(chat, fmt, user):
    p = subprocess.run([chat, "@" + fmt, "1", "user", user], stdout=subprocess.PIPE, check=True)
    return p.stdout.decode()


def vocab_with_pre(llama, src, pre, out):
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    from gguf import GGUFReader, GGUFWriter, GGUFValueType
    r = GGUFReader(src)
    w = GGUFWriter(out, arch=str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8"))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t = f.types[0]
        if name == "tokenizer.ggml.pre":
            w.add_string(name, pre)
            continue
        if t == GGUFValueType.STRING:
            w.add_string(name, str(bytes(f.parts[f.data[0]]), "utf-8"))
        elif t == GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == GGUFValueType.STRING:
                w.add_array(name, [str(bytes(f.parts[i]), "utf-8") for i in f.data])
            else:
                w.add_key_value(name, [f.parts[i][0].item() for i in f.data], GGUFValueType.ARRAY, sub_type=sub)
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.environ.get("DHSA_MODELS", os.path.expanduser("~/.cache/dhsa/models")))
    ap.add_argument("--write", metavar="FILE")
    ap.add_argument("--write-pre", metavar="FILE")
    a = ap.parse_args()
    llama = os.environ.get("LLAMA_CPP", "/work/peer/llama.cpp")
    tok, grd, cht = (build(llama, p) for p in ("llamacpp_tokens", "llamacpp_greedy_text", "llamacpp_chat"))
    files = catalog()
    rows = []
    for name in ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct") if a.write else ():
        path = os.path.join(a.models, files[name])
        if not os.path.exists(path):
            print("skip %s: %s is not pulled" % (name, path))
            continue
        rows.append("tok\t%s\t%s\t%s" % (name, MIXED.encode().hex(), tokens(tok, path, [MIXED])[0]))
        p_ids, g_ids, marg = greedy(grd, path, GREEDY[name])
        rows.append("greedy\t%s\t%s\t%s\t%s\t%s" % (name, GREEDY[name].encode().hex(), p_ids, g_ids, marg))
        print(name, "greedy margins", marg)
        if name in CHAT:
            fmt, user = CHAT[name]
            p_ids, g_ids, marg = greedy(grd, path, chat_text(cht, fmt, user))
            rows.append("chat\t%s\t%s\t%s\t%s\t%s" % (name, user.encode().hex(), p_ids, g_ids, marg))
            print(name, "chat margins", marg)
    if a.write:
        with open(a.write, "w") as f:
            f.write("# llama.cpp's ids on the real models (bench/real_models_peer.py); checked by\n")
            f.write("# tests/test_real_models.c.\n")
            f.write("\n".join(rows) + "\n")
        print("wrote", a.write, len(rows), "rows")
    if a.write_pre:
        src = os.path.join(a.models, files["smollm2-135m-instruct"])
        texts = STRINGS + PRE_EXTRA
        rows = []
        for pre in PRE_NAMES:
            v = "/tmp/real_models_peer_vocab.gguf"
            vocab_with_pre(llama, src, pre, v)
            for t, ids in zip(texts, tokens(tok, v, texts)):
                rows.append("%s\t%s\t%s" % (pre, t.encode().hex(), ids))
        with open(a.write_pre, "w") as f:
            f.write("# llama.cpp's ids for SmolLM2's vocabulary under each pre-tokenizer (special tokens\n")
            f.write("# parsed, BOS as the name says), written by bench/real_models_peer.py; checked by\n")
            f.write("# tests/test_real_models.c.\n")
            f.write("\n".join(rows) + "\n")
        print("wrote", a.write_pre, len(rows), "rows")


if __name__ == "__main__":
    sys.exit(main())
