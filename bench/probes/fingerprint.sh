#!/usr/bin/env bash
# changed? without the weights, measured. Not a test: it prints numbers.
#
#   bench/probes/fingerprint.sh                 # release build (cargo build --release first)
#   PROFILE=dev bench/probes/fingerprint.sh     # a debug build
#
# Part 1: one `samewise engine serve` per serving profile (PROFILES) of the test model, each
# fingerprinted ROUNDS times (`samewise probes run --rounds`, no reference, `items_per_round`
# TEXTS); the table gives each profile's statistics, its shift from the unmodified engine in
# units of the default `fingerprint_min_sd` (1e-3), and the spread over its rounds. Then the
# same for CHAT_PROFILES behind a chat-only API (`[api] refuse_echo = true`), fingerprinted by
# greedy chat completions.
# Part 2: the loop. `samewise serve` with no reference, two unmodified engines (`ep`, `peer`),
# fingerprints every 2 s, a 10-round baseline; after 30 s `ep` is replaced at the same address
# by a `w4` engine; it prints when the "changed" alert opened (and on which run) and the
# verdict of the tool_calls eval it opened against the healthiest peer, with the time from the
# switch.
# Part 3: an endpoint that turns noisy. `samewise serve` with no reference and one engine,
# fingerprints every 2 s, a 10-round baseline; after 30 s the engine is replaced at the same
# address by a `noisy-echo` one (`[api] echo_jitter`, NOISE nats: identical requests, slightly
# different echo logprobs) for NOISY_S seconds, then by a `w4` engine with the same noise; it
# prints the runs, repeats and "changed" alerts of each phase and when the w4 switch alarmed.
# PARTS picks the parts (default "1 2 3").
# The model: SAMEWISE_MODEL or ~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf.
# Results land in bench/out/fingerprint-TIMESTAMP/ (table-echo.md, table-chat.md, loop.txt, logs). Ports 18100-18120
# and 18300-18302 on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-bench/out/fingerprint-$(date -u +%Y%m%dT%H%M%SZ)}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
BIN=target/${PROFILE:-release}/samewise
[ "${PROFILE:-release}" = dev ] && BIN=target/debug/samewise
BIN=$(realpath "$BIN")
MODEL=${SAMEWISE_MODEL:-$HOME/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf}
PROFILES=${PROFILES:-reference w8 w6 w5 w4 a8 kv-f16 kv-q8 substitute shifted-echo truncate-512}
CHAT_PROFILES=${CHAT_PROFILES:-reference w8 w6 w5 w4 a8 kv-f16 kv-q8}
ROUNDS=${ROUNDS:-3}
TEXTS=${TEXTS:-4}
PARTS=${PARTS:-1 2 3}
NOISE=${NOISE:-0.01}
NOISY_S=${NOISY_S:-90}
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT

engine() { # name port profile
    "$BIN" engine serve --model "$MODEL" --model-name smol --listen "127.0.0.1:$2" --profile "$3" \
        > "$OUT/engine-$1.log" 2>&1 &
    PIDS+=($!)
}
up() { # port...
    for port in "$@"; do
        for _ in $(seq 300); do
            curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && break
            sleep 0.5
        done
    done
}

# Part 1: fingerprints per profile (`$1`: echo | chat; `$2`...: name=profile pairs, where the
# profile is a built-in name or a file)
profiles() {
    local mode=$1 cfg=$OUT/profiles-$1.toml port=18100 ports=() names=() pair name
    shift
    printf '[server]\nlisten = "127.0.0.1:18099"\ndata_dir = "%s/profiles-%s-data"\n\n' "$OUT" "$mode" > "$cfg"
    for pair in "$@"; do
        name=${pair%%=*}
        port=$((port + 1))
        ports+=("$port")
        names+=("$name")
        engine "$mode-$name" "$port" "${pair#*=}"
        printf '[providers.%s]\nbase_url = "http://127.0.0.1:%d/v1"\n' "${name//-/_}" "$port" >> "$cfg"
    done
    printf '\n[models.smol]\npolicy = "weighted"\n' >> "$cfg"
    for name in "${names[@]}"; do
        printf '[[models.smol.endpoints]]\nprovider = "%s"\nmodel = "smol"\n' "${name//-/_}" >> "$cfg"
    done
    printf '[models.smol.probes]\nkinds = ["fingerprint"]\nitems_per_round = %d\n\n[probes]\n' "$TEXTS" >> "$cfg"
    up "${ports[@]}"
    "$BIN" probes run --config "$cfg" --rounds "$ROUNDS" > "$OUT/profiles-$mode.txt" 2> "$OUT/profiles-$mode.log"
    kill "${PIDS[@]}" 2>/dev/null || true
    PIDS=()
    python3 - "$OUT/profiles-$mode.txt" "$mode" <<'PY' | tee "$OUT/table-$mode.md"
import collections, json, re, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r'#\d+ (\S+)/smol fingerprint ok tokens=\d+ (\{.*\})$', line.strip())
    if m:
        runs[m.group(1).replace('_', '-')].append(json.loads(m.group(2)))
