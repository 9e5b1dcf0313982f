"""dhsa serve against the official `openai` Python package (PyPI), used
unchanged as the client: chat and completions, streaming and not, greedy
text equal to `dhsa run --temp 0`, ignore_eos through extra_body, and an
OpenAI error for a bad request.
The server runs with --batch off (tests/test_serve.c covers --batch on).
Skipped, saying why, where `openai` is not importable (.ci/run installs
it) or the CLI was built without the server (no libmicrohttpd/jansson)."""
import os
import pathlib
import re
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = pathlib.Path(os.environ.get("DHSA_CLI", REPO / "build" / "dhsa"))
PK = ("The pass key is 40913. Remember it. 40913 is the pass key. What is the pass key? "
      "The pass key is")

try:
    import openai
except ImportError:  # pragma: no cover - depends on the machine
    openai = None


def _serve_built():
    if not CLI.exists():
        return False
    r = subprocess.run([str(CLI), "help", "serve"], capture_output=True, text=True)
    return r.returncode == 0 and "no HTTP server" not in r.stdout


pytestmark = [
    pytest.mark.skipif(openai is None, reason="the openai package is not installed (pip install openai; "
                       ".ci/run does): the OpenAI-client test of dhsa serve is skipped"),
    pytest.mark.skipif(not _serve_built(), reason="%s has no dhsa serve (built without libmicrohttpd and "
                       "jansson: apt-get install libmicrohttpd-dev libjansson-dev pkg-config)" % CLI),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as f:
        p = subprocess.Popen([str(CLI), "serve", "--port", "0", "--slots", "2", "--ctx", "512",
                              "--threads", "1", "--batch", "off"], stderr=f, stdout=subprocess.DEVNULL, cwd=str(REPO))
    port = None
    for _ in range(600):
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            port = int(m.group(1))
            break
        if p.poll() is not None:
            break
        time.sleep(0.1)
    if port is None:
        p.kill()
        pytest.fail("dhsa serve did not start: " + log.read_text())
    yield "http://127.0.0.1:%d/v1" % port
    p.terminate()
    assert p.wait(timeout=20) == 0, log.read_text()


def _cli_greedy(prompt, n):
    r = subprocess.run([str(CLI), "run", "-p", prompt, "-n", str(n), "--temp", "0", "--no-echo",
                        "--ctx", "512"], capture_output=True, text=True, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout


def _client(url):
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)


def test_completions(server):
    want = _cli_greedy(PK, 8)
    c = _client(server)
    r = c.completions.create(model="dhsa-retrieval-8m", prompt=PK, max_tokens=8, temperature=0)
    assert r.choices[0].text == want
    assert r.usage.prompt_tokens > 20 and r.usage.completion_tokens >= 1
    assert r.choices[0].finish_reason in ("stop", "length")
    parts = list(c.completions.create(model="x", prompt=PK, max_tokens=8, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == want
    assert parts[-1].choices[0].finish_reason in ("stop", "length")


def test_chat(server):
    c = _client(server)
    msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is the pass key?"}]
    r = c.chat.completions.create(model="dhsa-retrieval-8m", messages=msgs, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    text = r.choices[0].message.content
    assert isinstance(text, str) and r.usage.completion_tokens <= 6
    stream = c.chat.completions.create(model="dhsa-retrieval-8m", messages=msgs, max_tokens=6, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    got = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert got == text  # greedy: streamed and whole replies agree
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert c.models.list().data[0].id == "dhsa-retrieval-8m"


def test_ignore_eos(server):
    # the request extension of vLLM and llama.cpp, through extra_body (docs/server.md):
    # PK's greedy reply meets EOS after a few tokens; with ignore_eos it runs to max_tokens
    c = _client(server)
    r = c.completions.create(model="x", prompt=PK, max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 16
    r2 = c.completions.create(model="x", prompt=PK, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    assert r2.choices[0].finish_reason == "length" and r2.usage.completion_tokens == 16
    assert r2.choices[0].text.startswith(r.choices[0].text) and len(r2.choices[0].text) > len(r.choices[0].text)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt=PK, max_tokens=4, extra_body={"ignore_eos": 1})
    assert "ignore_eos must be true or false" in str(e.value)


def test_bad_request(server):
    c = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=[{"role": "user", "content": "a"}], n=2)
    assert "n must be 1" in str(e.value)


def test_empty_prompt_refused(server):
    # issue 34: an empty prompt right after another client's request was
    # sampled from that request's logits (HTTP 200 with its answer)
    c = _client(server)
    first = c.completions.create(model="x", prompt="The secret password is swordfish. I repeat, the secret "
                                 "password is", max_tokens=3, temperature=0)
    assert first.choices[0].text
    for p in ("", [], [[]], [""]):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="x", prompt=p, max_tokens=5, temperature=0)
        assert "prompt is empty" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=[{"role": "user", "content": ""}], max_tokens=5)
    assert "empty" in str(e.value)
