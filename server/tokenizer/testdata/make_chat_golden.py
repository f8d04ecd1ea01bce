#!/usr/bin/env python3
"""Renders extra Qwen3 chat-template cases with Jinja2 the way transformers does.

transformers (utils/chat_template_utils.py) compiles chat templates in an
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension, replaces tojson with json.dumps(ensure_ascii=False, ...), adds raise_exception and
strftime_now, and renders with messages, tools, documents, add_generation_prompt, the special
tokens map and the caller's kwargs. This script does exactly that without needing transformers
or torch, so it runs anywhere Jinja2 is installed:

    python3 server/tokenizer/testdata/make_chat_golden.py > server/tokenizer/testdata/chat_golden.json

tokenizer_golden.json (made by transformers itself) covers the basic conversations; this file
covers the template's other branches: tools, tool calls, tool responses, reasoning content,
history with <think> blocks. Cases marked "ordered" have dict keys out of sorted order and
float values such as 2.0: the Go test passes them as json.RawMessage, which keeps what a Go map
loses. In the other cases keys are written sorted, so plain Go maps render them identically.
"""
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(here, "..", "..", ".."))
cfg = json.load(open(os.path.join(root, "fixtures", "tokenizers", "qwen3", "tokenizer_config.json")))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
template = env.from_string(cfg["chat_template"])

special = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if cfg.get(k) is not None}
special["additional_special_tokens"] = cfg.get("additional_special_tokens", [])

weather_tool = {"function": {"description": "Get the weather in a city. Ünïcode ☀", "name": "get_weather",
                             "parameters": {"properties": {"city": {"type": "string"}, "days": {"default": 1, "type": "integer"}},
                                            "required": ["city"], "type": "object"}},
                "type": "function"}

cases = [
    {"name": "system-user-no-generation-prompt",
     "messages": [{"content": "Be brief.", "role": "system"}, {"content": "Hi there", "role": "user"}],
     "add_generation_prompt": False, "kwargs": {}},
    {"name": "no-enable-thinking-kwarg",
     "messages": [{"content": "hi", "role": "user"}], "add_generation_prompt": True, "kwargs": {}},
    {"name": "assistant-final-with-think",
     "messages": [{"content": "2+2?", "role": "user"},
                  {"content": "<think>\nadd them\n</think>\n\n4", "role": "assistant"}],
     "add_generation_prompt": False, "kwargs": {"enable_thinking": True}},
    {"name": "history-think-stripped",
     "messages": [{"content": "2+2?", "role": "user"},
                  {"content": "<think>\nadd them\n</think>\n\n4", "role": "assistant"},
                  {"content": "and 3+3?", "role": "user"}],
     "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    {"name": "reasoning-content-field",
     "messages": [{"content": "Why?", "role": "user"},
                  {"content": "Because.", "reasoning_content": "\nthinking hard\n", "role": "assistant"}],
     "add_generation_prompt": False, "kwargs": {}},
    {"name": "tools-and-tool-calls",
     "messages": [{"content": "You help with weather.", "role": "system"},
                  {"content": "Weather in Paris and Tokyo?", "role": "user"},
                  {"content": "Let me check.", "role": "assistant",
                   "tool_calls": [{"function": {"arguments": {"city": "Paris", "days": 2}, "name": "get_weather"}, "type": "function"},
                                  {"function": {"arguments": "{\"city\": \"東京\"}", "name": "get_weather"}, "type": "function"}]},
                  {"content": "{\"temp\": 21.5}", "role": "tool"},
                  {"content": "{\"temp\": 18}", "role": "tool"}],
     "tools": [weather_tool], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    {"name": "tool-call-without-content",
     "messages": [{"content": "Weather?", "role": "user"},
                  {"content": "", "role": "assistant", "tool_calls": [{"arguments": {"city": "Oslo"}, "name": "get_weather"}]},
                  {"content": "cold", "role": "tool"},
                  {"content": "<tool_response>\nnot a query\n</tool_response>", "role": "user"}],
     "tools": [weather_tool], "add_generation_prompt": True, "kwargs": {}},
    {"name": "tools-insertion-order-and-floats", "ordered": True,
     "messages": [{"role": "user", "content": "Convert 2 units"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "convert", "arguments": {"value": 2.0, "unit": "m", "precision": 3, "scale": 1e-05}}}]},
                  {"role": "tool", "content": "200.0 cm"}],
     "tools": [{"type": "function", "function": {"name": "convert", "description": "Unit conversion",
                                                 "parameters": {"type": "object", "required": ["value", "unit"],
                                                                "properties": {"value": {"type": "number"}, "unit": {"type": "string"}}}}}],
     "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    {"name": "unicode-and-specials-in-content",
     "messages": [{"content": "Привет 👋 <|endoftext|> \"quotes\" \\ back", "role": "user"},
                  {"content": "\n\nanswer with leading newlines", "role": "assistant"},
                  {"content": "late system", "role": "system"},
                  {"content": "ok", "role": "user"}],
     "add_generation_prompt": True, "kwargs": {"enable_thinking": True}},
]

out = []
for c in cases:
    rendered = template.render(messages=c["messages"], tools=c.get("tools"), documents=None,
                               add_generation_prompt=c["add_generation_prompt"], **special, **c["kwargs"])
    c = dict(c)
    c["rendered"] = rendered
    out.append(c)
json.dump({"generator": "jinja2 %s, transformers-equivalent environment (make_chat_golden.py)" % jinja2.__version__,
           "cases": out}, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