keys = (['own_logprob_mean', 'own_top1_logprob_mean', 'own_top1_agreement', 'own_tokens']
        if sys.argv[2] == 'echo' else
        ['own_chat_logprob_mean', 'own_chat_top1_agreement', 'own_chat_tokens'])
ref = runs['reference'][0]
print('| profile | ' + ' | '.join(keys) + ' | spread over its rounds |')
print('|---' * (len(keys) + 2) + '|')
for p, rs in runs.items():
    spread = max(abs(r[k] - rs[0][k]) for r in rs for k in keys)
    cells = []
    for k in keys:
        d = rs[0][k] - ref[k]
        cells.append(f'{rs[0][k]} ({d:+d})' if k.endswith('tokens')
                     else f'{rs[0][k]:.5f} ({d / 1e-3:+.1f} σ)')
    print(f'| {p} | ' + ' | '.join(cells) + f' | {spread:.1e} ({len(rs)} rounds) |')
PY
}

part() { [[ " $PARTS " == *" $1 "* ]]; }

if part 1; then
echo_pairs=()
for p in $PROFILES; do echo_pairs+=("$p=$p"); done
profiles echo "${echo_pairs[@]}"

# the same numerics behind a chat-only API (`[api] refuse_echo`): fingerprinted by greedy chat
chat_pairs=()
for p in $CHAT_PROFILES; do
    f=$OUT/chat-$p.toml
    printf 'name = "%s-no-echo"\n[api]\nrefuse_echo = true\n' "$p" > "$f"
    case $p in
        w[2-8]) printf '[weights]\nbits = %s\ngroup_size = 32\nsymmetric = true\n' "${p#w}" >> "$f" ;;
        a8) printf '[activations]\nbits = 8\n' >> "$f" ;;
        kv-q8) printf '[kv_cache]\ndtype = "q8"\n' >> "$f" ;;
        kv-f16) printf '[kv_cache]\ndtype = "f16"\n' >> "$f" ;;
    esac
    chat_pairs+=("$p=$f")
done
profiles chat "${chat_pairs[@]}"
fi

# Part 2
if part 2; then
cfg=$OUT/loop.toml
cat > "$cfg" <<CFG
[server]
listen = "127.0.0.1:18300"
data_dir = "$OUT/loop-data"
alert_poll_ms = 1000
[providers.ep]
base_url = "http://127.0.0.1:18301/v1"
[providers.peer]
base_url = "http://127.0.0.1:18302/v1"
[models.smol]
policy = "weighted"
on_drift = "demote"
[[models.smol.endpoints]]
provider = "ep"
model = "smol"
[[models.smol.endpoints]]
provider = "peer"
model = "smol"
[models.smol.probes]
kinds = ["fingerprint"]
interval_ms = 2000
jitter = 0.0
items_per_round = $TEXTS
[probes]
lock_retry_ms = 500
[probes.detectors]
cusum_baseline_rounds = 10
[evals]
workers = 1
max_items = 24
CFG
engine ep 18301 reference
EP=$!
engine peer 18302 reference
up 18301 18302
"$BIN" serve --config "$cfg" > "$OUT/loop-serve.log" 2>&1 &
GW=$!
PIDS+=($GW)
sleep 30
kill "$EP"
wait "$EP" 2> /dev/null || true
switch_ms=$(date +%s%3N)
engine ep-w4 18301 w4
verdict=""
for _ in $(seq 600); do
    sleep 1
    verdict=$("$BIN" evals list --config "$cfg" 2> /dev/null | grep -oE "degraded|equivalent|inconclusive" | head -1 || true)
    [ -n "$verdict" ] && break
