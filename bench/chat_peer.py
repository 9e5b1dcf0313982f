#!/usr/bin/env python3
"""bench/chat_peer.py: the chat formatting of the real models, from llama.cpp.

For the chat templates of the catalog's models (models/catalog: SmolLM2's
and Qwen2.5-Coder's tokenizer.chat_template, read from their GGUF files;
gemma-3-270m has none and dhsa formats it as Gemma's turns, so llama.cpp's
built-in "gemma" is asked), formats a set of conversations with llama.cpp's
llama_chat_apply_template (a 20-line C program against libllama:
--chat-apply, built from the source printed by --print-source) and writes
tests/chat_peer.tsv, which tests/test_chat_peer.c checks on every
`make test` (no llama.cpp needed there):

  T <TAB> NAME <TAB> GGUF ARCH <TAB> HEX(template text, "" for none)
  C <TAB> NAME <TAB> ADD_GENERATION_PROMPT <TAB> HEX(role \\x1f content \\x1e ...) <TAB> HEX(llama.cpp's text)

Not part of `make test`. Standard library only (the GGUF strings are read
by a small reader here).
Usage (from the repository root):
  python3 bench/chat_peer.py --chat-apply /work/peer/tools/chat_apply \\
      --models ~/.cache/dhsa/models [--write-fixture tests/chat_peer.tsv]
"""
import argparse
import os
import struct
import subprocess
import sys

CONVS = [
    (1, [("system", "You are a helpful assistant."), ("user", "Hello!")]),
    (1, [("user", "What is 2+2?")]),
    (1, [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")]),
    (0, [("user", "Hi"), ("assistant", "Hello.")]),
    (1, [("user", "  spaces around \n\n"), ("assistant", "  and here  "), ("user", "ok")]),
    (1, [("system", "Réponds en français."), ("user", "日本語でこんにちは 👋")]),
    (1, [("user", "def f(x):\n    return x * 2\n# explain")]),
]


def gguf_strings(path, keys):
    """The string values of keys in a GGUF file (metadata only)."""
    out = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(path + ": not GGUF")
        ver, n_t, n_kv = struct.unpack("<IQQ", f.read(20))
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def rstr():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t == 8:
                rstr()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et == 8:
                    for _ in range(n):
                        rstr()
                else:
                    f.seek(sizes[et] * n, 1)
            else:
                f.seek(sizes[t], 1)

        for _ in range(n_kv):
            k = rstr().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if k in keys and t == 8:
                out[k] = rstr().decode()
            else:
                skip(t)
    return out


def catalog_files(path):
    files, name = {}, None
    for line in open(path):
        line = line.strip()
        if line.startswith("["):
            name = line[1:-1]
        elif line.startswith("file =") and name:
            files[name] = line.split("=", 1)[1].strip()
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chat-apply", required=True)
    ap.add_argument("--models", default=os.environ.get("DHSA_MODELS", os.path.expanduser("~/.cache/dhsa/models")))
    ap.add_argument("--write-fixture", metavar="FILE")
    a = ap.parse_args()
    files = catalog_files("models/catalog")
    templates = []  # (name, arch, text)
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"):
        p = os.path.join(a.models, files[name])
        kv = gguf_strings(p, {"tokenizer.chat_template", "general.architecture"})
        templates.append((name, kv["general.architecture"], kv.get("tokenizer.chat_template", "")))
    lines = []
    for name, arch, text in templates:
        lines.append("T\t%s\t%s\t%s" % (name, arch, text.encode().hex()))
        if text:
            tf = "/tmp/chat_peer_tmpl.txt"
            open(tf, "w").write(text)
            tmpl = tf
        else:
            tmpl = "@gemma"  # the file has none: dhsa formats gemma3 as Gemma's turns
        for gen, msgs in CONVS:
            args = [a.chat_apply, tmpl, str(gen)]
            for r, c in msgs:
                args += [r, c]
            got = subprocess.run(args, stdout=subprocess.PIPE, check=True).stdout
            enc = "\x1e".join(r + "\x1f" + c for r, c in msgs).encode().hex()
            lines.append("C\t%s\t%d\t%s\t%s" % (name, gen, enc, got.hex()))
            print("== %s gen=%d\n%s" % (name, gen, got.decode()))
    if a.write_fixture:
        with open(a.write_fixture, "w") as f:
            f.write("# llama.cpp's llama_chat_apply_template on the real models' templates, written by\n")
            f.write("# bench/chat_peer.py; checked by tests/test_chat_peer.c.\n")
            for l in lines:
                f.write(l + "\n")
        print("wrote %s (%d lines)" % (a.write_fixture, len(lines)))


if __name__ == "__main__":
    sys.exit(main())
