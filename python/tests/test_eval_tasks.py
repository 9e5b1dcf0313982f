"""dhsa.Tokenizer and dhsa.retrieval_task: the binding of the retrieval task
builders (src/eval/retrieval.c) on the shipped default model's tokenizer."""
import ctypes
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import dhsa
from dhsa import _capi

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "dhsa-retrieval-8m.gguf"


@pytest.fixture(scope="module")
def tok():
    return dhsa.Tokenizer(MODEL)


def test_struct_layout_matches_header(tmp_path):
    assert ctypes.sizeof(_capi.TaskParams) == _capi.LP64_SIZES["TaskParams"]
    assert ctypes.sizeof(_capi.Task) == _capi.LP64_SIZES["Task"]
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dhsa.h"', "int main(void) {"]
    for cname, cls in (("dhsa_task_params", _capi.TaskParams), ("dhsa_task", _capi.Task)):
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for f, _ in cls._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (cname, f, cname, f))
    lines += ["return 0;", "}"]
    (tmp_path / "t.c").write_text("\n".join(lines))
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), str(tmp_path / "t.c"), "-o", str(tmp_path / "t")],
                   check=True, capture_output=True)
    got = {}
    for line in subprocess.run([str(tmp_path / "t")], check=True, capture_output=True, text=True).stdout.splitlines():
        s, f, v = line.split()
        got[(s, f)] = int(v)
    for cname, cls in (("dhsa_task_params", _capi.TaskParams), ("dhsa_task", _capi.Task)):
        assert got[(cname, "sizeof")] == ctypes.sizeof(cls)
        for f, _ in cls._fields_:
            assert got[(cname, f)] == getattr(cls, f).offset, (cname, f)


def test_tokenizer_round_trip(tok):
    ids = tok.encode("The pass key is 12345.")
    assert ids[0] == 1 and ids.dtype == np.int32
    assert tok.decode(ids) == "The pass key is 12345."
    assert tok.n_vocab == 2048


def test_passkey_task(tok):
    t = dhsa.retrieval_task(tok, "passkey", length=1024, depth=0.25, seed=5)
    assert 992 <= len(t.ids) <= 1024
    assert t.prompt.startswith("There is an important info hidden")
    assert t.prompt.endswith(" What is the pass key? The pass key is")
    k = t.numbers[0]
    assert t.answer == " %d" % k and ("The pass key is %d. Remember it. %d is the pass key." % (k, k)) in t.prompt
    lo, hi = t.spans[0]
    assert tok.decode(t.ids[lo:hi]).strip() == str(k)
    assert abs(t.depth_used - 0.25) < 0.05
    assert t.check(" %d." % k) and not t.check(" %d" % (k + 1)) and not t.check("")
    np.testing.assert_array_equal(t.ids, tok.encode(t.prompt))


def test_multikey_and_multivalue(tok):
    t = dhsa.retrieval_task(tok, "multikey", length=2048, seed=2, filler="a plain sentence here. " * 2000,
                            keywords=["alpha", "bravo", "charlie", "delta", "echo"], n_keys=4)
    assert t.prompt.count("One of the special magic numbers for ") == 4
    assert "mentioned in the provided text is" in t.prompt
    v = dhsa.retrieval_task(tok, "multivalue", length=1024, seed=3, n_keys=3, n_distract=1)
    assert len(v.numbers) == 3 and v.answer == " " + ", ".join(str(n) for n in v.numbers)
    assert v.check(v.answer) and not v.check(" " + ", ".join(str(n) for n in reversed(v.numbers)))


def test_selected_from_a_layout(tok):
    t = dhsa.retrieval_task(tok, "passkey", length=512, seed=9)
    lo, hi = t.spans[0]
    lay = dhsa.Layout.empty(1, 1, 16, len(t.ids), 16, 2)
    assert t.selected(None, 0, 0) == 1.0
    assert t.selected(lay, 0, 3) == 0.0
    lay.set(0, 0, 0, [(lo, hi)])
    assert t.selected(lay, 0, 3) == 1.0


def test_bad_input_is_an_error(tok):
    with pytest.raises(dhsa.DhsaError):
        dhsa.retrieval_task(tok, "passkey", length=10)
    with pytest.raises(dhsa.DhsaError):
        dhsa.retrieval_task(tok, "passkey", length=4096, filler="too short")
    with pytest.raises(ValueError):
        dhsa.retrieval_task(tok, "riddle")
    with pytest.raises(dhsa.DhsaError):
        dhsa.Tokenizer(REPO / "no-such-file.gguf")
