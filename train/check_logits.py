"""Cross-check: PyTorch's logits (model.py, float32) and dhsa's on the same GGUF file.

Both read the file's weights (export.load_gguf_weights dequantizes them), so
the comparison is of the two forward passes alone. Held-out text (the
evaluation filler) is tokenized by SentencePiece and by `dhsa tokenize`
(the ids must be identical), then run through both; the check is
max |a - b| / max |b| over all logits <= 1e-4.

Usage: python check_logits.py MODEL.gguf TOKENIZER.model [--dhsa build/dhsa] [--logits build/progs/logits]
       [--tokens N] [--eval-text FILE]
Exit status 0 when both checks pass.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import sentencepiece as spm
import torch

from export import load_gguf_weights, read_config
from model import Model

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("--dhsa", default=os.path.join(HERE, "..", "build", "dhsa"))
    ap.add_argument("--logits", default=os.path.join(HERE, "..", "build", "progs", "logits"))
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--eval-text", default=os.path.join(HERE, "work", "eval.txt"))
    a = ap.parse_args()
    torch.set_num_threads(2)
    if os.path.exists(a.eval_text):
        text = open(a.eval_text, encoding="utf-8").read()[50_000:50_000 + 4 * a.tokens]
    else:
        text = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                "There and back again. ") * (a.tokens // 20)
    sp = spm.SentencePieceProcessor(model_file=a.tokenizer)
    ids = [sp.bos_id()] + sp.encode(text)
    ids = ids[:a.tokens]
    text_ids = subprocess.run([a.dhsa, "tokenize", "-m", a.model, "--ids-only", text], check=True,
                              capture_output=True, text=True).stdout.split()
    want = [sp.bos_id()] + sp.encode(text)
    got = [int(x) for x in text_ids]
    tok_ok = got == want
    if not tok_ok:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        print(f"tokenizer: dhsa and SentencePiece differ at token {i} (of {len(want)}): "
              f"dhsa {got[max(0, i - 2):i + 3]} sentencepiece {want[max(0, i - 2):i + 3]}")
    else:
        print(f"tokenizer: dhsa == SentencePiece on {len(want)} tokens of held-out text")
    cfg = read_config(a.model)
    m = Model(cfg)
    m.load_state_dict(load_gguf_weights(a.model, cfg))
    m.eval()
    with torch.no_grad():
        ref = m(torch.tensor(ids)[None])[0].double().numpy()
    out = subprocess.run([a.logits, a.model], input=" ".join(map(str, ids)).encode(), check=True,
                         capture_output=True).stdout
    got = np.frombuffer(out, dtype=np.float32).reshape(len(ids), cfg.vocab).astype(np.float64)
    err = np.abs(got - ref)
    rel = err.max() / np.abs(ref).max()
    w = np.unravel_index(err.argmax(), err.shape)
    same_top = float((got.argmax(-1) == ref.argmax(-1)).mean())
    print(f"logits: {len(ids)} tokens x {cfg.vocab}: max |dhsa - torch| / max |torch| = {rel:.2e} "
          f"(worst at token {w[0]}, id {w[1]}: {got[w]:.6f} vs {ref[w]:.6f}); top-1 agreement {same_top:.4f}")
    ok = tok_ok and rel <= 1e-4
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
