#!/usr/bin/env python3
"""bench/tokenizer_peer.py: dhsa's tokenizer against llama.cpp's, string by string.

For every vocabulary (the GGUF files of ../shared/vocab, ../shared/models/
stories260K.gguf and the shipped models/dhsa-retrieval-8m.gguf) and every
string below, runs llama.cpp's `llama-tokenize` (bytes on standard input,
`--ids`, with the vocabulary's BOS; once with special tokens parsed, its
default, once with `--no-parse-special`) and `dhsa tokenize` (`--ids-only`,
`-f -`; with and without `--special`), and prints every difference and a
table (vocabulary x mode: strings, differences). Exit status 1 when any id
differs.

With --write-fixture FILE it also writes llama.cpp's ids as the fixture that
tests/test_tokenizer_peer.c checks on every `make test` (so the tests never
need llama.cpp): one line per case, "VOCAB<TAB>MODE<TAB>HEX(TEXT)<TAB>IDS",
VOCAB relative to ../shared ("vocab/...", "models/...") or to the repository
("repo:models/...").

Not part of `make test` (it needs a llama.cpp build). Standard library only.
Usage (from the repository root, after `make`):
  python3 bench/tokenizer_peer.py --llama /work/peers/llama.cpp/build/bin/llama-tokenize \
      [--dhsa build/dhsa] [--shared ../shared] [--write-fixture tests/tokenizer_peer.tsv]
"""
import argparse
import os
import subprocess
import sys

# At least 60 strings: special-token texts of the vocabularies (SPM <s> </s>
# <unk>, phi-3's <|user|> <|end|> and its whitespace stripping, GPT-2 and
# starcoder's <|endoftext|> and FIM markers), control characters, emoji,
# Korean and other scripts, code, runs of whitespace. All valid UTF-8 (what
# invalid UTF-8 does is in docs/tokenizer.md).
STRINGS = [
    # plain prose and whitespace
    "Hello world",
    " Hello world",
    "Hello  world",
    "   leading spaces",
    "trailing spaces   ",
    "     ",
    "\n",
    "\n\n\n",
    "\t\tindented\n\ttext",
    " \n \n ",
    "a\r\nb\r\n",
    "multiple     spaces    between\t\ttabs",
    "line one\n\n\nline four\n",
    "I'm you're they've we'll it's don't I'D",
    "HELLO WORLD MiXeD CaSe",
    "1234567890 3.14159 2,718 12 345 678",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!! ...... ----====---- ????",
    # control characters and Unicode spaces
    "bell\x07 and esc\x1b[31mred\x1b[0m",
    "\x01\x02\x03 start of heading",
    "del\x7f and \x1c\x1d\x1e\x1f separators",
    "form\x0cfeed\x0bvertical tab",
    "non\u00a0breaking and zero\u200bwidth",
    "ideographic\u3000space and em\u2003space",
    "line\u2028separator\u2029paragraph",
    "\u00ad soft hyphen \ufeff bom",
    # emoji
    "\U0001F642",
    "I \u2764\ufe0f NY \U0001F5FD",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family",
    "\U0001F3F3\ufe0f\u200d\U0001F308 flag",
    "emoji\U0001F999llama \U0001F525\U0001F525\U0001F525",
    # Korean and other scripts
    "\uc548\ub155\ud558\uc138\uc694",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \ucc98\ub9ac",
    "\uc11c\uc6b8\uc740 \ub300\ud55c\ubbfc\uad6d\uc758 \uc218\ub3c4\uc785\ub2c8\ub2e4.",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u597d\u5417\uff1f",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
    # code
    "def f(x):\n    return x**2\n",
    "int main(void) { return 0; }",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "<div class=\"a\">&amp;</div>",
    "SELECT * FROM t WHERE id = 42;",
    "x = [1, 2, 3]  # comment",
    "```python\nprint('hi')\n```",
    "{\"key\": \"value\", \"n\": 12345}",
    "#include <stdio.h>\n#define N 10",
    "a+=b; c-=d; e*=f; g<<=2;",
    "0x1F 0b1010 1e-9 -0.5",
    # special-token text
    "<s>",
    "</s>",
    "<unk>",
    "<s>hello</s>",
    "<s> hello </s> world",
    "</s>23.",
    "<s><s></s>",
    "<<s>>< s >",
    "a <unk> b",
    "<|endoftext|>",
    "text<|endoftext|>more",
    "<|endoftext|> <|endoftext|>",
    "<|user|>\nHi<|end|>\n<|assistant|>",
    "<|system|> You are<|end|>  x",
    " <|user|> \n\t x",
    "</s>\n\nnext",
    "<|end|> \n  trailing",
    "<|placeholder1|>x",
    "[PAD32011] x",
    "<|im_start|>user\nhi<|im_end|>",
    "<fim_prefix>def<fim_suffix>\n<fim_middle>",
    "<pr_diff_hunk_comment_line>x<jupyter_code>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
]

