#!/usr/bin/env bash
# Engine benchmark (not a test; CI does not run it): the samewise reference engine against
# llama.cpp (llama-cpp-python) on the same GGUF and thread count, in one run.
#
#   bench/engine/run.sh            # REPEATS=5 THREADS=2 by default
#
# Measures prompt tokens/s scoring 512-token sequences at batch 1 and 8 (logits at every
# position) and generated tokens/s (greedy), alternating the two engines repeat by repeat so
# both see the same machine load, and prints a markdown table of medians. The samewise side
# is `cargo run --release -p samewise-engine --example bench`; the llama.cpp side is
# bench/engine/llama_bench.py in .venv-bench (installed here on first use, built from source
# under `nice` with one build job so it does not starve other work). Raw output goes to
# bench/out/engine/.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
REPEATS="${REPEATS:-5}"
MODEL="${SAMEWISE_MODEL:-$(scripts/fetch-model.sh)}"
VENV="$ROOT/.venv-bench"
OUT="$ROOT/bench/out/engine"
mkdir -p "$OUT"

if ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    echo "installing llama-cpp-python into $VENV (builds llama.cpp from source)" >&2
    python3 -m venv "$VENV"
    CMAKE_BUILD_PARALLEL_LEVEL=1 nice -n 19 "$VENV/bin/pip" install --progress-bar off -r bench/engine/requirements.txt >&2
fi

cargo build --release -p samewise-engine --example bench >&2
BENCH="$ROOT/target/release/examples/bench"

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
: > "$OUT/samewise.txt"
: > "$OUT/llama.jsonl"
for i in $(seq 1 "$REPEATS"); do
    echo "repeat $i/$REPEATS" >&2
    "$BENCH" --model "$MODEL" --threads "$THREADS" --len 512 --gen 128 --batches 1,8 >> "$OUT/samewise.txt"
    "$VENV/bin/python" bench/engine/llama_bench.py --model "$MODEL" --threads "$THREADS" --len 512 --gen 128 \
        --batches 1,8 --repeats 1 >> "$OUT/llama.jsonl"
done

LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
{
    python3 bench/engine/table.py "$OUT/samewise.txt" "$OUT/llama.jsonl" "$THREADS"
    # other work on the machine skews both sides (llama.cpp's spinning thread pool most)
    echo
    echo "load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER on $(nproc) cores"
} | tee "$OUT/table.md"
