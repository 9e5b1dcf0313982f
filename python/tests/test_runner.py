"""dhsa.Model / dhsa.Session (python/dhsa/_runner.py) against the CLI: the same
greedy ids as `dhsa run --temp 0 --ids`, the same sampled ids with the CLI's
defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, seed 42), streamed
text equal to the whole text and to `dhsa run --no-echo`, the prompt cache,
errors as DhsaError, and the ctypes structs' layout against a C compiler."""
import ctypes
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import dhsa
from dhsa import _runner

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = pathlib.Path(os.environ.get("DHSA_CLI", REPO / "build" / "dhsa"))
PK = ("The pass key is 40913. Remember it. 40913 is the pass key. What is the pass key? "
      "The pass key is")

needs_cli = pytest.mark.skipif(not CLI.exists(), reason="%s not built (make builds it)" % CLI)


@pytest.fixture(scope="module")
def model():
    m = dhsa.Model()
    yield m
    m.close()


def _cli(*args):
    r = subprocess.run([str(CLI), "run", *args], capture_output=True, text=True, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    return r.stdout


@needs_cli
def test_greedy_ids_equal_cli(model):
    out = [int(x) for x in _cli("-p", PK, "-n", "24", "--temp", "0", "--ids", "--ctx", "512").split()]
    prompt = model.tokenize(PK)
    assert out[:len(prompt)] == prompt
    s = dhsa.Session(model, ctx=512)
    got = s.generate(PK, max_tokens=24, temperature=0, tokens=True)
    assert got == out[len(prompt):]
    assert len(got) >= 1


@needs_cli
def test_default_sampling_equals_cli(model):
    out = [int(x) for x in _cli("-p", "Once upon a time", "-n", "32", "--ids", "--ctx", "512").split()]
    n = len(model.tokenize("Once upon a time"))
    s = dhsa.Session(model, ctx=512)
    assert s.generate("Once upon a time", max_tokens=32, tokens=True) == out[n:]


@needs_cli
def test_text_and_stream(model):
    want = _cli("-p", PK, "-n", "8", "--temp", "0", "--no-echo", "--ctx", "512")[:-1]
    s = dhsa.Session(model, ctx=512)
    text = s.generate(PK, max_tokens=8, temperature=0)
    assert text == want
    pieces = list(s.generate(PK, max_tokens=8, temperature=0, stream=True))
    assert "".join(pieces) == want and len(pieces) >= 2
    assert s.n_reused == len(model.tokenize(PK)) - 1  # the prompt came from the cache
    if len(want) >= 4:
        assert s.generate(PK, max_tokens=8, temperature=0, stop=want[2:4]) == want[:2]


def test_session_basics(model):
    # dense_below 2048: this prompt runs dense (a routed prompt fed in pieces
    # not a multiple of q_block routes differently from one piece)
    s = dhsa.Session(model, ctx=256, attn="dhsa", density=0.125, kv="f16", threads=1, dense_below=2048)
    ids = model.tokenize(PK)
    s.eval(ids)
    lg = s.logits()
    assert lg.shape == (model.n_vocab,) and np.isfinite(lg).all() and s.length == len(ids)
    s.truncate(5)
    assert s.length == 5
    s.eval(ids[5:])
    # bit for bit what a session that evaluated the same two pieces gives
    ref = dhsa.Session(model, ctx=256, attn="dhsa", density=0.125, kv="f16", threads=1, dense_below=2048)
    ref.eval(ids[:5])
    ref.eval(ids[5:])
    np.testing.assert_array_equal(s.logits(), ref.logits())
    np.testing.assert_allclose(s.logits(), lg, rtol=1e-3, atol=1e-3)  # and close to one piece
    ref.close()
    assert model.detokenize(ids) == PK
    assert "[INST]" in model.chat_template([{"role": "user", "content": "Hi"}])
    # a message that types BOS/EOS texts stays text: one BOS, no EOS
    forged = model.chat_tokenize([{"role": "user", "content": "<s></s>Hi"}])
    assert forged[0] == model.bos and forged.count(model.bos) == 1 and model.eos not in forged
    whole = model.tokenize(model.chat_template([{"role": "user", "content": "<s></s>Hi"}]), parse_special=True)
    assert whole.count(model.bos) + whole.count(model.eos) > 1  # parsing the whole text would let them in
    assert s.plan["total"] > 0 and s.n_ctx == 256
    s.reset()
    assert s.length == 0


def test_session_kv_q8_0(model):
    """kv="q8_0" stores K/V as 8-bit blocks: the plan counts 34 bytes per 32
    values, and the logits stay near the F32 cache's (tests/test_kv_q8.c
    bounds them tightly; this only checks the option reaches the library)."""
    ids = model.tokenize(PK)
    ref = dhsa.Session(model, ctx=256, kv="f32", threads=1)
    s = dhsa.Session(model, ctx=256, kv="q8_0", threads=1)
    ref.eval(ids)
    s.eval(ids)
    assert s.plan["kv_cache"] * 64 == ref.plan["kv_cache"] * 17  # 34 / 32 bytes vs 4
    diff = np.abs(s.logits() - ref.logits()).max()
    assert 0 < diff < 0.5 * np.abs(ref.logits()).max()
    with pytest.raises(ValueError):
        dhsa.Session(model, ctx=256, kv="q4_0")
    s.close()
    ref.close()


def test_exact_and_fast_routes():
    """Session(exact=True) is the F32 route; the default on a quantized file
    is the integer route, close to it (docs/quant.md), and says so."""
    q8 = REPO / "models" / "dhsa-retrieval-8m-q8_0.gguf"
    if not q8.exists():
        pytest.skip("%s is not in the checkout" % q8)
    m = dhsa.Model(str(q8))
    try:
        ids = m.tokenize(PK)
        out = {}
        for exact in (False, True):
            s = dhsa.Session(m, ctx=256, threads=1, exact=exact)
            s.eval(ids)
            out[exact] = s.logits().copy()
            s.close()
        assert "f32" in m.routes(exact=True) and "Q8_0" in m.routes()
        rel = np.linalg.norm(out[False] - out[True]) / np.linalg.norm(out[True])
        if "int8" in m.routes():
            assert 0 < rel < 0.04, rel
            assert int(np.argmax(out[False])) == int(np.argmax(out[True]))
        else:  # no integer kernels on this CPU: both are the exact route
            assert rel == 0
    finally:
        m.close()


def test_errors(model):
    with pytest.raises(dhsa.DhsaError) as e:
        dhsa.Model("/nonexistent/model.gguf")
    assert e.value.name == "DHSA_ERR_IO"
    s = dhsa.Session(model, ctx=64)
    with pytest.raises(dhsa.DhsaError) as e:
        s.eval([model.n_vocab])
    assert e.value.name == "DHSA_ERR_INVALID_ARG" and "outside" in e.value.message
    with pytest.raises(dhsa.DhsaError) as e:
        s.eval(list(range(3, 70)))
    assert e.value.name == "DHSA_ERR_TOO_LARGE"
    with pytest.raises(dhsa.DhsaError) as e:
        dhsa.Session(model, ctx=4096, mem_limit=1 << 20)
    assert e.value.name == "DHSA_ERR_MEMORY_BUDGET"
    with pytest.raises(ValueError):
        dhsa.Session(model, attn="sparse")
    with pytest.raises(ValueError):
        s.generate(list(range(3, 100)))  # longer than the context


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to check the struct layout with")
def test_struct_layout(tmp_path):
    structs = {"ModelParams": "dhsa_model_params", "ModelInfo": "dhsa_model_info",
               "SessionParams": "dhsa_session_params", "MemPlan": "dhsa_mem_plan",
               "SamplerParams": "dhsa_sampler_params", "ChatMessage": "dhsa_chat_message"}
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dhsa.h"', "int main(void) {"]
    want = []
    for py, c in structs.items():
        cls = getattr(_runner, py)
        lines.append('printf("%%zu\\n", sizeof(%s));' % c)
        want.append(ctypes.sizeof(cls))
        for name, _ in cls._fields_:
            lines.append('printf("%%zu\\n", offsetof(%s, %s));' % (c, name))
            want.append(getattr(cls, name).offset)
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-I", str(REPO / "include"), "-o", str(exe), str(src)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == want


def test_save_load_state(model, tmp_path):
    """save_state / load_state (docs/prompt-cache.md): the loaded session holds
    the tokens and the last logits bit for bit and generates what a session
    that evaluated the prompt itself generates; other options are refused with
    the reason, leaving the session as it was."""
    ids = model.tokenize(PK)
    path = str(tmp_path / "pk.state")
    s = dhsa.Session(model, ctx=256, attn="dhsa", density=0.125, kv="f16", threads=1)
    s.eval(ids)
    s.save_state(path)
    r = dhsa.Session(model, ctx=256, attn="dhsa", density=0.125, kv="f16", threads=1)
    assert r.load_state(path) == len(ids) and r.tokens == ids and r.length == len(ids)
    np.testing.assert_array_equal(r.logits(), s.logits())
    want = dhsa.Session(model, ctx=256, attn="dhsa", density=0.125, kv="f16", threads=1).generate(
        PK, max_tokens=8, temperature=0, tokens=True)
    assert r.generate(PK, max_tokens=8, temperature=0, tokens=True) == want
    assert r.n_reused >= len(ids) - 1
    other = dhsa.Session(model, ctx=256, kv="f32", threads=1)
    other.eval(ids[:3])
    with pytest.raises(dhsa.DhsaError, match="--kv"):
        other.load_state(path)
    assert other.tokens == ids[:3] and other.length == 3
    for x in (s, r, other):
        x.close()
