#!/usr/bin/env python3
"""Converts BFCL's own single-turn items into a samewise customer suite (JSONL, `tool_call`
checks), for the eval benchmark and for anyone who wants BFCL's items beside the shipped
`tool_calls` suite.

    scripts/bfcl-suite.py --out bench/out/bfcl.jsonl            # every category, 1,040 items
    scripts/bfcl-suite.py --out x.jsonl --per-category 50       # the first 50 of each

The items come from the `bfcl-eval` package on PyPI (pinned below, Apache 2.0; downloaded
with `pip download --no-deps` into ~/.cache/samewise/bfcl and read from the wheel, nothing
installed). Categories: `simple_python` (400: exactly one call), `multiple` (200: the right
function among several), `parallel` (200: the same count of calls, any order) and
`irrelevance` (240: no call). Call items send `tool_choice: "required"`, irrelevance items
`"auto"`, as the shipped suite does; `parallel_tool_calls` is true for the parallel items
only (the others want exactly one call); `max_tokens` 128, temperature 0.

BFCL's function docs are Python-flavoured; they become OpenAI tools: type `dict` -> `object`,
`float` -> `number`, `tuple` -> `array`, `any` -> no type; BFCL's `optional` key is dropped;
dots in function names become underscores (OpenAI names allow `[a-zA-Z0-9_-]` only, and
BFCL's own OpenAI handler does the same). Ground truth keeps BFCL's allowed values per
parameter (`""` among them: the parameter may be omitted), which the customer suite's
`tool_call` check scores by BFCL's rules.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import zipfile

PACKAGE = "bfcl-eval==2026.3.23"
CATEGORIES = ["simple_python", "multiple", "parallel", "irrelevance"]
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
CACHE = pathlib.Path.home() / ".cache" / "samewise" / "bfcl"


def wheel() -> pathlib.Path:
    """The bfcl-eval wheel, downloaded from PyPI once."""
    found = sorted(CACHE.glob("bfcl_eval-*.whl"))
    if found:
        return found[-1]
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", "-d", str(CACHE), PACKAGE],
        check=True,
    )
    found = sorted(CACHE.glob("bfcl_eval-*.whl"))
    if not found:
        sys.exit(f"pip download {PACKAGE} left no wheel in {CACHE}")
    return found[-1]


def read_jsonl(z: zipfile.ZipFile, name: str) -> list:
    with z.open(name) as f:
        return [json.loads(line) for line in f if line.strip()]


def schema(s):
    """A BFCL parameter doc as JSON Schema."""
    if isinstance(s, list):
        return [schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k == "optional":
            continue
        if k == "type":
            t = TYPES.get(v, v)
            if t is not None:
                out["type"] = t
        elif k == "properties":
            out["properties"] = {p: schema(d) for p, d in v.items()}
        elif k == "items":
            out["items"] = schema(v)
        else:
            out[k] = v
    return out


def name(n: str) -> str:
    return n.replace(".", "_")


def tool(f: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name(f["name"]),
            "description": f.get("description", ""),
            "parameters": schema(f["parameters"]),
        },
    }


def items(z: zipfile.ZipFile, category: str, limit):
    questions = read_jsonl(z, f"bfcl_eval/data/BFCL_v4_{category}.json")
    answers = {}
    if category != "irrelevance":
        for a in read_jsonl(z, f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json"):
            answers[a["id"]] = a["ground_truth"]
    for q in questions[:limit]:
        turns = q["question"]
        if len(turns) != 1:
            continue  # single-turn categories only
        calls = []
        for truth in answers.get(q["id"], []):
            for fname, args in truth.items():
                calls.append({"name": name(fname), "arguments": args})
        yield {
            "id": q["id"],
            "request": {
                "messages": turns[0],
                "tools": [tool(f) for f in q["function"]],
                "tool_choice": "auto" if category == "irrelevance" else "required",
                # one call wanted: say so, as a caller would (BFCL counts calls)
                "parallel_tool_calls": category == "parallel",
                "max_tokens": 128,
            },
            "check": {"kind": "tool_call", "calls": calls},
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSONL suite to write")
    ap.add_argument("--per-category", type=int, default=None, help="the first N of each category")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    args = ap.parse_args()
    counts = {}
    with zipfile.ZipFile(wheel()) as z, open(args.out, "w") as out:
        for c in args.categories.split(","):
            if c not in CATEGORIES:
                sys.exit(f"unknown category {c!r} (known: {', '.join(CATEGORIES)})")
            n = 0
            for it in items(z, c, args.per_category):
                out.write(json.dumps(it, ensure_ascii=False) + "\n")
                n += 1
            counts[c] = n
    print(f"{sum(counts.values())} items ({counts}) -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
