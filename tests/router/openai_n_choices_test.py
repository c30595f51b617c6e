#!/usr/bin/env python3
"""n > 1 with the official openai client (started by run_openai_client_test.py, local or k3-cluster).

n samples of one prompt share one prefill: the server's k3_prompts_prefilled_total grows by 1 for a
request with n = 3. The response has choices with index 0..n-1, streamed and not; usage counts every
choice's tokens. Choice 0 keeps the request's seed, so it equals the same request with n = 1 (n = 1 is
unchanged); the other choices draw other tokens. Against k3-cluster, every choice of a seeded request
equals local mode's (K3_LOCAL_BASE_URL, a k3-router on the same model). Bad n is a 400 naming `n`.
"""
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

import openai

from openai_checks import CheckLog, extra

BASE = os.environ["K3_BASE_URL"]
LOCAL = os.environ.get("K3_LOCAL_BASE_URL")
MODEL = "k3-tiny"
N = 3
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
local = openai.OpenAI(base_url=LOCAL, api_key="unused", max_retries=0, timeout=120) if LOCAL else None
check = CheckLog()
MSGS = [{"role": "user", "content": "Tell me three things"}]
SAMPLED = dict(max_tokens=8, temperature=1.0, seed=1234, extra_body={"ignore_eos": True, "return_token_ids": True})


def prompts_prefilled():
    url = BASE.rsplit("/v1", 1)[0] + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    m = re.search(r"^k3_prompts_prefilled_total (\d+)$", text, re.M)
    if not m:
        sys.exit("k3_prompts_prefilled_total is missing from /metrics")
    return int(m.group(1))


def settled_prefills(expect_at_least):
    """The counter once it reached `expect_at_least` and then held still for 2 s (cluster mode reads it
    from the prefill stages' heartbeats, which lag by a heartbeat interval)."""
    deadline = time.time() + 30
    value = prompts_prefilled()
    while value < expect_at_least and time.time() < deadline:
        time.sleep(0.2)
        value = prompts_prefilled()
    time.sleep(2)
    return prompts_prefilled()


def choice_ids(choices):
    return [extra(c, "token_ids") for c in sorted(choices, key=lambda c: c.index)]


def test_one_prefill_non_streamed():
    before = settled_prefills(0)
    r = client.chat.completions.create(model=MODEL, messages=MSGS, n=N, **SAMPLED)
    after = settled_prefills(before + 1)
    check(after - before == 1, f"n={N}: one prefill (k3_prompts_prefilled_total +{after - before})")
    check(sorted(c.index for c in r.choices) == list(range(N)), f"choices have index 0..{N - 1}")
    check(all(c.finish_reason == "length" for c in r.choices), "every choice ends on length")
    ids = choice_ids(r.choices)
    check(all(len(t) == 8 for t in ids), "every choice has 8 token ids")
    check(r.usage.completion_tokens == N * 8, f"usage sums the choices ({r.usage.completion_tokens} == {N * 8})")
    check(r.usage.total_tokens == r.usage.prompt_tokens + N * 8, "usage total")
    check(len({tuple(t) for t in ids}) > 1, "the choices' seed streams differ")
    one = client.chat.completions.create(model=MODEL, messages=MSGS, **SAMPLED)
    check(choice_ids(one.choices)[0] == ids[0], "choice 0 equals the n=1 request with the same seed")
    return r


def test_streamed(non_streamed):
    before = settled_prefills(0)
    stream = client.chat.completions.create(model=MODEL, messages=MSGS, n=N, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED)
    text = {i: "" for i in range(N)}
    roles, finishes, usage = set(), {}, None
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.role:
                roles.add(c.index)
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                check(c.index not in finishes, f"stream: one finish_reason for choice {c.index}")
                finishes[c.index] = c.finish_reason
    after = settled_prefills(before + 1)
    check(after - before == 1, f"stream n={N}: one prefill (+{after - before})")
    check(roles == set(range(N)), f"stream: a role delta per choice (got {sorted(roles)})")
    check(finishes == {i: "length" for i in range(N)}, f"stream: each choice finishes (got {finishes})")
    want = {c.index: c.message.content for c in non_streamed.choices}
    check(text == want, "stream: each choice's text equals the non-streamed one")
    check(usage is not None and usage.completion_tokens == N * 8, "stream: usage sums the choices")


def test_completions():
    r = client.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=5, temperature=0.8, seed=7,
                                  extra_body={"ignore_eos": True})
    check(sorted(c.index for c in r.choices) == [0, 1], "completions: choices 0 and 1")
    check(r.usage.completion_tokens == 10, "completions: usage sums both choices")


def test_bad_n():
    for n in (0, 17, "3"):
        try:
            client.chat.completions.create(model=MODEL, messages=MSGS, n=n, max_tokens=2)
            check(False, f"n={n!r} is refused")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            param = body.get("param") or (body.get("error") or {}).get("param")
            check(param == "n", f"n={n!r}: 400 naming n (got {param!r}: {e})")


def test_equals_local():
    if not local:
        return
    got = client.chat.completions.create(model=MODEL, messages=MSGS, n=N, **SAMPLED)
    want = local.chat.completions.create(model=MODEL, messages=MSGS, n=N, **SAMPLED)
    check(choice_ids(got.choices) == choice_ids(want.choices),
          f"cluster choices equal local mode's token for token (seeded, n={N})")
    check([c.message.content for c in sorted(got.choices, key=lambda c: c.index)] ==
          [c.message.content for c in sorted(want.choices, key=lambda c: c.index)], "and their texts")
    # Streamed from the cluster: each choice's text equals local mode's non-streamed one.
    text = {i: "" for i in range(N)}
    for ch in client.chat.completions.create(model=MODEL, messages=MSGS, n=N, stream=True, **SAMPLED):
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
    check(text == {c.index: c.message.content for c in want.choices}, "streamed cluster choices equal local mode's")
    # logprobs ride along per choice, equal to local mode's.
    got = client.chat.completions.create(model=MODEL, messages=MSGS, n=2, logprobs=True, top_logprobs=2, **SAMPLED)
    want = local.chat.completions.create(model=MODEL, messages=MSGS, n=2, logprobs=True, top_logprobs=2, **SAMPLED)
    lp = lambda r: [[round(t.logprob, 4) for t in c.logprobs.content] for c in sorted(r.choices, key=lambda c: c.index)]
    check(lp(got) == lp(want), "per-choice logprobs equal local mode's")


def main():
    r = test_one_prefill_non_streamed()
    test_streamed(r)
    test_completions()
    test_bad_n()
    test_equals_local()
    check.exit("all n-choice checks passed")


if __name__ == "__main__":
    main()
