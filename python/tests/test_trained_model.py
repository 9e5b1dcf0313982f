"""Cross-check of the shipped default model: PyTorch's forward (train/model.py)
and dhsa's on the exported files agree within 1e-4 relative, and dhsa's
tokenizer gives SentencePiece's ids (train/check_logits.py). Needs the
training environment (train/.venv with PyTorch, from `sh train/run.sh
setup`); skipped, saying so, where it is absent: `make test` never needs
PyTorch."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PY = pathlib.Path(os.environ.get("DHSA_TRAIN_VENV", REPO / "train" / ".venv")) / "bin" / "python"


def _has_torch():
    if not PY.exists():
        return False
    r = subprocess.run([str(PY), "-c", "import torch, sentencepiece, gguf"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _has_torch(), reason="no training environment with PyTorch (train/.venv: "
                    "sh train/run.sh setup): the torch-vs-dhsa logit cross-check is skipped")
@pytest.mark.parametrize("name", ["dhsa-retrieval-8m.gguf", "dhsa-retrieval-8m-q8_0.gguf"])
def test_torch_and_dhsa_logits_agree(name):
    build = pathlib.Path(os.environ.get("DHSA_LIB", REPO / "build" / "libdhsa.so")).resolve().parent
    for exe in (build / "dhsa", build / "progs" / "logits"):
        if not exe.exists():
            pytest.skip("%s not built (make test builds it)" % exe)
    r = subprocess.run([str(PY), str(REPO / "train" / "check_logits.py"), str(REPO / "models" / name),
                        str(REPO / "train" / "tok2048.model"), "--dhsa", str(build / "dhsa"),
                        "--logits", str(build / "progs" / "logits"), "--tokens", "512"],
                       capture_output=True, text=True, cwd=str(REPO / "train"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout
