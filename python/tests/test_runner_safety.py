"""dhsa.Model / dhsa.Session misused (python/dhsa/_runner.py; docs/python.md,
"The model runner"): close() of a session or of its model from another thread
while generate() runs (no crash, no deadlock: the subprocesses count both), a
second live generate() on one session refused, every bad number refused with
ValueError / TypeError before it reaches C, malformed chat messages refused
with the documented types. On the shipped default model."""
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dhsa

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = pathlib.Path(os.environ.get("DHSA_MODEL", REPO / "models" / "dhsa-retrieval-8m.gguf"))
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="%s absent (the shipped default model)" % MODEL)
PROMPT = "Once upon a time, in a small town by the sea, there lived"

# One process runs TRIALS trials: a thread generates (whole text, or a stream it
# iterates) while the main thread, after a random delay, closes the session or
# the model. A trial prints "ok <outcome>"; a crash ends the process (its
# missing lines count as crashes), a trial stuck for 15 s ends it through
# faulthandler (a deadlock: "Timeout" on stderr).
RACE = r"""
import faulthandler, os, random, sys, threading, time
import dhsa
trials, seed = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(seed)
for i in range(trials):
    # a trial stuck anywhere (the close in C included) past 15 s: "deadlock"
    faulthandler.dump_traceback_later(15, exit=True)
    what = ("session", "model")[i % 2]
    stream = (i // 2) % 2 == 1
    m = dhsa.Model()
    s = dhsa.Session(m, ctx=512, threads=2)
    out = []
    def run():
        try:
            if stream:
                n = sum(1 for _ in s.generate(PROMPT_TEXT, max_tokens=300, temperature=0, ignore_eos=True, stream=True))
            else:
                n = len(s.generate(PROMPT_TEXT, max_tokens=300, temperature=0, ignore_eos=True, tokens=True))
            out.append("finished:%d" % n)
        except ValueError as e:
            out.append("ValueError" if "closed" in str(e) else "ValueError?" + str(e))
        except BaseException as e:
            out.append("%s:%s" % (type(e).__name__, e))
    t = threading.Thread(target=run)
    t.start()
    time.sleep(rnd.uniform(0, 0.03))
    (s if what == "session" else m).close()
    t.join()
    if s.closed and m.closed is (what == "model"):
        print("ok", what, out[0] if out else "nothing", flush=True)
    else:
        print("bad", what, "closed flags", s.closed, m.closed, flush=True)
    m.close()
    faulthandler.cancel_dump_traceback_later()
""".replace("PROMPT_TEXT", repr(PROMPT))


