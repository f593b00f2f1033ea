#!/usr/bin/env python3
"""Markdown table of medians from bench/engine/run.sh's raw output (stdlib only)."""

import json
import re
import statistics
import sys


def main() -> int:
    ours_path, llama_path, threads = sys.argv[1], sys.argv[2], sys.argv[3]
    ours = {"1": [], "8": [], "gen": [], "rss": []}
    for line in open(ours_path, encoding="utf-8"):
        if m := re.match(r"score: batch (\d+) x \d+ tokens: ([\d.]+) prompt tokens/s", line):
            ours.setdefault(m.group(1), []).append(float(m.group(2)))
        elif m := re.match(r"generate: \d+ tokens: ([\d.]+) tokens/s", line):
            ours["gen"].append(float(m.group(1)))
        elif m := re.search(r"RSS (?:after run )?([\d.]+) MiB", line):
            ours["rss"].append(float(m.group(1)))
    llama = {"1": [], "8": [], "gen": []}
    version = "?"
    for line in open(llama_path, encoding="utf-8"):
        if not line.strip():
            continue
        r = json.loads(line)
        version = r.get("llama_cpp_python", version)
        for b, vals in r["score"].items():
            llama.setdefault(b, []).extend(vals)
        llama["gen"].extend(r["generate"])

    def med(v):
        return statistics.median(v) if v else float("nan")

    rows = [
        ("prompt tokens/s, 512-token sequences, batch 1", "1"),
        ("prompt tokens/s, 512-token sequences, batch 8", "8"),
        ("generated tokens/s (greedy, 128 tokens)", "gen"),
    ]
    n = max(len(ours["gen"]), 1)
    print(f"SmolLM2-135M-Instruct Q4_1, {threads} threads, median of {n} repeats "
          f"(llama-cpp-python {version}; samewise exact f32, llama.cpp 8-bit activations in Q4_1 kernels)\n")
    print("| measure | samewise | llama.cpp | samewise / llama.cpp |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        a, b = med(ours.get(key, [])), med(llama.get(key, []))
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    if ours["rss"]:
        print(f"\nsamewise RSS with the model loaded (max seen in the bench): {max(ours['rss']):.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