done
done_ms=$(date +%s%3N)
{
    echo "switch to w4 at $switch_ms ms; verdict ${verdict:-none} $(( (done_ms - switch_ms) / 1000 )) s after it"
    python3 - "$OUT/loop-data/samewise.db" "$switch_ms" <<'PY'
import sqlite3, sys
db, switch = sqlite3.connect(sys.argv[1]), int(sys.argv[2])
after = db.execute("select id, finished_ms from probe_runs where endpoint = 'ep/smol' and ok and started_ms > ? order by id", (switch,)).fetchall()
for opened, summary in db.execute("select opened_ms, summary from alerts where kind = 'changed'"):
    n = sum(1 for _, f in after if f <= opened)
    print(f"changed alert {(opened - switch) / 1000:.1f} s after the switch, on working run {n} after it: {summary}")
PY
    "$BIN" alerts list --config "$cfg"
    "$BIN" evals list --config "$cfg"
    "$BIN" evals show 1 --config "$cfg" || true
} > "$OUT/loop.txt" 2>&1
cat "$OUT/loop.txt"
fi

# Part 3
if part 3; then
cfg=$OUT/noisy.toml
cat > "$cfg" <<CFG
[server]
listen = "127.0.0.1:18303"
data_dir = "$OUT/noisy-data"
[providers.ep]
base_url = "http://127.0.0.1:18304/v1"
[models.smol]
[[models.smol.endpoints]]
provider = "ep"
model = "smol"
[models.smol.probes]
kinds = ["fingerprint"]
interval_ms = 2000
jitter = 0.0
items_per_round = $TEXTS
[probes]
lock_retry_ms = 500
[probes.detectors]
cusum_baseline_rounds = 10
CFG
printf 'name = "noisy"\n[api]\necho_jitter = %s\n' "$NOISE" > "$OUT/noisy.toml.profile"
printf 'name = "w4-noisy"\n[api]\necho_jitter = %s\n[weights]\nbits = 4\ngroup_size = 32\nsymmetric = true\n' "$NOISE" > "$OUT/w4-noisy.toml.profile"
engine quiet 18304 reference
EP=$!
up 18304
"$BIN" serve --config "$cfg" > "$OUT/noisy-serve.log" 2>&1 &
PIDS+=($!)
sleep 30
kill "$EP"; wait "$EP" 2> /dev/null || true
noisy_ms=$(date +%s%3N)
engine noisy 18304 "$OUT/noisy.toml.profile"
EP=$!
sleep "$NOISY_S"
kill "$EP"; wait "$EP" 2> /dev/null || true
w4_ms=$(date +%s%3N)
engine w4-noisy 18304 "$OUT/w4-noisy.toml.profile"
sleep 30
python3 - "$OUT/noisy-data/samewise.db" "$noisy_ms" "$w4_ms" "$NOISE" <<'PY' | tee "$OUT/noisy.txt"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
noisy, w4, noise = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = db.execute("select started_ms, ok, repeat_of, stats from probe_runs order by id").fetchall()
alerts = db.execute("select opened_ms, summary from alerts where kind = 'changed' order by id").fetchall()
print(f"echo_jitter {noise} nats; phases: exact until the first switch, noisy for {(w4 - noisy) / 1000:.0f} s, then w4 with the same noise")
for name, lo, hi in [("exact", 0, noisy), ("noisy", noisy, w4), ("w4 + noise", w4, 1 << 62)]:
    rs = [r for r in runs if lo <= r[0] < hi and r[1]]
    first = [r for r in rs if r[2] is None]
    pairs = [json.loads(r[3]).get("noise_pair") or {} for r in rs if r[2] is not None]
    opened = [(t, s) for t, s in alerts if lo <= t < hi]
    dist = max((p.get("own_logprob_mean", 0) for p in pairs), default=0)
    print(f"- {name}: {len(first)} runs, {len(pairs)} repeats (largest own_logprob_mean distance {dist:.2e}), {len(opened)} changed alerts")
    for t, s in opened:
        n = sum(1 for r in first if r[0] <= t)
        print(f"  {(t - lo) / 1000:.1f} s after the phase began, on its run {n} (the summary is its latest refresh's)")
    if name == "exact" or not first:
        continue
    # per statistic: the phase's mean shift from the first run (the baseline echoed one value),
    # its run-to-run sd and its pairs' largest distance, in units of fingerprint_min_sd (1e-3)
    base = json.loads(runs[0][3])
    for k in ["own_logprob_mean", "own_top1_logprob_mean", "own_top1_agreement"]:
        v = [json.loads(r[3])[k] for r in first]
        m = sum(v) / len(v)
        sd = (sum((x - m) ** 2 for x in v) / max(len(v) - 1, 1)) ** 0.5
        far = max((p.get(k, 0) for p in pairs), default=0)
        print(f"  {k}: mean shift {(m - base[k]) / 1e-3:+.1f}, sd {sd / 1e-3:.1f}, largest pair distance {far / 1e-3:.1f}")
PY
fi
