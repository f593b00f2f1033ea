#!/usr/bin/env bash
# The hung-provider harness (issue 14): two endpoints of one model, one of which accepts
# connections and never answers; open-loop load through a release-built `samewise serve` with
# the default settings. Reports the share of requests sent after the first SKIP seconds that
# were answered within 2 s, and latency quantiles, without hedging and with it. Not a test: it
# prints numbers.
#
#   bench/proxy/hung.sh                           # 20 rps for 90 s, each way (about 3.5 minutes)
#   RATE=20 DURATION=20 bench/proxy/hung.sh       # a quick look
#   HEDGE_AFTER_MS=300 bench/proxy/hung.sh        # the hedged run's delay (default 500)
#
# Both runs start a fresh gateway (no breaker state carried over); the only settings besides
# the two providers are, in the second run, `hedge_after_ms` on the model. Results land in
# bench/out/hung-TIMESTAMP/ (no-hedge.json, hedge.json, table.md, logs).
set -euo pipefail
cd "$(dirname "$0")/../.."

RATE=${RATE:-20}
DURATION=${DURATION:-90}
SKIP=${SKIP:-5}
HEDGE_AFTER_MS=${HEDGE_AFTER_MS:-500}
OUT=${OUT:-bench/out/hung-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
. bench/proxy/common.sh

$BIN/mock-upstream --name healthy --model m >"$OUT/mock-healthy.log" 2>&1 &
PIDS+=($!)
$BIN/mock-upstream --name hung --model m --hang >"$OUT/mock-hung.log" 2>&1 &
PIDS+=($!)
HEALTHY=$(wait_url "$OUT/mock-healthy.log")
HUNG=$(wait_url "$OUT/mock-hung.log")

# one run: $1 = label, $2 = extra lines in the model's table
run() {
    local label=$1 extra=$2 port config data pid
    port=$(free_port)
    data="$OUT/data-$label"
    config="$OUT/samewise-$label.toml"
    mkdir -p "$data"
    cat >"$config" <<TOML
[server]
listen = "127.0.0.1:$port"
data_dir = "$data"

[providers.healthy]
base_url = "$HEALTHY/v1"

[providers.hung]
base_url = "$HUNG/v1"

[models.m]
policy = "weighted"
$extra
[[models.m.endpoints]]
provider = "hung"
model = "m"
[[models.m.endpoints]]
provider = "healthy"
model = "m"
TOML
    unset DATABASE_URL
    local key
    key=$($BIN/samewise keys create bench --config "$config" 2>>"$OUT/keys.log" | grep -Eo 'sw-[0-9a-f]+' | head -1)
    if [ -z "$key" ]; then echo "could not create a key (see $OUT/keys.log)" >&2; exit 1; fi
    RUST_LOG=${RUST_LOG:-warn} $BIN/samewise serve --config "$config" >>"$OUT/proxy-$label.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 100); do
        if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break; fi
        sleep 0.1
    done
    echo "== $label: $RATE rps for ${DURATION}s, one of two endpoints hung" >&2
    $BIN/loadgen slo --proxy "http://127.0.0.1:$port/v1" --key "$key" --model m \
        --rate "$RATE" --duration "$DURATION" --skip "$SKIP" --within-ms 2000 | tee "$OUT/$label.json"
    curl -fsS "http://127.0.0.1:$port/metrics" >"$OUT/metrics-$label.txt" || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

run no-hedge ""
run hedge "hedge_after_ms = $HEDGE_AFTER_MS"

python3 - "$OUT" "$SKIP" "$HEDGE_AFTER_MS" <<'PY' | tee "$OUT/table.md"
import json, sys
out, skip, hedge = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"| run | sent | after {skip} s: answered within 2 s | p50 / p99 after {skip} s (ms) | all p50 / p99 / max (ms) | errors |")
print("|---|---|---|---|---|---|")
for label, name in [("no-hedge", "defaults"), ("hedge", f"defaults + hedge_after_ms = {hedge}")]:
    r = json.load(open(f"{out}/{label}.json"))
    a, al = r["after_skip"], r["all_ms"]
    f = lambda x: "n/a" if x is None else f"{x:.1f}"
    errs = ", ".join(f"{k} x{v}" for k, v in r["errors"].items()) or "0"
    print(f"| {name} | {r['sent']} | {a['answered_within']} / {a['sent']} ({100 * a['share_within']:.2f}%) "
          f"| {f(a['p50_ms'])} / {f(a['p99_ms'])} | {f(al['p50'])} / {f(al['p99'])} / {f(al['max'])} | {errs} |")
PY
echo "results in $OUT" >&2
