#!/usr/bin/env python3
"""The official openai client against k3-router (started by run_openai_client_test.py).

Checks chat and completions, streamed and not: content, finish_reason, usage, the raw SSE framing,
errors as openai exceptions, and the equivalence contract: greedy tokens through the API equal
`k3-generate --json` tokens for the same prompt.
"""
import json
import os
import subprocess

import urllib.request

import openai

from openai_checks import CheckLog, extra

BASE = os.environ["K3_BASE_URL"]
MODEL_DIR = os.environ["K3_MODEL_DIR"]
BIN = os.environ["K3_BIN_DIR"]
MODEL = "k3-tiny"
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
check = CheckLog()


def k3_generate(args, max_tokens):
    out = subprocess.run([os.path.join(BIN, "k3-generate"), "--model", MODEL_DIR, "--json", "--threads", "2",
                          "--prefill-chunk", "256", "--max-tokens", str(max_tokens)] + args,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def test_models():
    ids = [m.id for m in client.models.list().data]
    check(ids == [MODEL], f"models.list() == [{MODEL}] (got {ids})")


def test_chat():
    msgs = [{"role": "user", "content": "Say something"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    c = r.choices[0]
    check(r.object == "chat.completion", "chat object")
    check(c.message.role == "assistant", "chat role")
    check(isinstance(c.message.content, str) and len(c.message.content) > 0, f"chat content non-empty: {c.message.content!r}")
    check(c.finish_reason == "length", f"chat finish_reason length (got {c.finish_reason})")
    check(r.usage.completion_tokens == 8, f"chat usage.completion_tokens == 8 (got {r.usage.completion_tokens})")
    check(r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + 8, "chat usage totals")

    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    check(chunks[0].choices[0].delta.role == "assistant", "stream: first delta has the role")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(text == c.message.content, "stream: content equals the non-streamed greedy content")
    check(finishes == ["length"], f"stream: one finish_reason length (got {finishes})")
    check(not chunks[-1].choices and chunks[-1].usage is not None, "stream: last chunk carries usage, no choices")
    check(chunks[-1].usage.completion_tokens == 8, "stream: usage.completion_tokens == 8")
    check(all(ch.usage is None for ch in chunks[:-1]), "stream: usage null before the final chunk")


def test_completions():
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    check(r.object == "text_completion", "completion object")
    check(len(c.text) > 0, f"completion text non-empty: {c.text!r}")
    check(c.finish_reason == "length", "completion finish_reason")
    check(r.usage.completion_tokens == 6, "completion usage")
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    check("".join(ch.choices[0].text for ch in chunks) == c.text, "completion stream text equals non-streamed")
    check(chunks[-1].choices[0].finish_reason == "length", "completion stream finish_reason")
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=3, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    check(lp is not None and len(lp.token_logprobs) == len(lp.tokens) >= 1, "completion logprobs present")
    # The penalties as the client sends them: accepted, and deterministic under a seed.
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0.7, seed=5, presence_penalty=0.6,
              frequency_penalty=1.2, extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    check(a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 6,
          "presence/frequency penalties accepted, the same text twice under one seed")
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3, temperature=1.0, seed=2,
                                  logit_bias={"7": 100}, extra_body={"ignore_eos": True, "return_token_ids": True})
    ids = r.model_dump()["choices"][0].get("token_ids")
    check(ids == [7, 7, 7], f"logit_bias {{'7': 100}} makes token 7 certain (got {ids})")
    try:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, frequency_penalty=2.5)
        check(False, "frequency_penalty=2.5 raises")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "frequency_penalty",
              "frequency_penalty=2.5 (outside [-2, 2]) -> BadRequestError naming it")


def test_sse_framing():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}, "extra": "ignored field"}
    req = urllib.request.Request(BASE + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        check(r.status == 200, "raw SSE status 200")
        check(r.headers["content-type"].startswith("text/event-stream"), "raw SSE content type")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    data = [e for e in events if not e.startswith(":")]
    check(raw.endswith("data: [DONE]\n\n"), "raw SSE ends with data: [DONE] and a blank line")
    check(all(e.startswith("data: ") and "\n" not in e for e in data), "raw SSE: every event is one data: line")
    parsed = [json.loads(e[6:]) for e in data[:-1]]
    check(all(p["object"] == "chat.completion.chunk" for p in parsed), "raw SSE: chunk objects")
    check(len({p["id"] for p in parsed}) == 1, "raw SSE: one id for the whole stream")


def test_errors():
    try:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        check(False, "unknown model raises")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.body["code"] == "model_not_found", "unknown model -> NotFoundError 404")
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=17)
        check(False, "n=17 raises")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "n", "n=17 (above the maximum 16) -> BadRequestError naming n")
    try:
        client.chat.completions.create(model=MODEL, messages=[])
        check(False, "empty messages raises")
    except openai.BadRequestError as e:
        check(e.body["param"] == "messages", "empty messages -> 400 naming messages")


