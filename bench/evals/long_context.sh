#!/usr/bin/env bash
# The long-context half of the eval benchmark (issue #10): real `long_context` jobs through the
# real worker against truncating endpoints and `a8`, each against the reference, SEEDS jobs per
# profile (job ids 1..SEEDS in the profile's own SQLite database, so each job draws its own
# needle depths and keys). Reports per job the verdict and the effective context, and per
# profile how many jobs located the truncation exactly (effective context N for `truncate-N`)
# and within one doubling (N or 2N, below the window: an effective context equal to the window
# means nothing was found) and how many `a8` jobs were judged degraded. Not a test: it prints numbers.
#
#   bench/evals/long_context.sh                          # 3 seeds, window 4,096, multi_query
#   SEEDS=1 PROFILES=truncate-512 WINDOW=1024 bench/evals/long_context.sh   # a quick look
#
# Settings (environment): BIN (a built samewise binary; default: build one), PROFILES (truncate-512,truncate-1024,truncate-2048,a8), SEEDS (3),
# WINDOW (4096), TASKS (multi_query), DISTRACTORS (2), DELTA (0.05), ALPHA (0.01), LOOKS (1).
# The model: SAMEWISE_MODEL or ~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf.
# Results land in bench/out/evals-lc-TIMESTAMP/ (jobs.jsonl, table.md, log).
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-bench/out/evals-lc-$(date -u +%Y%m%dT%H%M%SZ)}
PROFILES=${PROFILES:-truncate-512,truncate-1024,truncate-2048,a8}
SEEDS=${SEEDS:-3}
WINDOW=${WINDOW:-4096}
TASKS=${TASKS:-multi_query}
DISTRACTORS=${DISTRACTORS:-2}
DELTA=${DELTA:-0.05}
ALPHA=${ALPHA:-0.01}
LOOKS=${LOOKS:-1}
mkdir -p "$OUT/bin"
OUT=$(cd "$OUT" && pwd)
unset DATABASE_URL

if [ -z "${BIN:-}" ]; then # BIN: a samewise binary already built
    cargo build --release -p samewise --bin samewise
    cp target/release/samewise "$OUT/bin/" # the shared target directory may be rebuilt meanwhile
    BIN=$OUT/bin/samewise
fi
source bench/evals/engines.sh

engine ref reference
PROFILE_LIST=${PROFILES//,/ }
for p in $PROFILE_LIST; do engine "${p//-/_}" "$p"; done

TASK_LIST=$(printf '"%s",' ${TASKS//,/ })
: >"$OUT/jobs.jsonl"
START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for p in $PROFILE_LIST; do
    name=${p//-/_}
    url="URL_$name"
    {
        printf '[server]\nlisten = "127.0.0.1:0"\ndata_dir = "%s"\n\n' "$OUT/data-$name"
        printf '[providers.ref]\nbase_url = "%s/v1"\nprice_input_per_mtok = 0.0\nprice_output_per_mtok = 0.0\n\n' "$URL_ref"
        printf '[providers.%s]\nbase_url = "%s/v1"\nprice_input_per_mtok = 0.0\nprice_output_per_mtok = 0.0\n\n' "$name" "${!url}"
        printf '[models.smol]\npolicy = "weighted"\n[[models.smol.endpoints]]\nprovider = "ref"\nmodel = "smol"\n'
        printf '[[models.smol.endpoints]]\nprovider = "%s"\nmodel = "smol"\n' "$name"
        printf '\n[evals]\nreference_url = "%s"\nreference_model = "smol"\nlooks = %s\n' "$URL_ref" "$LOOKS"
        printf 'budget_tokens = 1000000000\ndelta = %s\nalpha = %s\n' "$DELTA" "$ALPHA"
        printf '[evals.long_context]\nwindow = %s\ntasks = [%s]\ndistractors = %s\n' "$WINDOW" "${TASK_LIST%,}" "$DISTRACTORS"
    } >"$OUT/$name.toml"
    for seed in $(seq 1 "$SEEDS"); do
        "$BIN" evals --config "$OUT/$name.toml" --json run --suite long_context \
            --endpoint "$name/smol" >"$OUT/$name-$seed.json" 2>>"$OUT/log"
        python3 - "$OUT/$name-$seed.json" "$p" "$seed" >>"$OUT/jobs.jsonl" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))
v = job["verdict"]
x = v["extras"]
print(json.dumps({
    "profile": sys.argv[2], "job": job["id"], "verdict": v["verdict"],
    "effective_context": x.get("effective_context"),
    "ruler": x.get("ruler_effective_context"), "items": v["items"],
    "p_value": v["p_value"], "tokens": v["tokens"], "wall_ms": v["wall_ms"],
}))
EOF
    done
done
python3 - "$OUT/jobs.jsonl" "$WINDOW" <<'EOF' | tee "$OUT/table.md"
import json, sys
jobs = [json.loads(l) for l in open(sys.argv[1])]
window = int(sys.argv[2])
print("| suspect | jobs | verdicts | effective context (each job) | located | tokens (mean) | wall (mean, s) |")
print("|---|---:|---|---|---|---:|---:|")
for p in dict.fromkeys(j["profile"] for j in jobs):
    js = [j for j in jobs if j["profile"] == p]
    verdicts = {}
    for j in js:
        verdicts[j["verdict"]] = verdicts.get(j["verdict"], 0) + 1
    eff = [j["effective_context"] for j in js]
    if p.startswith("truncate-"):
        n = int(p.split("-")[1])
        # the window itself is "nothing found", even where it is 2N
        near = sum(1 for e in eff if e in (n, 2 * n) and e < window)
        located = f'exactly {sum(1 for e in eff if e == n)} of {len(js)}, within one doubling {near}'
    else:
        located = f'window ({window}) in {sum(1 for e in eff if e == window)} of {len(js)}'
    print(f'| `{p}` | {len(js)} | {", ".join(f"{k} {c}" for k, c in verdicts.items())} | {", ".join(map(str, eff))} | {located} | {sum(j["tokens"] for j in js) / len(js):,.0f} | {sum(j["wall_ms"] for j in js) / len(js) / 1000:.0f} |')
EOF
{
    echo
    echo "Window $WINDOW, tasks $TASKS, K = $DISTRACTORS, delta $DELTA, alpha $ALPHA, $LOOKS look(s); $(($(date +%s) - START)) s; load before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)."
} | tee -a "$OUT/table.md"
echo "results in $OUT" >&2