# Invalid UTF-8 (bytes): byte-level BPE must equal llama.cpp here too (it
# reads invalid UTF-8 as U+FFFD; starcoder has no token for 0xFF, which used
# to become its EOS). SentencePiece splits invalid UTF-8 strictly on purpose
# (docs/tokenizer.md): those rows are reported, not part of the fixture.
INVALID = [
    b"x\xffy",
    b"\xff",
    b"a\xc0\x80b overlong",
    b"\xed\xa0\x80 surrogate",
    b"truncated \xe2\x82",
    b"\x80\x80 lone continuation",
    b"caf\xe9 latin-1",
    b"\xfe\xff<|endoftext|>\xff",
]

MODES = ("special", "plain")


def run(cmd, data):
    p = subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stderr.decode(errors="replace")[-400:]))
    return p.stdout.decode()


def llama_ids(exe, vocab, data, mode):
    cmd = [exe, "-m", vocab, "--stdin", "--ids", "--log-disable"]
    if mode == "plain":
        cmd.append("--no-parse-special")
    out = run(cmd, data).strip()
    line = out.splitlines()[-1] if out else ""
    if not (line.startswith("[") and line.endswith("]")):
        raise RuntimeError("llama-tokenize printed no id list: %r" % out[-200:])
    inner = line[1:-1].strip()
    return [int(x) for x in inner.split(",")] if inner else []


def dhsa_ids(exe, vocab, data, mode):
    cmd = [exe, "tokenize", "-m", vocab, "--ids-only", "-f", "-"]
    if mode == "special":
        cmd.append("--special")
    out = run(cmd, data).strip()
    return [int(x) for x in out.split()] if out else []


def is_bpe(dhsa, vocab):
    out = subprocess.run([dhsa, "inspect", vocab], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
    return any(l.split()[:3] == ["tokenizer.ggml.model", "STRING", '"gpt2"'] for l in out.splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama", required=True, help="llama.cpp's llama-tokenize")
    ap.add_argument("--dhsa", default="build/dhsa")
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--write-fixture", metavar="FILE")
    a = ap.parse_args()

    vocabs = []  # (fixture name, path)
    vdir = os.path.join(a.shared, "vocab")
    for f in sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []:
        if f.endswith(".gguf"):
            vocabs.append(("vocab/" + f, os.path.join(vdir, f)))
    for rel in ("models/stories260K.gguf",):
        if os.path.exists(os.path.join(a.shared, rel)):
            vocabs.append((rel, os.path.join(a.shared, rel)))
    vocabs.append(("repo:models/dhsa-retrieval-8m.gguf", "models/dhsa-retrieval-8m.gguf"))
    if len(STRINGS) < 60:
        sys.exit("need at least 60 strings")

    rows, inv_rows, fixture, n_diff = [], [], [], 0
    for name, path in vocabs:
        bpe = is_bpe(a.dhsa, path)
        for mode in MODES:
            for group, strings in (("valid", [x.encode("utf-8") for x in STRINGS]), ("invalid", INVALID)):
                diffs = 0
                for data in strings:
                    want = llama_ids(a.llama, path, data, mode)
                    got = dhsa_ids(a.dhsa, path, data, mode)
                    counted = group == "valid" or bpe
                    if counted:
                        fixture.append("%s\t%s\t%s\t%s" % (name, mode, data.hex(), " ".join(map(str, want))))
                    if want != got:
                        diffs += 1
                        print("%s %s %s %r\n  llama.cpp %s\n  dhsa      %s"
                              % ("DIFF" if counted else "DIFF (SPM, invalid UTF-8: by design)", name, mode, data,
                                 want, got))
                (rows if group == "valid" else inv_rows).append((name, mode, len(strings), diffs, bpe))
                if counted:
                    n_diff += diffs

    print()
    print("| vocabulary | special tokens | strings | differences |")
    print("| --- | --- | --- | --- |")
    for name, mode, n, d, bpe in rows:
        print("| %s | %s | %d | %d |" % (name.replace("repo:", ""), "parsed" if mode == "special" else "not parsed", n, d))
    print("\nInvalid UTF-8 (%d strings):\n" % len(INVALID))
    print("| vocabulary | special tokens | strings | differences |")
    print("| --- | --- | --- | --- |")
    for name, mode, n, d, bpe in inv_rows:
        print("| %s (%s) | %s | %d | %d |" % (name.replace("repo:", ""), "BPE" if bpe else "SPM: by design",
                                            "parsed" if mode == "special" else "not parsed", n, d))
    print("\n%d strings x %d vocabularies x %d modes, and %d invalid UTF-8 strings through the BPE ones: "
          "%d differences" % (len(STRINGS), len(vocabs), len(MODES), len(INVALID), n_diff))
    if a.write_fixture:
        with open(a.write_fixture, "w") as f:
            f.write("# llama.cpp's ids (llama-tokenize --ids, BOS as the vocabulary says), written by\n")
            f.write("# bench/tokenizer_peer.py; checked by tests/test_tokenizer_peer.c.\n")
            f.write("# VOCAB\tMODE\tHEX(TEXT)\tIDS\n")
            for line in fixture:
                f.write(line + "\n")
        print("wrote %s (%d cases)" % (a.write_fixture, len(fixture)))
    return 1 if n_diff else 0


if __name__ == "__main__":
    sys.exit(main())
