#!/usr/bin/env bash
# The soak harness (issue 14, item 5): MINUTES minutes (default 30) of open-loop load at RATE
# requests per second (default 1000: half JSON, half streaming chat) through a release-built
# `samewise serve` in front of the benchmark's mock upstream (the same `mock-upstream` and
# `loadgen` as bench/proxy/run.sh; SQLite records in a scratch data dir). Every minute, two
# `loadgen slo` runs (JSON and streaming, RATE/2 each, 60 s) report that minute's sent,
# answered, errors and p50/p99/max; the gateway's RSS, threads and open descriptors are
# sampled from /proc before the first minute and after each one. At the end the gateway
# stops (drains and flushes its record queue) and the records are counted: served (every
# request the loadgens sent) against stored rows + dropped (/metrics). With OVERLOAD_RATE, an
# overload of 30 s and 60 s of quiet come before that end, with the gateway's memory sampled
# after each. Not a test: it prints numbers.
#
#   bench/proxy/soak.sh                          # 30 minutes at 1,000 rps
#   MINUTES=5 RATE=500 bench/proxy/soak.sh       # a shorter run (say so when quoting it)
#   OVERLOAD_RATE=6000 bench/proxy/soak.sh       # then 30 s at 6,000 rps, 60 s idle: does the
#                                                # gateway's memory come back after an overload?
#
# Results: bench/out/soak-TIMESTAMP/ (minutes.jsonl: one line per minute; summary.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
MINUTES=${MINUTES:-30}
RATE=${RATE:-1000}
OUT=${OUT:-bench/out/soak-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/data"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
. bench/proxy/common.sh
sample() { # pid -> {"rss_kb":..,"threads":..,"fds":..}
    local rss thr fds
    rss=$(awk '$1 == "VmRSS:" {print $2}' "/proc/$1/status")
    thr=$(awk '$1 == "Threads:" {print $2}' "/proc/$1/status")
    fds=$(find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    printf '{"rss_kb": %s, "threads": %s, "fds": %s}' "$rss" "$thr" "$fds"
}

$BIN/mock-upstream --name soak --model soak-model >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
MOCK=$(wait_url "$OUT/mock.log")
PORT=$(free_port)
CONFIG="$OUT/samewise.toml"
cat >"$CONFIG" <<TOML
[server]
listen = "127.0.0.1:$PORT"
data_dir = "$OUT/data"

[limits]
record_queue_capacity = 100000
# every request is one key's: the per-key stream bound (default 256) would refuse the soak's own
# streams whenever the gateway falls behind, and measure itself instead of the gateway
max_streams_per_key = 1000000

[providers.soak]
base_url = "$MOCK/v1"
first_byte_timeout_ms = 10000
idle_timeout_ms = 60000

[models.soak]
[[models.soak.endpoints]]
provider = "soak"
model = "soak-model"
TOML
unset DATABASE_URL
KEY=$($BIN/samewise keys create soak --config "$CONFIG" 2>>"$OUT/keys.log" | grep -Eo 'sw-[0-9a-f]+' | head -1)
[ -n "$KEY" ] || { echo "could not create a key (see $OUT/keys.log)" >&2; exit 1; }
RUST_LOG=${RUST_LOG:-warn} $BIN/samewise serve --config "$CONFIG" >>"$OUT/proxy.log" 2>&1 &
GW=$!
PIDS+=("$GW")
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done

# loadgens RATE SECONDS PREFIX: the JSON and the streamed half (RATE/2 each) at once, into
# PREFIX-json.json and PREFIX-stream.json
loadgens() {
    local half mode flag pid lg=()
    half=$(python3 -c "print($1 / 2)")
    for mode in json stream; do
        flag=""; [ "$mode" = stream ] && flag="--stream"
        $BIN/loadgen slo --proxy "http://127.0.0.1:$PORT/v1" --key "$KEY" --model soak \
            --rate "$half" --duration "$2" --skip 0 --within-ms 1000 $flag >"$3-$mode.json" 2>>"$OUT/loadgen.log" &
        lg+=($!)
    done
    for pid in "${lg[@]}"; do wait "$pid" || echo "loadgen $pid failed (see $OUT/loadgen.log)" >&2; done
}
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "{\"minute\": 0, \"gateway\": $(sample "$GW")}" | tee "$OUT/minutes.jsonl"
for m in $(seq 1 "$MINUTES"); do
    loadgens "$RATE" 60 "$OUT/m$m"
    python3 - "$m" "$OUT/m$m-json.json" "$OUT/m$m-stream.json" "$(sample "$GW")" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY' | tee -a "$OUT/minutes.jsonl"
import json, sys
m, jf, sf, gw, load = sys.argv[1:]
j, s = (json.load(open(f)) for f in (jf, sf))
print(json.dumps({"minute": int(m), "load1": float(load), "gateway": json.loads(gw),
    "json": {"sent": j["sent"], "answered": j["answered"], "errors": j["errors"], **j["all_ms"]},
    "stream": {"sent": s["sent"], "answered": s["answered"], "errors": s["errors"], **s["all_ms"]}}))
PY
done
if [ "${OVERLOAD_RATE:-0}" != 0 ]; then
    # an overload (OVERLOAD_RATE rps for 30 s, half JSON, half streamed), then 60 s without
    # traffic: the gateway's memory at its peak and after
    loadgens "$OVERLOAD_RATE" 30 "$OUT/overload"
    echo "{\"overload\": \"end\", \"rate\": $OVERLOAD_RATE, \"gateway\": $(sample "$GW")}" | tee -a "$OUT/minutes.jsonl"
    sleep 60
    echo "{\"overload\": \"60 s after\", \"gateway\": $(sample "$GW")}" | tee -a "$OUT/minutes.jsonl"
fi
curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt"
kill -TERM "$GW"; wait "$GW" 2>/dev/null || true
STORED=$(python3 -c "import sqlite3; print(sqlite3.connect('$OUT/data/samewise.db').execute('select count(*) from request_records').fetchone()[0])")
DROPPED=$(awk '$1 == "samewise_record_queue_dropped_total" {print $2}' "$OUT/metrics.txt")
python3 - "$OUT" "$STORED" "${DROPPED:-0}" "$LOAD_BEFORE" "$(nproc)" <<'PY' | tee "$OUT/summary.json"
import json, os, sys
out, stored, dropped, load_before, cpus = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{out}/minutes.jsonl")]
rows = [r for r in lines if "minute" in r]
over = [r for r in lines if "overload" in r]
mins = rows[1:]
served = sum(r[k]["sent"] for r in mins for k in ("json", "stream"))
overload = {}
for mode in ("json", "stream"):
    f = f"{out}/overload-{mode}.json"
    if os.path.exists(f):
        o = json.load(open(f))
        served += o["sent"]
        overload[mode] = {"sent": o["sent"], "answered": o["answered"], "errors": o["errors"], **o["all_ms"]}
p99 = [max(r["json"]["p99"] or 0, r["stream"]["p99"] or 0) for r in mins]
print(json.dumps({"minutes": len(mins), "served": served, "stored": int(stored),
    "dropped": float(dropped), "lost": served - int(stored) - int(float(dropped)),
    "errors": sum(sum(r[k]["errors"].values()) for r in mins for k in ("json", "stream")),
    "p99_ms_per_minute": p99, "gateway_start": rows[0]["gateway"], "gateway_end": rows[-1]["gateway"],
    "overload": {**overload, "gateway": [r["gateway"] for r in over]} if over else None,
    "load_before": load_before, "cpus": int(cpus)}))
PY
echo "results in $OUT" >&2
