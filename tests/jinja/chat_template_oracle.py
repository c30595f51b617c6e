"""Independent oracle for the chat-template engine: renders random conversations through Hugging Face
transformers' chat-template renderer (render_jinja_template, the function apply_chat_template calls, with
its Jinja2 sandbox, trim_blocks/lstrip_blocks and tojson) and writes one JSON line per case:
  {"template": NAME, "context": {...what the template saw...}, "openai": bool, "expected": TEXT}
or "error": MESSAGE instead of "expected" when the template raised. "openai" marks cases whose messages
are plain OpenAI chat messages (string content and string tool arguments), which the server's own
message parsing must be able to carry.

usage: chat_template_oracle.py --out FILE --seed N --count N --template NAME=PATH [--template ...]
Exit 77 when transformers or jinja2 is missing (the test is skipped).
"""
import argparse
import json
import random
import sys

try:
    from transformers.utils.chat_template_utils import render_jinja_template
except ImportError as e:  # pragma: no cover
    print(f"transformers is not installed: {e}", file=sys.stderr)
    sys.exit(77)

WORDS = ["hello", "world", "Kimi", "weather", "Paris", "the", "a", "tool", "résumé", "naïve", "日本語", "中文字符",
         "emoji 🚀", "Ωμέγα", "Привет", "{{ not a tag }}", "{% if x %}", "{# no comment #}", "\"quoted\"", "it's",
         "back\\slash", "tab\there", "line\nbreak", "  padded  ", "<|im_end|>", "</s>", "100%", "a&b<c>", "\u00a0nbsp",
         "\r\ncrlf", "\x01ctl", "null", "True", "{}", "[]"]
NAMES = ["get_weather", "search", "run_code", "lookup_user", "translate"]


def text(rng, lo=0, hi=8):
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    sep = rng.choice([" ", " ", "\n", ""])
    s = sep.join(words)
    if rng.random() < 0.15:
        s = " " + s + "\n"
    return s


def json_value(rng, depth=0):
    kind = rng.randint(0, 7 if depth < 2 else 4)
    if kind == 0:
        return rng.randint(-1000, 1000)
    if kind == 1:
        return rng.choice([0.5, 1.25, -3.0, 1e-3, 2.5e-7, 1e16, 123456.789, 0.1])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return text(rng, 0, 3)
    if kind in (5, 6):
        return {f"k{i}_{rng.choice(WORDS)[:4]}": json_value(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def tool(rng, name):
    props = {}
    for i in range(rng.randint(0, 3)):
        props[f"p{i}"] = {"type": rng.choice(["string", "integer", "number", "boolean"]),
                          "description": text(rng, 0, 4)}
        if rng.random() < 0.3:
            props[f"p{i}"]["default"] = json_value(rng, 1)
    fn = {"name": name, "description": text(rng, 1, 5),
          "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]}}
    return {"type": "function", "function": fn}


def conversation(rng, with_bad_role):
    """Messages in the form the server hands a template: role, content, then name, tool_calls,
    tool_call_id where present (keys in that order)."""
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng, 1, 6)})
    call_index = 0
    for _ in range(rng.randint(1, 5)):
        user = {"role": "user", "content": text(rng, 1, 8)}
        if rng.random() < 0.15:
            user["name"] = rng.choice(["alice", "bob_2", "Zoë"])
        msgs.append(user)
        if rng.random() < 0.4:
            calls = []
            for _ in range(rng.randint(1, 3)):
                name = rng.choice(NAMES)
                args = {"x": json_value(rng, 1), "q": text(rng, 0, 3)}
                calls.append({"id": f"functions.{name}:{call_index}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
                call_index += 1
            msgs.append({"role": "assistant", "content": text(rng, 0, 3) if rng.random() < 0.5 else "",
                         "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "content": text(rng, 0, 6), "tool_call_id": c["id"]})
        if rng.random() < 0.7:
            msgs.append({"role": "assistant", "content": text(rng, 1, 8)})
        if rng.random() < 0.05:
            msgs.append({"role": "system", "content": text(rng, 1, 4)})
    if with_bad_role:
        msgs.insert(rng.randint(0, len(msgs)), {"role": rng.choice(["developer", "robot", ""]), "content": "x"})
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--template", action="append", required=True)
    a = ap.parse_args()
    templates = []
    for spec in a.template:
        name, path = spec.split("=", 1)
        with open(path, encoding="utf-8") as f:
            src = f.read()
        if path.endswith(".json"):  # a tokenizer_config.json: its chat_template
            src = json.loads(src)["chat_template"]
        templates.append((name, src))
    rng = random.Random(a.seed)
    with open(a.out, "w", encoding="utf-8") as out:
        for i in range(a.count):
            msgs = conversation(rng, with_bad_role=rng.random() < 0.05)
            tools = [tool(rng, n) for n in rng.sample(NAMES, rng.randint(1, 3))] if rng.random() < 0.4 else None
            openai = True
            if rng.random() < 0.2:  # arguments as objects, as some clients send them
                for m in msgs:
                    for c in m.get("tool_calls", []):
                        c["function"]["arguments"] = json.loads(c["function"]["arguments"])
                        openai = False
            specials = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
            agp = rng.random() < 0.8
            context = {"messages": msgs, "tools": tools, "documents": None, "add_generation_prompt": agp, **specials}
            for name, src in templates:
                case = {"template": name, "context": context, "openai": openai}
                try:
                    case["expected"] = render_jinja_template(
                        conversations=[msgs], tools=tools, chat_template=src, add_generation_prompt=agp,
                        **specials)[0][0]
                except Exception as e:  # the template raised (raise_exception) or failed
                    case["error"] = f"{type(e).__name__}: {e}"
                out.write(json.dumps(case, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
