#!/usr/bin/env bash
# The upstream chaos harness (issue 14, item 3): the chaos test of tests/it/chaos.rs
# (`chaos_burst_no_hang_no_leak_every_attempt_recorded`), run for minutes instead of CI's
# 10-second burst, once per seed. Each run: `samewise serve` in front of three mock providers
# answering from seeded fault streams (resets, stalls, slow-loris bodies, 5xx/429 storms,
# garbage) and the real engine under the `flaky` profile; open-loop JSON and streaming chat.
# The test asserts its properties (no request past its timeouts, no descriptor, thread or
# memory growth between the two halves, attempt records = attempts the upstreams received, one
# final record per request, none dropped) and prints a `chaos summary:` JSON line, kept here.
# Not a test: it prints numbers.
#
#   bench/proxy/chaos.sh                         # 180 s at 16 rps, seeds 1 2 3 (about 10 min)
#   SECS=60 RATE=30 SEEDS="7" bench/proxy/chaos.sh
#
# Debug builds (what CI builds): the properties are about hangs, leaks and accounting, not
# speed. Needs the test model (scripts/fetch-model.sh). Results: bench/out/chaos-TIMESTAMP/.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${SECS:-180}
RATE=${RATE:-16}
SEEDS=${SEEDS:-"1 2 3"}
OUT=${OUT:-bench/out/chaos-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
cargo nextest run -p samewise --test it --no-run >"$OUT/build.log" 2>&1
for seed in $SEEDS; do
    echo "== seed $seed: ${SECS}s at ${RATE} rps (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    status=0
    CHAOS_SECS=$SECS CHAOS_RATE=$RATE CHAOS_SEED=$seed \
        cargo nextest run -p samewise --test it --no-capture --no-fail-fast \
        'chaos::chaos_burst_no_hang_no_leak_every_attempt_recorded' >"$OUT/seed-$seed.log" 2>&1 || status=$?
    line=$(sed -n 's/^chaos summary: //p' "$OUT/seed-$seed.log" | tail -1)
    echo "{\"seed\": $seed, \"exit\": $status, \"summary\": ${line:-null}}" | tee -a "$OUT/results.jsonl"
done
echo "Machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at the end." | tee "$OUT/machine.txt"
echo "results in $OUT" >&2
