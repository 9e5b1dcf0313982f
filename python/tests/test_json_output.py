"""Structured output (docs/server.md, "Structured output"): answers sampled
under a JSON Schema parse (json.loads) and validate (the jsonschema package,
an independent validator), through the Python binding (Session.generate
json_schema= / json=) and through dhsa serve's response_format with the
official openai client; max_tokens reached before the value closes is said
(IncompleteJSONError, finish_reason "length"); a schema outside the subset
is refused naming the keyword. The shipped default model, 20 answers each.
Skipped, saying why, without jsonschema or openai (.ci/run installs both)
or a CLI built without the server."""
import json
import os
import pathlib
import re
import subprocess
import time

import pytest

import dhsa

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = pathlib.Path(os.environ.get("DHSA_CLI", REPO / "build" / "dhsa"))

try:
    import jsonschema
except ImportError:  # pragma: no cover - depends on the machine
    jsonschema = None
try:
    import openai
except ImportError:  # pragma: no cover
    openai = None

needs_jsonschema = pytest.mark.skipif(
    jsonschema is None, reason="the jsonschema package is not installed (pip install jsonschema; .ci/run does): "
    "the answers could not be validated independently")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "n": {"type": "integer"},
        "kind": {"enum": ["a", "b", "c"]},
        "flag": {"type": "boolean"},
        "list": {"type": "array", "items": {"type": ["integer", "null"]}, "maxItems": 3},
        "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    },
    "required": ["name", "n", "kind"],
    "additionalProperties": False,
}
ANSWERS = 20


@needs_jsonschema
def test_binding_schema_answers_validate():
    with dhsa.Model() as m, dhsa.Session(m, ctx=640) as s:
        valid = 0
        for seed in range(ANSWERS):
            out = s.generate("The record as JSON: ", max_tokens=500, temperature=1.0, seed=seed, json_schema=SCHEMA)
            assert s.finish_reason == "stop", out
            jsonschema.validate(json.loads(out), SCHEMA)
            valid += 1
        assert valid == ANSWERS


def test_binding_length_and_refusals():
    with dhsa.Model() as m, dhsa.Session(m, ctx=256) as s:
        with pytest.raises(dhsa.IncompleteJSONError) as e:
            s.generate("x", max_tokens=2, json=True)
        assert s.finish_reason == "length" and e.value.n_tokens == 2 and e.value.text.strip().startswith("{")
        with pytest.raises(dhsa.DhsaError) as e:
            s.generate("x", json_schema={"type": "string", "format": "date"})
        assert '"format"' in str(e.value)
        with pytest.raises(ValueError):
            s.generate("x", json=True, stop=["}"])
        with pytest.raises(ValueError):
            s.generate("x", json=True, json_schema={})
        # the session is free again after each refusal
        assert s.generate("x", max_tokens=1, temperature=0) is not None


def _serve_built():
    if not CLI.exists():
        return False
    r = subprocess.run([str(CLI), "help", "serve"], capture_output=True, text=True)
    return r.returncode == 0 and "no HTTP server" not in r.stdout


needs_server = [
    pytest.mark.skipif(openai is None, reason="the openai package is not installed (pip install openai; .ci/run "
                       "does): response_format through the OpenAI client is not tested"),
    pytest.mark.skipif(not _serve_built(), reason="%s has no dhsa serve (built without libmicrohttpd and jansson)"
                       % CLI),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if openai is None or not _serve_built():
        pytest.skip("no openai package or no dhsa serve")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as f:
        p = subprocess.Popen([str(CLI), "serve", "--port", "0", "--slots", "2", "--ctx", "640", "--threads", "1"],
                             stderr=f, stdout=subprocess.DEVNULL, cwd=str(REPO))
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
    yield openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none", max_retries=0, timeout=120)
    p.terminate()
    assert p.wait(timeout=20) == 0, log.read_text()


def _schema_format():
    return {"type": "json_schema", "json_schema": {"name": "record", "strict": True, "schema": SCHEMA}}


@needs_jsonschema
@pytest.mark.parametrize("dummy", [0], ids=["chat"])
def test_serve_chat_schema_answers_validate(server, dummy):
    for seed in range(ANSWERS):
        r = server.chat.completions.create(model="x", messages=[{"role": "user", "content": "A record, please."}],
                                           max_tokens=500, temperature=1.0, seed=seed,
                                           response_format=_schema_format())
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


@needs_jsonschema
def test_serve_completion_stream_validates(server):
    for seed in range(3):
        chunks = server.completions.create(model="x", prompt="The record as JSON: ", max_tokens=500,
                                           temperature=1.0, seed=seed, stream=True,
                                           extra_body={"response_format": _schema_format()})
        text, finish = "", None
        for ch in chunks:
            text += ch.choices[0].text or ""
            finish = ch.choices[0].finish_reason or finish
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_serve_json_object_length_and_refusal(server):
    r = server.completions.create(model="x", prompt="x", max_tokens=2, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "length"  # not a complete value, and said so
    with pytest.raises(openai.BadRequestError) as e:
        server.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "a"}],
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {
                "type": "object", "properties": {"d": {"type": "string", "pattern": "^a"}}}}})
    assert '"pattern"' in str(e.value) and "/properties/d" in str(e.value)
