#!/usr/bin/env bash
# The eval verdict-power benchmark (issue #10): how often a `tool_calls`-style job judges an
# endpoint "degraded" / "equivalent" / "inconclusive", per serving profile and job size, at
# what cost (items, tokens, wall time). Not a test: it prints numbers.
#
#   bench/evals/run.sh                                   # 400 BFCL items, 2,000 jobs per row
#   PER_CATEGORY=25 JOBS=500 VERIFY=1 bench/evals/run.sh # a quick look
#
# 1. BFCL's own items (scripts/bfcl-suite.py: the `bfcl-eval` package from PyPI, PER_CATEGORY
#    each of simple, multiple, parallel and irrelevance) as a customer suite.
# 2. Real engine endpoints on the test model (`samewise engine serve`): the reference, `a8`,
#    `tool-corrupt` (every call corrupted) and a `tool-corrupt` profile at FRACTION.
# 3. The cache: every item through the real worker (`samewise evals run --suite-file`, one
#    look and no budget, so nothing stops early): a8 vs the reference and tool-corrupt vs the
#    reference (the reference answering twice, which must agree), exported per item.
# 4. `verdict_power power` (evals/examples/verdict_power.rs) resamples JOBS jobs per suspect
#    and size from the cache and runs the worker's own sequential rule on each.
# 5. The re-run: VERIFY drawn jobs per suspect (VERIFY_SIZE items, in their drawn order) go
#    through the real worker with the default rule (LOOKS looks); `verdict_power check`
#    requires every answer to match the cache byte for byte (the corrupted calls aside) and
#    the worker's verdict, looks, items and paired table to equal the resampler's.
#
# Settings (environment): CACHE (a previous run's directory: reuse its suite and cache, skip
# step 3), ONLY_CACHE (1: stop after step 3), PER_CATEGORY (100), SIZES (50,100,200,400), FRACTIONS (0.1,0.05;
# FRACTION, the re-run's, is the first), JOBS (2000), VERIFY (2), VERIFY_SIZE (200), DELTA
# (0.05), ALPHA (0.01), LOOKS (4), BUDGET (200000), CONCURRENCY (4), SEED (1).
# The model: SAMEWISE_MODEL or ~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf.
# Results land in bench/out/evals-TIMESTAMP/ (power.json, power.md, verify/, log).
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-bench/out/evals-$(date -u +%Y%m%dT%H%M%SZ)}
PER_CATEGORY=${PER_CATEGORY:-100}
SIZES=${SIZES:-50,100,200,400}
FRACTIONS=${FRACTIONS:-0.1,0.05}
FRACTION=${FRACTIONS%%,*}
JOBS=${JOBS:-2000}
VERIFY=${VERIFY:-2}
VERIFY_SIZE=${VERIFY_SIZE:-200}
DELTA=${DELTA:-0.05}
ALPHA=${ALPHA:-0.01}
LOOKS=${LOOKS:-4}
BUDGET=${BUDGET:-200000}
CONCURRENCY=${CONCURRENCY:-4}
SEED=${SEED:-1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
unset DATABASE_URL # SQLite in the run's data directory

cargo build --release -p samewise --bin samewise -p samewise-evals --example verdict_power
# copies: the shared target directory may be rebuilt while this runs
mkdir -p "$OUT/bin"
cp target/release/samewise target/release/examples/verdict_power "$OUT/bin/"
BIN=$OUT/bin/samewise
POWER=$OUT/bin/verdict_power

if [ -n "${CACHE:-}" ]; then
    cp "$CACHE"/bfcl.jsonl "$CACHE"/cache-*.json "$CACHE"/cache-*.export.jsonl "$OUT/"
else
    python3 scripts/bfcl-suite.py --out "$OUT/bfcl.jsonl" --per-category "$PER_CATEGORY"
fi

source bench/evals/engines.sh

cat >"$OUT/corrupt-fraction.toml" <<EOF
name = "tool-corrupt-$FRACTION"
seed = $SEED
[tool_calls]
corrupt_fraction = $FRACTION
EOF
engine ref reference
engine a8 a8
engine corrupt tool-corrupt
engine fraction "$OUT/corrupt-fraction.toml"

# config NAME LOOKS BUDGET: a gateway config with the four engines and [evals], its own
# SQLite database (a CLI run's worker claims any job of its store)
config() {
    {
        printf '[server]\nlisten = "127.0.0.1:0"\ndata_dir = "%s"\n\n' "$OUT/data-$1"
        for e in ref a8 corrupt fraction; do
            local url="URL_$e"
            printf '[providers.%s]\nbase_url = "%s/v1"\nprice_input_per_mtok = 0.0\nprice_output_per_mtok = 0.0\n\n' "$e" "${!url}"
        done
        printf '[models.smol]\npolicy = "weighted"\n'
        for e in ref a8 corrupt fraction; do
            printf '[[models.smol.endpoints]]\nprovider = "%s"\nmodel = "smol"\n' "$e"
        done
        printf '\n[evals]\nreference_url = "%s"\nreference_model = "smol"\n' "$URL_ref"
        printf 'looks = %s\nbudget_tokens = %s\nconcurrency = %s\ndelta = %s\nalpha = %s\n' \
            "$2" "$3" "$CONCURRENCY" "$DELTA" "$ALPHA"
    } >"$OUT/$1.toml"
}
config cache-a8 1 1000000000000
config cache-corrupt 1 1000000000000
config rule "$LOOKS" "$BUDGET"

# run CONFIG SUITE ENDPOINT NAME: one job through the real worker; NAME.json (the job) and
# NAME.export.jsonl (its per-item records)
run() {
    "$BIN" evals --config "$OUT/$1.toml" --json run --suite-file "$2" --endpoint "$3" \
        >"$OUT/$4.json" 2>>"$OUT/log"
    local job
    job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$OUT/$4.json")
    "$BIN" evals --config "$OUT/$1.toml" show "$job" --export "$OUT/$4.export.jsonl" >/dev/null
}

START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
if [ -z "${CACHE:-}" ]; then
    run cache-a8 "$OUT/bfcl.jsonl" a8/smol cache-a8 &
    A=$!
    run cache-corrupt "$OUT/bfcl.jsonl" corrupt/smol cache-corrupt &
    C=$!
    wait $A
    wait $C
fi
CACHE_WALL=$(($(date +%s) - START))
if [ "${ONLY_CACHE:-0}" = 1 ]; then
    echo "cache in $OUT (${CACHE_WALL} s); CACHE=$OUT reuses it" >&2
    exit 0
fi

"$POWER" power --a8 "$OUT/cache-a8.export.jsonl" --corrupt "$OUT/cache-corrupt.export.jsonl" \
    --suite "$OUT/bfcl.jsonl" --out "$OUT" --runs "$OUT/cache-a8.json,$OUT/cache-corrupt.json" \
    --sizes "$SIZES" --fractions "$FRACTIONS" --jobs "$JOBS" --verify "$VERIFY" \
    --verify-size "$VERIFY_SIZE" --verify-fraction "$FRACTION" --seed "$SEED" --delta "$DELTA" --alpha "$ALPHA" \
    --looks "$LOOKS" --budget "$BUDGET" | tee "$OUT/table.md"

: >"$OUT/verify.jsonl"
for plan in "$OUT"/verify/*.plan.json; do
    name=$(basename "$plan" .plan.json)
    case $name in
        a8-*) endpoint=a8/smol ;;
        *) endpoint=fraction/smol ;;
    esac
    run rule "$OUT/verify/$name.jsonl" "$endpoint" "verify/$name"
    "$POWER" check --plan "$plan" --job "$OUT/verify/$name.json" \
        --export "$OUT/verify/$name.export.jsonl" --a8 "$OUT/cache-a8.export.jsonl" \
        --corrupt "$OUT/cache-corrupt.export.jsonl" >>"$OUT/verify.jsonl" || {
        echo "re-run $name differs from the cache (see $OUT/verify.jsonl)" >&2
        exit 1
    }
done
{
    echo
    echo "Re-runs through the real worker (verify.jsonl): $(wc -l <"$OUT/verify.jsonl") jobs, all equal to the resampler's."
    echo "Cache runs: ${CACHE_WALL} s wall; total $(($(date +%s) - START)) s; load before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/^Mem:/ {print $2}') GiB."
} | tee -a "$OUT/table.md"
echo "results in $OUT" >&2
