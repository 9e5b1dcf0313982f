"""Text for training and evaluation, from Debian packages, and the tokenizer.

Training filler: GCIDE (dict-gcide), the Jargon File (dict-jargon), FOLDOC
(dict-foldoc) and the fortune databases (fortunes, fortunes-min).
Held-out filler, never seen in training: Ambrose Bierce's "The Devil's
Dictionary" (dict-devil). All of it is cleaned of dictionary markup and
flattened to single-spaced text (no newlines), so a prompt is plain prose.

Keys are split the same way: a keyword or number belongs to the held-out
set iff crc32 of its text is 0 mod 8 (keywords) or 0 mod 10 (numbers).

Usage: python corpus.py WORKDIR   (writes WORKDIR/train.txt, eval.txt,
keywords_train.txt, keywords_eval.txt; the tokenizer is trained by
tokenizer.py)
"""
import glob
import gzip
import os
import re
import sys
import zlib

DICTD = "/usr/share/dictd"
FORTUNES = "/usr/share/games/fortunes"


def _clean_dict(raw):
    t = raw
    t = re.sub(r"\[[^\]\n]{0,80}\]", " ", t)         # [1913 Webster], [Obs.], [PJC]
    t = re.sub(r"\\[^\\\n]{0,60}\\", " ", t)         # \A*buse"\ pronunciations
    t = re.sub(r"--[A-Z][\w. ]{0,40}\.", " ", t)     # --Shak. citations
    t = re.sub(r"[{}|_*`~^<>]", "", t)
    t = re.sub(r"00-database-\S*", " ", t)
    t = re.sub(r"\s+", " ", t)
    return t.strip()


def _read_dictd(name):
    return gzip.open(os.path.join(DICTD, name + ".dict.dz")).read().decode("utf-8", "replace")


def _fortunes():
    out = []
    for p in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        if p.endswith((".dat", ".u8")) or os.path.islink(p) or os.path.isdir(p):
            continue
        try:
            txt = open(p, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for f in txt.split("\n%\n"):
            f = re.sub(r"\s+", " ", f).strip()
            if len(f) > 40 and sum(c.isalpha() for c in f) > 0.6 * len(f):
                out.append(f)
    return " ".join(out)


def is_heldout_key(text, mod):
    return zlib.crc32(text.encode()) % mod == 0


def build(work):
    os.makedirs(work, exist_ok=True)
    parts = [_clean_dict(_read_dictd(n)) for n in ("gcide", "jargon", "foldoc")]
    parts.append(_fortunes())
    train = " ".join(parts)
    ev = _clean_dict(_read_dictd("devil"))
    ev = ev[ev.find("ABASEMENT"):] if "ABASEMENT" in ev else ev   # skip the file's own header
    words = set(re.findall(r"\b[a-z]{4,10}\b", train[:5_000_000]))
    kw_train = sorted(w for w in words if not is_heldout_key(w, 8))
    kw_eval = sorted(w for w in words if is_heldout_key(w, 8))
    for name, data in (("train.txt", train), ("eval.txt", ev),
                       ("keywords_train.txt", "\n".join(kw_train)), ("keywords_eval.txt", "\n".join(kw_eval))):
        tmp = os.path.join(work, name + ".part")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, os.path.join(work, name))
    print(f"corpus: train {len(train)/1e6:.1f} MB, eval {len(ev)/1e6:.2f} MB, "
          f"keywords {len(kw_train)} train / {len(kw_eval)} held out")


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "work")
