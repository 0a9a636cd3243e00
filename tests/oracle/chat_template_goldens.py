#!/usr/bin/env python3
"""Chat template goldens: renders a fixed set of conversations with transformers' jinja renderer
(the code path of apply_chat_template) over llama.cpp's template texts
(tests/data/tokenizer/chat_templates/*.jinja) and writes one JSON line per case:

  {"template": "deepseek-v4"|"kimi-k3", "messages": [...], "add_generation_prompt": bool,
   "thinking": true|false|null (null: not passed, the template's default),
   "thinking_effort": str|null, "text": "<rendered>"}

The first line is a header naming the renderer and versions. tests/tokenizer/chat_template_test.cpp
renders the same cases in C++ and requires byte-identical text.

  python3 tests/oracle/chat_template_goldens.py --out tests/data/tokenizer/chat_goldens.jsonl
  python3 tests/oracle/chat_template_goldens.py --tools --out tests/data/tokenizer/chat_tool_goldens.jsonl

--tools renders the conversations with tools (declarations, assistant tool calls, tool results,
tool_choice) instead; its records also carry "tools" and "tool_choice" (null: not passed). Tool
call arguments are passed as mappings, as vLLM passes them to a template after parsing OpenAI's
JSON-string arguments.

Needs transformers (it uses transformers.utils.chat_template_utils); with --allow-jinja2 it
falls back to a plain jinja2 environment configured as transformers configures it (for a
local check only: the committed goldens say which renderer made them). No network.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "data", "tokenizer", "chat_templates")
FILES = {"deepseek-v4": "deepseek-ai-DeepSeek-V4.jinja", "kimi-k3": "Kimi-K3.jinja"}
BOS = "<｜begin▁of▁sentence｜>"


def m(role, content, reasoning=None):
    d = {"role": role, "content": content}
    if reasoning is not None:
        d["reasoning_content"] = reasoning
    return d


def conversations():
    """(name, messages) for both templates; roles the template does not take are marked."""
    uni = "naïve Ångström — 日本語のテキスト 😀👍🏽 e\u0301 ﷺ \u200d \t tabs\nnew line"
    return [
        ("single_user", [m("user", "Hello!")], True),
        ("system_user", [m("system", "You are a helpful assistant."), m("user", "What is 2+2?")], True),
        ("two_systems", [m("system", "First rule."), m("system", "Second rule."), m("user", "Go.")], True),
        ("multi_turn", [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello! How can I help?"),
                        m("user", "Tell me a joke."), m("assistant", "Why did the chicken cross the road?"),
                        m("user", "Why?")], True),
        ("ends_with_assistant", [m("user", "Question?"), m("assistant", "Answer.", "Let me think... it is 42.")], True),
        ("reasoning_history", [m("user", "Q1"), m("assistant", "A1", "R1"), m("user", "Q2"),
                               m("assistant", "A2", "R2 with\nlines")], True),
        ("reasoning_blank", [m("user", "Q"), m("assistant", "A", " \n\t\u3000 ")], True),
        ("unicode", [m("system", uni), m("user", uni), m("assistant", uni, uni), m("user", "再见 🌍")], True),
        ("empty_content", [m("system", ""), m("user", ""), m("assistant", ""), m("user", "")], True),
        ("none_content", [m("user", None), m("assistant", None), m("user", "x")], True),
        ("markup_in_content", [m("user", 'a "quoted" & <b>bold</b> <|open|>x<|sep|> <｜User｜>'),
                               m("assistant", "</think>not really<think>")], True),
        ("no_messages", [], True),
        ("consecutive_users", [m("user", "part one"), m("user", "part two"), m("assistant", "ok")], True),
        ("developer_and_tool", [m("developer", "dev note"), m("user", "run it"), m("assistant", "calling"),
                                m("tool", "{\"result\": 3}"), m("user", "thanks")], False),
        ("whitespace", [m("system", "  padded  "), m("user", "\n\nlead and trail\n\n"), m("assistant", " ", " x ")], True),
    ]


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def tool_msg(cid, content, name=None):
    d = {"role": "tool", "tool_call_id": cid, "content": content}
    if name is not None:
        d["name"] = name
    return d


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web — returns «snippets» ✓",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
            "Filters": {"type": "object", "properties": {"lang": {"type": "array", "items": {"type": "string"}}}},
            "ratio": {"type": "number", "default": 0.25}, "exact": {"type": "boolean"}},
            "required": ["query"]}}},
]


def tool_conversations():
    """(name, messages, tools, tool_choice) with tools; every one renders with both templates."""
    weather = call("call_1", "get_weather", {"location": "Paris", "unit": "celsius"})
    search = call("call_2", "search", {"query": "a \"quoted\" & <tag>\nline", "limit": 3,
                                       "Filters": {"lang": ["en", "fr"]}, "ratio": 0.5, "exact": True, "none": None})
    return [
        ("tools_offered", [m("system", "You are a helpful assistant."), m("user", "Weather in Paris?")], TOOLS, None),
        ("tools_no_system", [m("user", "Weather in Paris?")], TOOLS[:1], None),
        ("tool_round_trip", [m("user", "Weather in Paris?"),
                             {"role": "assistant", "content": "", "tool_calls": [weather]},
                             tool_msg("call_1", '{"temp": 21, "sky": "clear"}')], TOOLS, None),
        ("tool_round_trip_answered", [m("user", "Weather in Paris?"),
                                      {"role": "assistant", "content": "Let me check.", "tool_calls": [weather],
                                       "reasoning_content": "The user wants weather."},
                                      tool_msg("call_1", "21 C"), m("assistant", "It is 21 C in Paris."),
                                      m("user", "Thanks!")], TOOLS, None),
        ("parallel_calls", [m("system", "Be brief."), m("user", "Weather and news?"),
                            {"role": "assistant", "content": None, "tool_calls": [weather, search]},
                            tool_msg("call_2", "no results"), tool_msg("call_1", "21 C")], TOOLS, None),
        ("tool_results_by_order", [m("user", "Go"),
                                   {"role": "assistant", "content": "", "tool_calls": [weather, search]},
                                   {"role": "tool", "content": "first"}, {"role": "tool", "content": "second"}],
         TOOLS, None),
        ("tool_result_named", [m("user", "Go"), {"role": "assistant", "content": "", "tool_calls": [weather]},
                               tool_msg("other", "named result", name="get_weather")], TOOLS, None),
        ("history_calls_without_tools", [m("user", "Go"), {"role": "assistant", "content": "", "tool_calls": [weather]},
                                         tool_msg("call_1", "21 C"), m("user", "And now?")], None, None),
        ("tool_choice_required", [m("user", "Weather in Paris?")], TOOLS, "required"),
        ("tool_choice_none", [m("user", "Weather in Paris?")], TOOLS, "none"),
        ("tool_choice_auto", [m("user", "Weather in Paris?")], TOOLS, "auto"),
        ("named_messages", [{"role": "system", "content": "Rules.", "name": "ops"},
                            {"role": "user", "content": "Hi", "name": "eve \"e\" & co"},
                            {"role": "assistant", "content": "Hello", "name": "bot"}, m("user", "Go")], TOOLS[:1], None),
    ]


def make_renderer(allow_jinja2):
    try:
        import transformers
        from transformers.utils import chat_template_utils as ctu
        if hasattr(ctu, "render_jinja_template"):
            def render(template, messages, add_gen, kwargs):
                out, _ = ctu.render_jinja_template(conversations=[messages], chat_template=template,
                                                   add_generation_prompt=add_gen, **kwargs)
                return out[0]
            return render, f"transformers {transformers.__version__} render_jinja_template"
        compiled = {}

        def render(template, messages, add_gen, kwargs):
            if template not in compiled:
                compiled[template] = ctu._compile_jinja_template(template)
            return compiled[template].render(messages=messages, add_generation_prompt=add_gen, **kwargs)
        return render, f"transformers {transformers.__version__} _compile_jinja_template"
    except ImportError:
        if not allow_jinja2:
            raise
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception

    def render(template, messages, add_gen, kwargs):
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_gen, **kwargs)
    return render, f"jinja2 {jinja2.__version__} (transformers-like environment; NOT the oracle)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--allow-jinja2", action="store_true")
    ap.add_argument("--tools", action="store_true", help="the conversations with tools (chat_tool_goldens.jsonl)")
    a = ap.parse_args()
    render, renderer = make_renderer(a.allow_jinja2)
    templates = {k: open(os.path.join(TEMPLATES, f), encoding="utf-8").read() for k, f in FILES.items()}
    lines = [json.dumps({"header": True, "renderer": renderer, "python": sys.version.split()[0]}, ensure_ascii=False)]
    n = 0
    if a.tools:
        for tname, ttext in templates.items():
            for name, messages, tools, tool_choice in tool_conversations():
                for thinking in (None, False, True):
                    for add_gen in (True, False):
                        kwargs = {"bos_token": BOS}
                        if thinking is not None:
                            kwargs["thinking"] = thinking
                        if tools is not None:
                            kwargs["tools"] = tools
                        if tool_choice is not None:
                            kwargs["tool_choice"] = tool_choice
                        text = render(ttext, [dict(x) for x in messages], add_gen, kwargs)
                        lines.append(json.dumps({"template": tname, "case": name, "messages": messages, "tools": tools,
                                                 "tool_choice": tool_choice, "add_generation_prompt": add_gen,
                                                 "thinking": thinking, "thinking_effort": None, "text": text},
                                                ensure_ascii=False))
                        n += 1
    for tname, ttext in ({} if a.tools else templates).items():
        for name, messages, kimi_ok in conversations():
            if tname == "kimi-k3" and not kimi_ok:
                continue
            thinking_values = [None, False, True]
            efforts = [None] if tname == "deepseek-v4" else [None, "low"]
            for thinking in thinking_values:
                for effort in efforts:
                    if effort is not None and thinking is False:
                        continue
                    for add_gen in (True, False):
                        kwargs = {"bos_token": BOS}
                        if thinking is not None:
                            kwargs["thinking"] = thinking
                        if effort is not None:
                            kwargs["thinking_effort"] = effort
                        text = render(ttext, [dict(x) for x in messages], add_gen, kwargs)
                        lines.append(json.dumps({"template": tname, "case": name, "messages": messages,
                                                 "add_generation_prompt": add_gen, "thinking": thinking,
                                                 "thinking_effort": effort, "text": text}, ensure_ascii=False))
                        n += 1
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"chat goldens: {n} cases rendered by {renderer} -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
