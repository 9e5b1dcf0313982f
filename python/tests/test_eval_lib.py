"""dhsa.eval_fidelity / eval_retrieval / eval_generate / eval_router: the
binding of the C "Evaluation" block (src/eval/evaluate.c), checked against
`dhsa eval ... --json` on the same small cases (the CLI prints what the same
library calls return: the numbers must agree to the printed digits), the
struct layout against a C compiler, and refusals.

Run: PYTHONPATH=python DHSA_LIB=build/libdhsa.so python3 -m pytest -q python/tests/test_eval_lib.py
(about 5 s; the CLI part needs build/dhsa or DHSA_CLI).
"""
import ctypes
import json
import os
import pathlib
import shutil
import subprocess

import pytest

import dhsa
from dhsa import _evaluate

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = pathlib.Path(os.environ.get("DHSA_CLI", REPO / "build" / "dhsa"))
MODEL = REPO / "models" / "dhsa-retrieval-8m.gguf"
TEXT = ("The keeper of the lighthouse wrote every evening in a thick book: the wind, the ships that passed, "
        "the colour of the water and the birds that rested on the rail. ") * 20


@pytest.fixture(scope="module")
def model():
    m = dhsa.Model(MODEL)
    yield m
    m.close()


def cli_json(*args):
    if not os.access(str(CLI), os.X_OK):
        pytest.skip("no CLI at %s (make builds it)" % CLI)
    r = subprocess.run([str(CLI), "eval", *args, "-m", str(MODEL), "--threads", "2", "--json"],
                       capture_output=True, text=True, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def close(a, b, rel):
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def test_fidelity_matches_cli(model, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    cli = cli_json("fidelity", "-f", str(path), "--ctx", "128", "--windows", "2", "--attn", "dense,dhsa,stream",
                   "--density", "0.125")
    py = dhsa.eval_fidelity(model, TEXT, ["dense", ("dhsa", 0.125), ("stream", 0.125)], window=128,
                            max_windows=2, threads=2)
    assert py["window"] == cli["ctx"] == 128 and py["n_windows"] == cli["windows"] == 2
    assert close(py["ppl_dense"], cli["ppl_dense"], 1e-5)
    assert [r["method"] for r in py["results"]] == [r["method"] for r in cli["results"]]
    for p, c in zip(py["results"], cli["results"]):
        for k in ("kl", "top1", "ppl", "ppl_dense", "density_used", "density_used_late", "kl_late", "top1_late"):
            assert close(p[k], c[k], 2e-5), (p["method"], k, p[k], c[k])
        assert all(close(a, b, 2e-5) for a, b in zip(p["recall"], c["recall"])), (p["recall"], c["recall"])
    dense, sparse = py["results"][0], py["results"][1]
    assert dense["kl"] == 0 and dense["top1"] == 1 and dense["recall"] == [1.0] * len(dense["recall"])
    assert 0 < sparse["kl"] and sparse["top1"] < 1 and all(0 < r < 1 for r in sparse["recall"])
    # the comparison can fail: another method's numbers are not these
    assert not close(py["results"][2]["kl"], cli["results"][1]["kl"], 2e-5)


def test_retrieval_matches_cli(model):
    cli = cli_json("passkey", "--lengths", "256", "--depths", "0.25", "--trials", "1", "--attn", "dense,dhsa",
                   "--density", "0.05")
    tok = dhsa.Tokenizer(MODEL)
    t = dhsa.retrieval_task(tok, "passkey", length=256, depth=0.25, seed=1 * 1000003)  # the CLI's seed of cell 0
    assert cli["answers"][0]["expected"] == t.answer
    for c, method in zip(cli["answers"], ("dense", "dhsa")):
        a = dhsa.eval_retrieval(model, t, method, density=0.05, length=256, threads=2)
        assert a["answer"] == c["answer"] and a["hit"] == c["hit"]
        assert close(a["density_used"], c["density_used"], 1e-3)
        assert close(a["mean_chunk"], c["mean_chunk"], 1e-2) and (a["mean_chunk"] > 0) == (method == "dhsa")
        assert [round(x, 3) for x in a["needle_selected"]] == c["needle_selected"]
        assert [round(x, 3) for x in a["selected_at_wrong"]] == c["selected_there"]
        assert (-1 if a["hit"] else min(a["first_wrong"], 63)) == c["first_wrong_token"]
        if method == "dense":
            assert a["needle"] == "everywhere" and a["density_used"] == 1
    g = dhsa.eval_generate(model, t.ids, "dense", max_tokens=12, keep_space=True, threads=2)
    assert g["answer"] == cli["answers"][0]["answer"]


def test_niah_matches_cli(model):
    cli = cli_json("niah", "--lengths", "300", "--depths", "0.5", "--trials", "1", "--attn", "dense,stream",
                   "--density", "0.125")
    c = cli["answers"][0]
    pr = dhsa.niah_prompt(model, "The secret number is %s." % c["number"], length=300, depth=0.5)
    assert len(pr["ids"]) == c["prompt_tokens"] and round(pr["depth_used"], 4) == c["needle_depth"]
    assert pr["stop"] == [model.eos, model.bos]
    for c, method in zip(cli["answers"], ("dense", "stream")):
        a = dhsa.eval_generate(model, pr["ids"], method, density=0.125, stop=pr["stop"], length=300, threads=2)
        assert a["answer"] == c["answer"]
        assert dhsa.niah_answer_has(a["answer"], c["number"]) == c["hit"]
    assert dhsa.niah_answer_has("is 4,821.", "4821") and not dhsa.niah_answer_has("48210", "4821")
    with pytest.raises(ValueError):
        dhsa.niah_answer_has("4821", "48a1")
    chat = dhsa.niah_prompt(model, "The secret number is 1234.", length=300, template="chatml")
    assert len(chat["ids"]) <= 300 and len(chat["stop"]) >= 2
    with pytest.raises(dhsa.DhsaError):
        dhsa.niah_prompt(model, "x", depth=2)


def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


def test_copy_matches_cli(model):
    L, P = 192, 16
    cli = cli_json("copy", "--lengths", str(L), "--depths", "0.3", "--trials", "1", "--passage", str(P),
                   "--attn", "dense,block", "--density", "0.125")
    filler = dhsa.sample_tokens(model, L, seed=1, threads=2)           # the CLI's filler for --seed 1
    normal = dhsa.passage_tokens(model)
    state, passage = 1 * 7919 + 0, []                                   # the CLI's passage of trial 0
    for _ in range(P):
        state, z = splitmix(state)
        passage.append(normal[z % len(normal)])
    ids, spans = dhsa.copy_sequence(filler, passage, L, 0.3, bos=model.bos)
    assert len(ids) == L and ids[spans["first"]:spans["first"] + P] == passage
    for c, method in zip(cli["cells"], ("dense", "block")):
        r = dhsa.eval_copy(model, ids, spans, method, density=0.125, length=L, threads=2)
        for k, ck in (("first_loss", "first_loss"), ("rep_loss", "rep_loss"), ("score", "score"),
                      ("density_used", "density_used"), ("copy_keys_selected", "copy_keys_selected"),
                      ("copy_mass", "copy_mass"), ("control_mass", "control_mass"),
                      ("copy_mass_kept", "copy_mass_kept")):
            assert abs(r[k] - c[ck]) <= 1e-5 + 1e-4 * abs(c[ck]), (method, k, r[k], c[ck])
    assert r["copy_mass_kept"] < 1  # block, not dense: the check can fail
    with pytest.raises(dhsa.DhsaError):
        dhsa.copy_sequence(filler, passage, 2 * P, 0.5)
    with pytest.raises(ValueError):
        dhsa.eval_copy(model, ids[:-1], spans)


def test_router_defaults():
    r = dhsa.eval_router(512, 0.125)
    assert (r["q_block"], r["sink_tokens"], r["local_tokens"], r["dense_below"], r["min_chunk"], r["max_chunk"],
            r["chunk"], r["sim_window"], r["nms_window"]) == (16, 4, 16, 0, 8, 32, 16, 8, 4)
    assert dhsa.eval_router(2048, 0.25, q_block=32)["local_tokens"] == 64  # budget / 8 (dhsa_router_params_for)
    assert dhsa.eval_router(2048, 0.25, q_block=32)["q_block"] == 32
    with pytest.raises(ValueError):
        dhsa.eval_router(512, q_blok=3)


def test_refusals(model):
    with pytest.raises(dhsa.DhsaError) as e:
        dhsa.eval_fidelity(model, TEXT[:100], ["dhsa"], window=4096)
    assert e.value.name == "DHSA_ERR_INVALID_ARG" and "fewer than one window" in e.value.message
    with pytest.raises(dhsa.DhsaError) as e:
        dhsa.eval_fidelity(model, [model.n_vocab] * 300, ["dhsa"], window=128)
    assert e.value.name == "DHSA_ERR_INVALID_ARG" and "ids[0]" in e.value.message
    with pytest.raises(ValueError):
        dhsa.eval_fidelity(model, TEXT, ["sparse"], window=128)
    with pytest.raises(ValueError):
        dhsa.eval_fidelity(model, TEXT, [("dhsa", 0)], window=128)
    with pytest.raises(ValueError):
        dhsa.eval_generate(model, [1, 2, 3], max_tokens=-1)
    with pytest.raises(dhsa.DhsaError):
        dhsa.eval_generate(model, [], max_tokens=4)
    with pytest.raises(TypeError):
        dhsa.eval_generate("not a model", [1, 2, 3])


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to check the struct layout with")
def test_struct_layout(tmp_path):
    structs = {"EvalMethod": "dhsa_eval_method", "FidelityParams": "dhsa_eval_fidelity_params",
               "FidelityResult": "dhsa_eval_fidelity_result", "FidelityInfo": "dhsa_eval_fidelity_info",
               "AnswerParams": "dhsa_eval_answer_params", "Answer": "dhsa_eval_answer",
               "NiahParams": "dhsa_niah_params", "NiahPrompt": "dhsa_niah_prompt",
               "CopyLayout": "dhsa_eval_copy_layout", "CopyResult": "dhsa_eval_copy_result"}
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dhsa.h"', "int main(void) {"]
    want = []
    for py, c in structs.items():
        cls = getattr(_evaluate, py)
        assert ctypes.sizeof(cls) == _evaluate.LP64_SIZES[py]
        lines.append('printf("%%zu\\n", sizeof(%s));' % c)
        want.append(ctypes.sizeof(cls))
        for name, _ in cls._fields_:
            lines.append('printf("%%zu\\n", offsetof(%s, %s));' % (c, name))
            want.append(getattr(cls, name).offset)
    lines.append('printf("%d %d\\n", DHSA_EVAL_MAX_LAYERS, (int)DHSA_DETOKENIZE_KEEP_SPACE);')
    want += [_evaluate.MAX_LAYERS, _evaluate._KEEP_SPACE]
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-I", str(REPO / "include"), "-o", str(exe), str(src)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == want
