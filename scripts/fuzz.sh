#!/usr/bin/env bash
# Runs every cargo-fuzz target for MINUTES minutes each (default 10) with nightly Rust and
# cargo-fuzz (`cargo install cargo-fuzz`), starting from the committed corpus
# (fuzz/corpus/TARGET: seeds from real inputs — engine streams, the tests' request bodies, the
# example configs and profiles, the engine's chat-template cases, GGUF and safetensors files cut
# from the test model by fuzz/seeds/make.py — grown by earlier runs), then minimises
# each corpus back into place and prints, per target, the runs, the coverage libFuzzer reports
# (`cov`: edges, `ft`: features) and the crashes (kept in fuzz/artifacts/TARGET, which the
# replay test `tests/it/fuzz_corpus.rs` runs in CI). Not a test: it prints numbers.
#
#   scripts/fuzz.sh               # 10 minutes per target
#   MINUTES=2 scripts/fuzz.sh sse_decoder
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
MINUTES=${MINUTES:-10}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(sse_decoder tool_calls request_body gguf safetensors chat_template config profile json_schema)
OUT=${OUT:-../bench/out/fuzz-$(date -u +%Y%m%dT%H%M%SZ)}
# What the runs need, checked first: a machine without them gets the command that installs them.
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs nightly Rust (cargo-fuzz builds with -Z sanitizer): rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs cargo-fuzz (from crates.io): cargo install cargo-fuzz --locked" >&2
    exit 2
fi
mkdir -p "$OUT"
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    echo "== $t: $MINUTES min" >&2
    status=0
    # -a: debug assertions and overflow checks on, so an overflow is a crash, not a wrap
    nice -n "${NICE:-10}" cargo +nightly fuzz run -a "$t" "corpus/$t" -- -max_total_time=$((MINUTES * 60)) \
        -print_final_stats=1 -max_len=65536 >"$OUT/$t.log" 2>&1 || status=$?
    last=$(grep -E '^#[0-9]+' "$OUT/$t.log" | grep -E 'cov:' | tail -1 || true)
    if [ -z "$last" ]; then
        # no libFuzzer status line: the build or the start failed; say why, go on to the next
        echo "$t: exit $status, no fuzzing ran; the end of $OUT/$t.log:" | tee -a "$OUT/summary.txt" >&2
        tail -n 5 "$OUT/$t.log" >&2
        continue
    fi
    nice -n "${NICE:-10}" cargo +nightly fuzz cmin -a "$t" "corpus/$t" >"$OUT/$t.cmin.log" 2>&1 || true
    crashes=$(find "artifacts/$t" -type f | wc -l)
    echo "$t: exit $status; $last; corpus $(find "corpus/$t" -type f | wc -l) files; crash files $crashes" | tee -a "$OUT/summary.txt"
done
echo "logs in $OUT" >&2