def test_equivalence():
    n = 12
    # Chat: the same single user message through the chat template.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello there"}],
                                       max_tokens=n, temperature=0, extra_body={"return_token_ids": True})
    ref = k3_generate(["--prompt", "Hello there"], n)
    got = extra(r.choices[0], "token_ids")
    check(got == ref["tokens"], f"chat greedy tokens == k3-generate ({got} vs {ref['tokens']})")
    check(extra(r, "prompt_token_ids") == ref["prompt_tokens"], "chat prompt tokens == k3-generate")
    # Completions: raw text and token-id prompts.
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=n, temperature=0,
                                  extra_body={"return_token_ids": True})
    ref = k3_generate(["--raw", "--prompt", "The quick brown fox"], n)
    check(extra(r.choices[0], "token_ids") == ref["tokens"], "completion (text) greedy tokens == k3-generate")
    ids = [5, 17, 99, 3, 42, 7]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=n, temperature=0,
                                  extra_body={"return_token_ids": True})
    ref = k3_generate(["--prompt-ids", ",".join(map(str, ids))], n)
    check(extra(r.choices[0], "token_ids") == ref["tokens"], "completion (ids) greedy tokens == k3-generate")
    check(r.usage.completion_tokens == len(ref["tokens"]), "usage.completion_tokens == k3-generate token count")


def close(a, b, tol=1e-3):
    return abs(a - b) <= tol


def chat_logprobs(c, stream):
    msgs = [{"role": "user", "content": "Tell me about logprobs"}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
              extra_body={"ignore_eos": True})
    if not stream:
        return c.chat.completions.create(**kw).choices[0].logprobs.content
    out = []
    for ch in c.chat.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            out += ch.choices[0].logprobs.content
    return out


def test_logprobs():
    """Chat and completions logprobs; in cluster mode they must equal local mode's (a plain k3-router)."""
    got = chat_logprobs(client, stream=False)
    check(len(got) == 6 and all(len(t.top_logprobs) == 3 for t in got), "chat logprobs: 6 tokens, 3 alternatives each")
    check(all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob for t in got),
          "chat logprobs: <= 0, alternatives most likely first")
    check(all(close(t.logprob, t.top_logprobs[0].logprob) for t in got), "greedy: the sampled token is the most likely")
    streamed = chat_logprobs(client, stream=True)
    check([t.token for t in streamed] == [t.token for t in got] and
          all(close(a.logprob, b.logprob, 1e-6) for a, b in zip(streamed, got)), "chat logprobs streamed == not streamed")
    local_url = os.environ.get("K3_LOCAL_BASE_URL")
    if not local_url:
        return
    local = openai.OpenAI(base_url=local_url, api_key="unused", max_retries=0, timeout=120)
    ref = chat_logprobs(local, stream=False)
    check([t.token for t in got] == [t.token for t in ref], "cluster chat logprob tokens == local mode's")
    worst = max(abs(a.logprob - b.logprob) for a, b in zip(got, ref))
    alts = all([x.token for x in a.top_logprobs] == [x.token for x in b.top_logprobs] and
               all(close(x.logprob, y.logprob) for x, y in zip(a.top_logprobs, b.top_logprobs)) for a, b in zip(got, ref))
    check(worst <= 1e-3 and alts, f"cluster chat logprobs == local mode's within 1e-3 (worst {worst:.2e})")
    kw = dict(model=MODEL, prompt=[5, 17, 99, 3], max_tokens=5, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw).choices[0].logprobs, local.completions.create(**kw).choices[0].logprobs
    check(a.tokens == b.tokens and all(close(x, y) for x, y in zip(a.token_logprobs, b.token_logprobs)) and
          [sorted(d) for d in a.top_logprobs] == [sorted(d) for d in b.top_logprobs],
          "cluster completion logprobs == local mode's")


def test_request_id():
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "id"}], max_tokens=2,
        extra_headers={"X-Request-Id": "openai-client-trace-1"})
    check(raw.headers.get("x-request-id") == "openai-client-trace-1", "X-Request-Id is returned as sent")
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "id"}],
                                                           max_tokens=2)
    check((raw.headers.get("x-request-id") or "").startswith("req-"), "a request without X-Request-Id gets one")


def test_health_after():
    with urllib.request.urlopen(BASE.rsplit("/v1", 1)[0] + "/health", timeout=30) as r:
        check(r.status == 200 and json.loads(r.read())["status"] == "ok", "health OK at the end")


for t in (test_models, test_chat, test_completions, test_sse_framing, test_errors, test_equivalence, test_logprobs,
          test_request_id, test_health_after):
    try:
        t()
    except Exception as e:  # noqa: BLE001 - report and continue with the other checks
        check(False, f"{t.__name__} raised {type(e).__name__}: {e}")
check.exit("all openai client checks passed")
