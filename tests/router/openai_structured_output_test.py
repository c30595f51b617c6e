#!/usr/bin/env python3
"""Structured output through the official openai client (started by run_openai_client_test.py).

The tiny model's weights are random, so whatever the output is comes from the grammar: json_schema
output must parse and validate (jsonschema) for 20 random prompts, streamed too, and through the
client's own `chat.completions.parse` with a pydantic model; json_object output parses as an object;
max_tokens running out mid-document says finish_reason "length"; schema keywords outside the supported
subset are a 400 naming them.

Against k3-cluster (K3_LOCAL_BASE_URL names a plain k3-router on the same model) the same checks run
with the first token drawn by the last prefill stage and the rest by the decode rank, and greedy
constrained output equals local mode's token for token.
"""
import json
import os
import random

import jsonschema
import openai

from openai_checks import CheckLog

BASE = os.environ["K3_BASE_URL"]
MODEL = "k3-tiny"
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=300)
check = CheckLog()

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "kind": {"enum": ["cat", "dog", "bird", 7, None]},
        "alive": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "note": {"type": ["string", "null"], "maxLength": 6},
        "pos": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
                "required": ["x", "y"], "additionalProperties": False},
    },
    "required": ["name", "age", "score", "kind", "alive", "tags", "note", "pos"],
    "additionalProperties": False,
}
WORDS = "alpha beta gamma delta cat dog tree river stone cloud apple seven blue quick jump over lazy".split()


def schema_format(schema, name="record"):
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def validates(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError) as e:
        print(f"     {e}: {text!r}")
        return False


def test_json_schema_random_prompts():
    rng = random.Random(1234)
    ok = 0
    for i in range(20):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           response_format=schema_format(SCHEMA), max_tokens=600, seed=i,
                                           temperature=rng.choice([0.0, 0.7, 1.0]))
        c = r.choices[0]
        good = c.finish_reason == "stop" and validates(c.message.content, SCHEMA)
        ok += good
        if not good:
            print(f"     prompt {prompt!r}: finish {c.finish_reason}")
    check(ok == 20, f"json_schema output parses and validates for 20 random prompts ({ok}/20)")


def test_json_schema_streamed():
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "stream it"}],
                                            response_format=schema_format(SCHEMA), max_tokens=600, seed=99,
                                            stream=True)
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    check(finish == "stop" and validates(text, SCHEMA), f"streamed json_schema output validates (finish {finish})")


def test_parse_with_pydantic():
    try:
        from pydantic import BaseModel, Field
    except ImportError:
        check(False, "pydantic (installed with openai) is importable")
        return

    class Pet(BaseModel):
        name: str = Field(max_length=10)
        legs: int
        friendly: bool

    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "a pet"}],
                                      response_format=Pet, max_tokens=400, seed=5)
    parsed = r.choices[0].message.parsed
    check(isinstance(parsed, Pet), f"chat.completions.parse returns a Pet ({parsed!r})")


def test_json_object():
    stops = 0
    for i in range(5):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"object {i}"}],
                                           response_format={"type": "json_object"}, max_tokens=1500, seed=i)
        c = r.choices[0]
        if c.finish_reason == "stop":
            stops += 1
            try:
                doc = json.loads(c.message.content)
            except ValueError:
                doc = None
            check(isinstance(doc, dict), f"json_object output {i} parses as an object")
        else:
            check(c.finish_reason == "length", f"json_object {i} ends with stop or length")
    check(stops >= 3, f"most json_object generations close their document within max_tokens ({stops}/5)")


def test_length_mid_document():
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "short"}],
                                       response_format=schema_format(SCHEMA), max_tokens=3, seed=1)
    c = r.choices[0]
    check(c.finish_reason == "length" and r.usage.completion_tokens == 3,
          f"max_tokens mid-document: finish_reason length (got {c.finish_reason})")
    check(c.message.content.startswith('{"'), f"the cut output is a prefix of the document ({c.message.content!r})")


def expect_400(response_format, param_part, what):
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       response_format=response_format, max_tokens=4)
        check(False, f"{what}: refused")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        param = body.get("param") or ""
        check(param_part in param and param_part.split(".")[-1] in str(body.get("message")),
              f"{what}: 400 naming {param_part} (param {param!r})")


def test_unsupported():
    expect_400(schema_format({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}),
               "schema.properties.a.pattern", "pattern")
    expect_400(schema_format({"anyOf": [{"type": "string"}, {"type": "integer"}]}), "schema.anyOf", "anyOf")
    expect_400(schema_format({"type": "integer", "minimum": 3}), "schema.minimum", "minimum")
    expect_400({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema", "missing schema")
    expect_400({"type": "bogus"}, "response_format.type", "unknown type")


def test_cluster_equals_local():
    local_base = os.environ.get("K3_LOCAL_BASE_URL")
    if not local_base:
        return
    local = openai.OpenAI(base_url=local_base, api_key="unused", max_retries=0, timeout=300)
    for i, fmt in enumerate([schema_format(SCHEMA), {"type": "json_object"}, schema_format(SCHEMA)]):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": f"same {i}"}], response_format=fmt,
                  max_tokens=300, temperature=0, extra_body={"return_token_ids": True})
        a = client.chat.completions.create(**kw).choices[0]
        b = local.chat.completions.create(**kw).choices[0]
        check(a.message.content == b.message.content and a.finish_reason == b.finish_reason,
              f"cluster output equals local mode's ({fmt['type']}, greedy): {a.message.content[:40]!r}")


def main():
    for t in (test_cluster_equals_local, test_json_schema_random_prompts, test_json_schema_streamed, test_parse_with_pydantic, test_json_object,
              test_length_mid_document, test_unsupported):
        t()
    check.exit("all structured-output checks passed")


if __name__ == "__main__":
    main()
