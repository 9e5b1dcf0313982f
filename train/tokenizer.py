"""Trains the model's SentencePiece tokenizer on the training filler only.

BPE, 2048 pieces, digits always split (a number is one token per digit, so
copying a key never depends on how its digits happen to merge), byte
fallback (no <unk> for any UTF-8 input), identity normalisation and no
whitespace folding, so that dhsa's SentencePiece tokenizer (score-ordered
merges, a leading U+2581, byte tokens for unknown characters) gives the
same ids as the library; tests/test_trained_model.py checks that.

Usage: python tokenizer.py WORKDIR OUT_PREFIX [VOCAB]   (writes OUT_PREFIX.model; VOCAB default 2048)
"""
import os
import re
import sys

import sentencepiece as spm

VOCAB = 2048


def train(work, prefix, vocab=VOCAB):
    text = open(os.path.join(work, "train.txt"), encoding="utf-8").read()
    # 24 evenly spaced 250 KB windows, cut into sentences: every source is represented
    n, win = 24, 250_000
    step = max(1, (len(text) - win) // (n - 1))
    lines = []
    for i in range(n):
        chunk = text[i * step:i * step + win]
        lines += [s.strip() for s in re.split(r"(?<=[.;:!?]) ", chunk) if 8 < len(s) < 2000]
    src = os.path.join(work, "tok_input.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    tmp = prefix + ".part"
    spm.SentencePieceTrainer.train(
        input=src, model_prefix=tmp, vocab_size=vocab, model_type="bpe",
        character_coverage=0.9995, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=2, input_sentence_size=0, shuffle_input_sentence=False,
        minloglevel=2)
    os.replace(tmp + ".model", prefix + ".model")
    os.remove(tmp + ".vocab")
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    ids = sp.encode(text[:200_000])
    print(f"tokenizer: {sp.vocab_size()} pieces, {200_000 / len(ids):.2f} chars/token on training text")


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else VOCAB)
