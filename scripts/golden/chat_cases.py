#!/usr/bin/env python3
"""Expected chat-template renderings from Hugging Face `transformers` (apply_chat_template).

Writes reference-engine/tests/fixtures/chat_template_cases.json: templates (the test model's
own from its GGUF, and the templates in scripts/golden/templates/) and cases (messages,
tools, add_generation_prompt or continue_final_message, extra variables) with the exact string HF renders, or the
message of the exception the template raises. The engine's tests render the same cases with
minijinja and compare byte for byte. Run with the golden venv (see generate.py):

  .venv-golden/bin/python scripts/golden/chat_cases.py
"""

import json
import pathlib
import sys

from transformers import AutoTokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from generate import FIXTURES, default_model  # noqa: E402

TEMPLATES_DIR = pathlib.Path(__file__).resolve().parent / "templates"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city. Returns <json> & units.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}},
}

TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 18}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]

CASES = [
    ("smollm2", "single_user", [{"role": "user", "content": "Hello!"}], None, True, {}),
    (
        "smollm2",
        "system_and_turns",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
        True,
        {},
    ),
    ("smollm2", "no_generation_prompt", [{"role": "user", "content": "Line one\nLine two\n\n  indented"}], None, False, {}),
    ("smollm2", "unicode_and_quotes", [{"role": "user", "content": "Ünïcødé \"quotes\" 'single' <tag> & ampersand 🚀"}], None, True, {}),
    (
        "smollm2",
        "tool_result_role",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"},
            {"role": "tool", "content": "{\"temp_c\": 18}"},
        ],
        None,
        True,
        {},
    ),
    ("qwen_tools", "tools_in_system", [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Weather?"}], [WEATHER_TOOL, TIME_TOOL], True, {}),
    ("qwen_tools", "tools_default_system", [{"role": "user", "content": "Weather?"}], [WEATHER_TOOL], True, {}),
    ("qwen_tools", "tool_calls_and_results", TOOL_TURNS, [WEATHER_TOOL, TIME_TOOL], True, {}),
    ("qwen_tools", "no_tools", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], None, False, {}),
    (
        "features",
        "python_methods_and_tojson",
        [
            {"role": "system", "content": "  Stay calm & \"quote\" <b>.  "},
            {"role": "user", "content": "!Run the thing now"},
            {"role": "assistant", "content": "  done  "},
            {"role": "user", "content": "Is it really done?"},
        ],
        None,
        True,
        {"meta": {"zeta": 1, "alpha": [1.5, True, None, "ü<&>"], "nested": {"b": {}, "a": []}}},
    ),
    ("features", "no_generation_prompt", [{"role": "user", "content": "plain"}], None, False, {}),
    # "continue": continue_final_message (the last message's end of turn cut: a prefill)
    ("smollm2", "continue_prefill", [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My favourite colour is"}], None, "continue", {}),
    ("smollm2", "continue_trailing_space", [{"role": "user", "content": "Write a list."}, {"role": "assistant", "content": "Sure, here it is:\n1. "}], None, "continue", {}),
    ("features", "continue_trimmed", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  Well,  "}], None, "continue", {}),
    ("qwen_tools", "continue_with_tools", [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Let me check"}], [WEATHER_TOOL], "continue", {}),
    ("features", "raise_exception", [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}], None, True, {}),
]


def main() -> int:
    model = default_model()
    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    templates = {"smollm2": tok.chat_template}
    for path in sorted(TEMPLATES_DIR.glob("*.jinja")):
        templates[path.stem] = path.read_text(encoding="utf-8")
    cases = []
    for template, name, messages, tools, end, extra in CASES:
        agp, cont = end is True, end == "continue"
        case = {"name": name, "template": template, "messages": messages, "tools": tools, "add_generation_prompt": agp, "extra": extra}
        if cont:
            case["continue_final_message"] = True
        try:
            case["expected"] = tok.apply_chat_template(
                messages,
                tools=tools,
                chat_template=templates[template],
                tokenize=False,
                add_generation_prompt=agp,
                continue_final_message=cont,
                **extra,
            )
        except Exception as e:  # the template's raise_exception
            case["expected_error"] = str(e)
        cases.append(case)
    out = {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "templates": templates, "cases": cases}
    (FIXTURES / "chat_template_cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
