#!/usr/bin/env bash
# The probe detection-power benchmark: detection power, false-alarm rate and probe tokens
# until detection of the faithful? (prompt_logprobs), changed? (CUSUM) and samples (MMD)
# probes, on real engine endpoints under serving profiles. Not a test: it prints numbers.
#
#   bench/probes/run.sh                                  # the full run
#   ROUNDS=200 WORLDS=20 POOL=20 SAMPLE_ROUNDS=50 bench/probes/run.sh   # a quick look
#   PROFILE=dev bench/probes/run.sh                      # check the script on a debug build
#   ONLY_B=1 bench/probes/run.sh                         # only part B (changed?), minutes
#   ONLY_C=1 POOL=60 SAMPLE_ROUNDS=2000 bench/probes/run.sh   # only part C (samples)
#   ONLY_C=1 POOLS_FROM=bench/out/probes-…/pools.json ROUND_SHAPES=8x10 bench/probes/run.sh
#
# Settings (environment; defaults in probes/examples/detection_power/main.rs): PROFILES, BUDGETS
# (500,1000,2000), ROUNDS (2000), VERIFY (3), WORLDS (200), SWITCH_AT (60), MAX_AFTER (300),
# IC_ROUNDS (2000), POOL (50), SAMPLE_PROFILES (reference,w4), SAMPLE_ROUNDS (500),
# ROUND_SHAPES (2x10,5x10,10x10,25x10: prompts × samples per prompt and side), POOLS_FROM (a
# pools.json to re-analyse), HI_PERMUTATIONS (0 = off; the last shape again), HI_ROUNDS (200),
# SEED, ONLY_B (0; 1 = score only reference,a8,w6,w5,w4 per text, no re-run check, no part A
# rounds, no part C), ONLY_C (0; 1 = part C alone).
# Part B's chart: CUSUM_K (the detector's default k) and CUSUM_CORRECTION (1; 0 = h for known
# baseline parameters) compare remedies.
# The model: SAMEWISE_MODEL or ~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf.
# Results land in bench/out/probes-TIMESTAMP/ (results.json, table.md, log).
set -euo pipefail
cd "$(dirname "$0")/../.."

export OUT=${OUT:-bench/out/probes-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"

if [ "${PROFILE:-release}" = dev ]; then
    cargo build -p samewise-probes --example detection_power
    BIN=target/debug/examples/detection_power
else
    cargo build --release -p samewise-probes --example detection_power
    BIN=target/release/examples/detection_power
fi

START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
RUST_LOG=${RUST_LOG:-warn} $BIN 2> >(tee "$OUT/log" >&2) >"$OUT/stdout"
WALL=$(( $(date +%s) - START ))
{
    echo
    echo "Wall time ${WALL} s; load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/^Mem:/ {print $2}') GiB."
} | tee -a "$OUT/table.md"
cat "$OUT/table.md"
echo "results in $OUT" >&2
