"""Drives samewise with the official `openai` Python package, as an application would.

Usage: python3 openai_client.py BASE_URL API_KEY MODEL

Runs, in this order (the Rust test scripts the mock upstream to match):
  1. a streamed chat completion with `stream_options.include_usage`;
  2. a chat completion with `tools` that comes back with a tool call;
  3. a chat completion with `logprobs` and `top_logprobs=2`;
  4. `models.list()`, `models.retrieve(MODEL)`, and `models.retrieve` of an unknown name,
     which must raise the SDK's `NotFoundError` with OpenAI's code.
Each answer must come back intact through the SDK's own parsing; any failure raises and the
script exits non-zero. On success it prints one JSON object summarising what came back, for
the Rust test to compare exactly with what the mock upstream sent.
"""

import json
import sys

import openai


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    base_url, api_key, model = sys.argv[1:4]
    # no retries: a failure must show, not be papered over by the SDK
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30.0)
    out = {"openai_version": openai.__version__}

    # 1. streamed chat with usage
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in five words."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles, chunks = [], None, None, [], 0
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    assert roles == ["assistant"], f"expected one assistant role delta, got {roles}"
    assert text, "the stream carried no content"
    assert finish == "stop", f"finish_reason {finish!r}"
    assert usage is not None and usage.completion_tokens > 0, f"usage {usage!r}"
    out["stream"] = {
        "text": "".join(text),
        "finish_reason": finish,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "chunks": chunks,
    }

    # 2. a tool call
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                    "required": ["city"],
                },
            },
        }
    ]
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=tools,
        tool_choice="auto",
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1, f"expected one tool call, got {calls!r}"
    args = json.loads(calls[0].function.arguments)
    assert args.get("city") == "Oslo", f"arguments {args!r}"
    out["tool_call"] = {"id": calls[0].id, "name": calls[0].function.name, "arguments": calls[0].function.arguments}

    # 3. logprobs
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to three."}],
        logprobs=True,
        top_logprobs=2,
    )
    choice = resp.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content, "no logprobs came back"
    tokens = [t.token for t in choice.logprobs.content]
    assert "".join(tokens) == choice.message.content, f"logprob tokens {tokens!r} do not spell the content"
    for t in choice.logprobs.content:
        assert t.logprob <= 0.0, f"logprob {t.logprob} > 0"
        assert len(t.top_logprobs) == 2, f"top_logprobs {t.top_logprobs!r}"
    out["logprobs"] = {
        "tokens": tokens,
        "logprobs": [t.logprob for t in choice.logprobs.content],
        "top": [[a.token for a in t.top_logprobs] for t in choice.logprobs.content],
    }

    # 4. the model routes
    listed = [m.id for m in client.models.list()]
    one = client.models.retrieve(model)
    assert one.id == model and one.object == "model", f"retrieve {one!r}"
    try:
        client.models.retrieve("no-such-model")
        raise AssertionError("retrieving an unknown model did not fail")
    except openai.NotFoundError as e:
        missing = {"status": e.status_code, "code": e.code}
    out["models"] = {"listed": listed, "retrieved": one.id, "missing": missing}

    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
