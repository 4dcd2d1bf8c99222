#!/usr/bin/python3
"""Checks the server's reading of an OpenAI tool-calling request.

    check_tool_prompt.py FOLLOW_UP_JSON MODEL_DIR

FOLLOW_UP_JSON (openai_tools.mjs writes it) holds a chat request with an
assistant's tool_calls and a tool message, and the prompt_tokens the server
answered. This renders the request's conversation as transformers'
apply_chat_template would (the model's chat template in python3-jinja2,
configured as tests/chat/render_reference.py does; each call's arguments
JSON text given as the object transformers' templates expect; tools as
written; add_generation_prompt on), splits it as the model's tokenizer.json
does (its added tokens whole, every other byte one token: the vocabulary
has no merges), and requires the same count.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chat"))
from render_reference import environment  # noqa: E402


def main(follow_up_path, model_dir):
    with open(follow_up_path, encoding="utf-8") as f:
        follow_up = json.load(f)
    request = follow_up["request"]
    messages = []
    for m in request["messages"]:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                function = dict(c["function"])
                function["arguments"] = json.loads(function["arguments"])
                c["function"] = function
                calls.append(c)
            m["tool_calls"] = calls
        messages.append(m)
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    text = environment().from_string(config["chat_template"]).render(
        messages=messages, tools=request["tools"], documents=None,
        add_generation_prompt=True, eos_token=config["eos_token"],
        bos_token=config["bos_token"])
    added = sorted((t["content"] for t in tokenizer["added_tokens"]), key=len, reverse=True)
    pattern = "|".join(re.escape(a) for a in added)
    tokens = 0
    pos = 0
    for m in re.finditer(pattern, text):
        tokens += len(text[pos:m.start()].encode("utf-8")) + 1
        pos = m.end()
    tokens += len(text[pos:].encode("utf-8"))
    assert tokens == follow_up["prompt_tokens"], (tokens, follow_up["prompt_tokens"], text)
    print(f"ok    the follow-up renders as transformers renders it ({tokens} tokens)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
