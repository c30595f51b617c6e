#!/usr/bin/env python3
"""Tool calls through the official openai client (started by run_openai_client_test.py).

The tiny model's weights are random, so what makes its output testable is the constraint: with
tool_choice "required" or a named function, decoding follows the tool-call section of the chat
template and each call's arguments follow the function's `parameters` schema. Checked here:
  - non-streamed and streamed calls parse into `tool_calls` (id "functions.NAME:INDEX", type function,
    arguments a JSON string that validates against the schema), finish_reason "tool_calls";
  - a round trip: the call, the assistant message carrying it and a `tool` result message go back in
    the conversation, and the next answer comes (text with tool_choice "none", another call whose index
    counts on with "required"), streamed and not;
  - "auto" gives text or well-formed calls, "none" never a call;
  - bad tools are a 400 naming the field.
Against k3-cluster (K3_LOCAL_BASE_URL names a plain k3-router on the same model) a greedy call equals
local mode's.
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

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer"},
        "unit": {"enum": ["c", "f"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 6}, "fmt": {"type": ["string", "null"], "maxLength": 4}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
WORDS = "alpha beta gamma delta weather paris time zone rain sun seven blue quick".split()


def call_ok(call, index=None, name=None):
    """One tool call as the API returned it: id, type, a known name, arguments that validate."""
    fn = call.function
    try:
        args = json.loads(fn.arguments)
        jsonschema.validate(args, SCHEMAS[fn.name])
    except (ValueError, KeyError, jsonschema.ValidationError) as e:
        print(f"     {fn.name}: {e}: {fn.arguments!r}")
        return False
    want_id = f"functions.{fn.name}:" + (str(index) if index is not None else "")
    good_id = call.id == want_id if index is not None else call.id.startswith(want_id)
    return call.type == "function" and good_id and (name is None or fn.name == name)


def ask(messages, **kw):
    kw.setdefault("max_tokens", 300)
    return client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, **kw)


def test_required_random_prompts():
    rng = random.Random(77)
    ok = 0
    for i in range(8):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10)))
        r = ask([{"role": "user", "content": prompt}], tool_choice="required", seed=i, parallel_tool_calls=False,
                temperature=rng.choice([0.0, 0.7, 1.0]))
        c = r.choices[0]
        calls = c.message.tool_calls or []
        good = c.finish_reason == "tool_calls" and len(calls) == 1 and call_ok(calls[0], index=0) and \
            c.message.content is None
        ok += good
        if not good:
            print(f"     prompt {prompt!r}: finish {c.finish_reason}, {c.message}")
    check(ok == 8, f"required: one call whose arguments validate, for 8 random prompts ({ok}/8)")


def test_parallel_calls():
    r = ask([{"role": "user", "content": "several"}], tool_choice="required", seed=11, max_tokens=600)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    check(c.finish_reason == "tool_calls" and len(calls) >= 1 and
          all(call_ok(x, index=k) for k, x in enumerate(calls)),
          f"parallel calls are numbered 0.. and each validates ({len(calls)} calls)")


def test_named():
    for seed in range(3):
        r = ask([{"role": "user", "content": "what time"}], seed=seed, parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
        c = r.choices[0]
        calls = c.message.tool_calls or []
        check(c.finish_reason == "tool_calls" and len(calls) == 1 and call_ok(calls[0], 0, "get_time"),
              f"named tool_choice calls get_time (seed {seed})")


def collect_stream(stream):
    """Reassembles streamed tool_calls deltas as the openai docs show."""
    content, calls, finish, first_has_role = "", {}, None, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        if first_has_role is None:
            first_has_role = ch.delta.role == "assistant"
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                slot["id"] = d.id
            if d.function and d.function.name:
                slot["name"] = d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
        finish = ch.finish_reason or finish
    return content, [calls[k] for k in sorted(calls)], finish, first_has_role


def as_call(d):
    return openai.types.chat.ChatCompletionMessageToolCall(
        id=d["id"], type="function", function={"name": d["name"], "arguments": d["arguments"]})


def test_streamed():
    stream = ask([{"role": "user", "content": "stream a call"}], tool_choice="required", seed=5,
                 parallel_tool_calls=False, stream=True)
    content, calls, finish, role = collect_stream(stream)
    check(role and finish == "tool_calls" and len(calls) == 1 and call_ok(as_call(calls[0]), 0) and content == "",
          f"streamed: delta.tool_calls reassemble into one call that validates (finish {finish})")
    # The same request not streamed gives the same call (same seed).
    r = ask([{"role": "user", "content": "stream a call"}], tool_choice="required", seed=5, parallel_tool_calls=False)
    same = r.choices[0].message.tool_calls
    check(same and calls and same[0].function.arguments == calls[0]["arguments"] and same[0].id == calls[0]["id"],
          "streamed and non-streamed give the same call for the same seed")


def round_trip(stream):
    what = "streamed" if stream else "not streamed"
    messages = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "weather in Oslo?"}]
    kw = dict(seed=21, parallel_tool_calls=False)
    if stream:
        _, calls, finish, _ = collect_stream(ask(messages, tool_choice="required", stream=True, **kw))
        calls = [as_call(c) for c in calls]
        assistant = {"role": "assistant", "content": None,
                     "tool_calls": [c.model_dump(exclude_none=True) for c in calls]}
    else:
        r = ask(messages, tool_choice="required", **kw)
        finish, calls = r.choices[0].finish_reason, r.choices[0].message.tool_calls or []
        assistant = r.choices[0].message.model_dump(exclude_none=True)
    check(finish == "tool_calls" and len(calls) == 1 and call_ok(calls[0], 0), f"round trip ({what}): first call")
    if not calls:
        return
    messages += [assistant, {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temp": 21})}]
    # The answer to the tool result: text, no call.
    if stream:
        content, more, finish, _ = collect_stream(ask(messages, tool_choice="none", stream=True, **kw))
    else:
        r = ask(messages, tool_choice="none", **kw)
        content, more, finish = r.choices[0].message.content, r.choices[0].message.tool_calls or [], \
            r.choices[0].finish_reason
    check(isinstance(content, str) and not more and finish in ("stop", "length"),
          f"round trip ({what}): the answer after the tool result is text (finish {finish}, {len(content or '')} chars)")
    # Another call in the same conversation: its index counts on from the first.
    r = ask(messages, tool_choice="required", **kw)
    again = r.choices[0].message.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and len(again) == 1 and call_ok(again[0], 1),
          f"round trip ({what}): a second call is numbered 1 ({again[0].id if again else None})")


def test_round_trip():
    round_trip(stream=False)
    round_trip(stream=True)


def test_auto_and_none():
    texts = calls = 0
    for seed in range(6):
        r = ask([{"role": "user", "content": f"maybe {seed}"}], tool_choice="auto", seed=seed, max_tokens=60)
        c = r.choices[0]
        if c.message.tool_calls:
            calls += 1
            check(all(call_ok(x) for x in c.message.tool_calls), f"auto (seed {seed}): the calls made validate")
        else:
            texts += 1
            check(isinstance(c.message.content, str) and c.finish_reason in ("stop", "length"),
                  f"auto (seed {seed}): text answer (finish {c.finish_reason})")
    print(f"     auto: {texts} text answers, {calls} with calls")
    for seed in range(3):
        r = ask([{"role": "user", "content": "no tools"}], tool_choice="none", seed=seed, max_tokens=60)
        c = r.choices[0]
        check(not c.message.tool_calls and isinstance(c.message.content, str) and c.finish_reason in ("stop", "length"),
              f"none (seed {seed}): never a call")


def test_stop_in_content():
    """With tools that may be called the router applies stop strings to the content itself."""
    kw = dict(tool_choice="auto", temperature=0, max_tokens=40)
    full = ask([{"role": "user", "content": "say something"}], **kw).choices[0]
    text = full.message.content or ""
    if full.message.tool_calls or len(text) < 12:
        check(False, f"greedy auto answer is text long enough to cut ({text!r})")
        return
    # A stop string of plain ASCII (the content's replacement characters stand for bytes it lacks).
    starts = [i for i in range(3, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isalnum()]
    if not starts:
        check(False, f"greedy auto answer has two ASCII letters in a row ({text!r})")
        return
    stop = text[starts[0]:starts[0] + 2]
    want = text[:text.find(stop)]
    r = ask([{"role": "user", "content": "say something"}], stop=[stop], **kw).choices[0]
    check(r.finish_reason == "stop" and r.message.content == want,
          f"auto: a stop string ends the content before it ({r.message.content!r} vs {want!r})")
    content, calls, finish, _ = collect_stream(ask([{"role": "user", "content": "say something"}], stop=[stop],
                                                   stream=True, **kw))
    check(finish == "stop" and content == want and not calls, f"auto, streamed: the same ({content!r})")


def test_length_mid_call():
    r = ask([{"role": "user", "content": "short"}], tool_choice="required", seed=1, max_tokens=6)
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6,
          f"max_tokens inside the call: finish_reason length (got {r.choices[0].finish_reason})")


def expect_400(param, what, **kw):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4)
    body.update(kw)
    try:
        client.chat.completions.create(**body)
        check(False, f"{what}: refused")
    except openai.BadRequestError as e:
        got = (e.body if isinstance(e.body, dict) else {}).get("param") or ""
        check(got == param, f"{what}: 400 naming {param} (param {got!r})")


def test_bad_tools():
    pattern = json.loads(json.dumps(TOOLS))
    pattern[0]["function"]["parameters"]["properties"]["city"]["pattern"] = "^[A-Z]"
    expect_400("tools[0].function.parameters.properties.city.pattern", "unsupported schema keyword", tools=pattern)
    not_object = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
    expect_400("tools[0].function.parameters.type", "parameters not an object", tools=not_object)
    expect_400("tool_choice.function.name", "unknown function in tool_choice", tools=TOOLS,
               tool_choice={"type": "function", "function": {"name": "launch_rockets"}})
    expect_400("tool_choice", "tool_choice without tools", tool_choice="required")
    expect_400("tool_choice", "unknown tool_choice", tools=TOOLS, tool_choice="sometimes")
    expect_400("tools[1].function.name", "a name declared twice", tools=[TOOLS[0], TOOLS[0]])
    expect_400("tools[0].function.name", "a bad name", tools=[{"type": "function", "function": {"name": "a b"}}])
    expect_400("tools[0].type", "a tool that is not a function", tools=[{"type": "retrieval"}])
    expect_400("response_format", "response_format with tools", tools=TOOLS, tool_choice="required",
               response_format={"type": "json_object"})
    expect_400("messages[1].tool_call_id", "a tool message without tool_call_id",
               messages=[{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}])
    expect_400("messages[1].tool_calls[0].function.arguments", "tool_calls arguments that are not JSON",
               messages=[{"role": "user", "content": "x"},
                         {"role": "assistant", "tool_calls": [{"id": "functions.f:0", "type": "function",
                                                              "function": {"name": "f", "arguments": "{oops"}}]}])


def test_cluster_equals_local():
    local_base = os.environ.get("K3_LOCAL_BASE_URL")
    if not local_base:
        return
    local = openai.OpenAI(base_url=local_base, api_key="unused", max_retries=0, timeout=300)
    for i, choice in enumerate(["required", {"type": "function", "function": {"name": "get_weather"}}]):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": f"same {i}"}], tools=TOOLS, tool_choice=choice,
                  max_tokens=200, temperature=0, parallel_tool_calls=False)
        a = client.chat.completions.create(**kw).choices[0]
        b = local.chat.completions.create(**kw).choices[0]
        ta = [(x.id, x.function.name, x.function.arguments) for x in a.message.tool_calls or []]
        tb = [(x.id, x.function.name, x.function.arguments) for x in b.message.tool_calls or []]
        check(ta and ta == tb and a.finish_reason == b.finish_reason,
              f"cluster tool call equals local mode's (greedy, {choice if isinstance(choice, str) else 'named'}): {ta}")


def main():
    for t in (test_cluster_equals_local, test_required_random_prompts, test_parallel_calls, test_named, test_streamed,
              test_round_trip, test_auto_and_none, test_stop_in_content, test_length_mid_call, test_bad_tools):
        t()
    check.exit("all tool-call checks passed")


if __name__ == "__main__":
    main()