def test_close_during_generate_50_runs():
    """50 trials (session / model close, whole / streamed generate, random
    delays) in 5 processes: every trial ends "ok"; the generate either
    finished before the close or raised ValueError naming the closed session
    or model. Before the fix: 15 of 20 segfaults, 3 of 20 deadlocks."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    env.setdefault("DHSA_LIB", str(REPO / "build" / "libdhsa.so"))
    env["DHSA_MODEL"] = str(MODEL)
    procs = [subprocess.Popen([sys.executable, "-c", RACE, "10", str(seed)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in range(5)]
    ok = crashes = deadlocks = 0
    outcomes, bad = {}, []
    for p in procs:
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # faulthandler did not end it: stuck harder than a deadlock
            p.kill()
            out, err = p.communicate()
            err += "\nTimeout: killed after 60 s"
        lines = out.split("\n")
        done = [ln for ln in lines if ln.startswith("ok ")]
        ok += len(done)
        for ln in done:
            key = ln.split(" ", 2)[2].split(":")[0]
            outcomes[key] = outcomes.get(key, 0) + 1
        bad += [ln for ln in lines if ln.startswith("bad")]
        if p.returncode != 0 and "Timeout" in err:
            deadlocks += 1
            bad.append("stuck after %d trials: %s" % (len(done), err[-400:]))
        elif p.returncode != 0:
            crashes += 1
            bad.append("rc %d after %d trials: %s" % (p.returncode, len(done), err[-400:]))
    assert ok == 50 and crashes == 0 and deadlocks == 0 and not bad, \
        "ok %d of 50, crashed processes %d, deadlocks %d: %s" % (ok, crashes, deadlocks, bad)
    assert set(outcomes) <= {"finished", "ValueError"}, outcomes
    assert outcomes.get("ValueError", 0) >= 10, outcomes  # the closes did land during generation


@pytest.fixture(scope="module")
def model():
    m = dhsa.Model(str(MODEL))
    yield m
    m.close()


def test_second_live_generator_refused(model):
    s = dhsa.Session(model, ctx=256, threads=1)
    ref = s.generate(PROMPT, max_tokens=12, temperature=0, tokens=True)
    g = s.generate(PROMPT, max_tokens=12, temperature=0, tokens=True, stream=True)
    first = next(g)
    for call in (lambda: s.generate(PROMPT, max_tokens=4, temperature=0),
                 lambda: s.generate(None, max_tokens=4, stream=True),
                 lambda: s.eval([5]), lambda: s.truncate(1), lambda: s.reset()):
        with pytest.raises(RuntimeError, match="still running"):
            call()
    assert [first] + list(g) == ref  # the refused calls left the stream alone
    assert s.generate(PROMPT, max_tokens=12, temperature=0, tokens=True) == ref  # exhausted: free again
    g = s.generate(PROMPT, max_tokens=12, temperature=0, stream=True)
    next(g)
    g.close()
    assert s.generate(PROMPT, max_tokens=12, temperature=0, tokens=True) == ref  # closed: free again
    s.generate(PROMPT, max_tokens=12, stream=True)  # never started, dropped: free again
    for _ in s.generate(PROMPT, max_tokens=12, stream=True):
        break  # left early, dropped: free again
    assert s.generate(PROMPT, max_tokens=12, temperature=0, tokens=True) == ref
    # a stream interrupted by close() raises at its next step, then the session stays closed
    g = s.generate(PROMPT, max_tokens=12, temperature=0, stream=True)
    next(g)
    s.close()
    with pytest.raises(ValueError, match="closed"):
        list(g)
    with pytest.raises(ValueError, match="closed"):
        s.generate(PROMPT)
    with pytest.raises(ValueError, match="closed"):
        s.eval([1])


def test_closed_model_refuses_everything(model):
    m = dhsa.Model(str(MODEL))
    s = dhsa.Session(m, ctx=64, threads=1)
    m.close()
    assert s.closed and m.closed
    for call in (lambda: m.tokenize("a"), lambda: m.detokenize([1]), lambda: m.token_to_piece(1),
                 lambda: dhsa.Session(m, ctx=64), lambda: s.length, lambda: s.eval([1]),
                 lambda: dhsa.passage_tokens(m), lambda: dhsa.eval_generate(m, [1, 5, 6], max_tokens=2)):
        with pytest.raises(ValueError, match="closed"):
            call()


BAD_SESSION = [
    (dict(ctx=-1), ValueError), (dict(ctx=2**64 + 256), ValueError), (dict(ctx=2**63), ValueError),
    (dict(ctx=256.0), TypeError), (dict(ctx="256"), TypeError), (dict(ctx=True), TypeError),
    (dict(ubatch=-1), ValueError), (dict(ubatch=2**64 + 8), ValueError), (dict(ubatch=1.5), TypeError),
    (dict(mem_limit=-1), ValueError), (dict(mem_limit=2**64), ValueError), (dict(mem_limit=1e9), TypeError),
    (dict(threads=-1), ValueError), (dict(threads=2**32 + 1), ValueError), (dict(threads=1.5), TypeError),
    (dict(attn="dhsa", density=0), ValueError), (dict(attn="dhsa", density=float("nan")), ValueError),
    (dict(attn="dhsa", density=1.5), ValueError), (dict(attn="dhsa", density="0.1"), TypeError),
    (dict(attn="dhsa", budget=-1), ValueError), (dict(attn="dhsa", budget=2**64 + 64), ValueError),
    (dict(attn="dhsa", budget=64.0), TypeError), (dict(attn="dhsa", dense_below=-1), ValueError),
]


@pytest.mark.parametrize("kw,err", BAD_SESSION, ids=[repr(k) for k, _ in BAD_SESSION])
def test_session_numbers_checked(model, kw, err):
    with pytest.raises(err) as e:
        dhsa.Session(model, **kw)
    assert e.type is err  # not DhsaError (a RuntimeError), not a wrapped value taken
    assert list(kw)[-1] in str(e.value)


BAD_GENERATE = [
    (dict(max_tokens=-1), ValueError), (dict(max_tokens=2.5), TypeError), (dict(max_tokens=2**64), ValueError),
    (dict(temperature=-0.5), ValueError), (dict(temperature=float("nan")), ValueError),
    (dict(temperature=float("inf")), ValueError), (dict(temperature="0"), TypeError),
    (dict(top_k=-1), ValueError), (dict(top_k=4.5), TypeError), (dict(top_p=0), ValueError),
    (dict(top_p=1.5), ValueError), (dict(min_p=-0.1), ValueError), (dict(min_p=2), ValueError),
    (dict(repeat_penalty=0), ValueError), (dict(repeat_last_n=-1), ValueError),
    (dict(seed=-1), ValueError), (dict(seed=2**64), ValueError), (dict(seed=1.5), TypeError),
    (dict(prompt=[1.5, 2]), TypeError), (dict(prompt=np.array([1.0, 2.0])), TypeError),
    (dict(prompt=[2**32 + 5]), ValueError), (dict(prompt=np.array([2**40], dtype=np.int64)), ValueError),
    (dict(prompt=[True, 5]), TypeError), (dict(template=5), TypeError),
]


@pytest.mark.parametrize("kw,err", BAD_GENERATE, ids=[repr(k) for k, _ in BAD_GENERATE])
def test_generate_numbers_checked(model, kw, err):
    s = dhsa.Session(model, ctx=64, threads=1)
    args = dict(prompt="Hi", max_tokens=2)
    args.update(kw)
    with pytest.raises(err) as e:
        s.generate(**args)
    assert e.type is err
    assert s.length == 0  # refused before anything ran
    s.generate("Hi", max_tokens=2)  # and the session is still free
    s.close()


def test_ids_and_counts_checked(model):
    s = dhsa.Session(model, ctx=64, threads=1)
    for bad, err in (([1.5], TypeError), (np.array([3.0]), TypeError), ([2**32 + 3], ValueError),
                     ([-2**40], ValueError), ("abc", TypeError), ([None], TypeError)):
        with pytest.raises(err):
            s.eval(bad)
        with pytest.raises(err):
            model.detokenize(bad)
    assert s.length == 0
    with pytest.raises(TypeError):
        model.token_to_piece(3.7)
    with pytest.raises(ValueError):
        model.token_to_piece(2**32 + 3)
    with pytest.raises(TypeError):
        model.tokenize(5)  # bytes(5) would be five NUL bytes
    s.eval([1, 5, 6])
    for n, err in ((-1, ValueError), (1.5, TypeError), (4, ValueError)):
        with pytest.raises(err):
            s.truncate(n)
    assert s.tokens == [1, 5, 6] and s.length == 3
    s.eval(np.array([7, 8], dtype=np.uint16))  # any integer dtype in range is fine
    assert s.tokens == [1, 5, 6, 7, 8]
    with pytest.raises(dhsa.DhsaError, match="outside"):  # in int32 but not in the vocabulary: C says so
        s.eval([model.n_vocab])
    s.close()


def test_threads_capped_to_online_cpus(model):
    cpus = os.sysconf("SC_NPROCESSORS_ONLN")
    with pytest.warns(RuntimeWarning, match="above the %d online CPUs" % cpus):
        s = dhsa.Session(model, ctx=64, threads=cpus + 7)
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dhsa.Session(model, ctx=64, threads=cpus).close()


MALFORMED = [
    ([{"role": "user"}], ValueError), ([{"content": "hi"}], ValueError),
    ([{"role": 1, "content": "hi"}], TypeError), ([{"role": "user", "content": None}], TypeError),
    (["hi"], TypeError), ([("user", "hi")], TypeError), ("hi", TypeError), (None, TypeError),
    ({"role": "user", "content": "hi"}, TypeError),
    ([{"role": "user", "content": "a\0b"}], ValueError), ([{"role": "us\0er", "content": "hi"}], ValueError),
    ([{"role": "user", "content": "hi"}, "oops"], TypeError),
]


@pytest.mark.parametrize("messages,err", MALFORMED, ids=[repr(m) for m, _ in MALFORMED])
def test_malformed_messages(model, messages, err):
    for call in (model.chat_template, model.chat_tokenize):
        with pytest.raises(err) as e:
            call(messages)
        assert e.type is err or (err is ValueError and isinstance(e.value, ValueError))
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        s = dhsa.Session(model, ctx=64, threads=1)
        with pytest.raises(err):
            s.generate(messages, chat=True, max_tokens=2)
        s.close()
    # well-formed, but a role the format does not take: the library's sentence
    with pytest.raises(dhsa.DhsaError, match="role"):
        model.chat_template([{"role": "wizard", "content": "hi"}])
