#!/usr/bin/env bash
# The proxy benchmark: added latency of `samewise serve` over going straight to the upstream,
# and the proxy's memory with many streams open. Not a test: it prints numbers.
#
#   bench/proxy/run.sh            # the full run: 30 s per point (about 4 minutes)
#   DURATION=5 RATES="500" bench/proxy/run.sh   # a quick look
#   TOKIO_WORKER_THREADS=1 ...   # (read by every tokio runtime here) fewer workers per process
#
# What it does, all on this machine over loopback, release builds:
#  1. starts two mock upstreams (samewise-testkit's `mock-upstream`): one that answers at once
#     (JSON or SSE), one that holds every stream open;
#  2. starts `samewise serve` with both as providers, SQLite records in a scratch data dir;
#  3. for non-streaming and streaming chat at each rate in RATES (default 500 1000 2000 rps)
#     for DURATION seconds, `loadgen rate` fires, every 1/rate s, one request straight to the
#     mock and one through the proxy at the same moment (open loop), and reports latency
#     quantiles of both and the added latency (through - direct);
#     Each point runs on a freshly started proxy.
#  4. restarts the proxy and has `loadgen hold` open STREAMS (default 1000) streams through it,
#     then samples the proxy's resident memory (VmRSS, and VmHWM = peak) from /proc.
# Results land in bench/out/proxy-TIMESTAMP/ (results.jsonl, hold.json, table.md, logs).
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-30}
WARMUP=${WARMUP:-3}
RATES=${RATES:-"500 1000 2000"}
STREAMS=${STREAMS:-1000}
OUT=${OUT:-bench/out/proxy-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/data"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

. bench/proxy/common.sh

$BIN/mock-upstream --name bench --model bench-model >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
$BIN/mock-upstream --name hold --model hold-model --never-ends >"$OUT/mock-hold.log" 2>&1 &
PIDS+=($!)
MOCK=$(wait_url "$OUT/mock.log")
HOLD=$(wait_url "$OUT/mock-hold.log")

PORT=$(free_port)
CONFIG="$OUT/samewise.toml"
bench_config "$CONFIG" "$PORT" "$OUT/data" "$MOCK"
bench_model hold "$HOLD" >>"$CONFIG"
KEY=$(create_key "$CONFIG" "$OUT/keys.log")
start_proxy() { start_gateway "$CONFIG" "$PORT" "$OUT/proxy.log"; PROXY_PID=$GW_PID; }

start_proxy
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$OUT/results.jsonl"
for mode in json stream; do
    flag=""; [ "$mode" = stream ] && flag="--stream"
    for rate in $RATES; do
        # each point on a fresh proxy: an overloaded point must not leave open breakers or a
        # backlog to the next one
        kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true
        start_proxy
        sleep 1
        echo "== $mode at $rate rps for ${DURATION}s (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        $BIN/loadgen rate --direct "$MOCK/v1" --proxy "http://127.0.0.1:$PORT/v1" --key "$KEY" \
            --model bench --direct-model bench-model --rate "$rate" --duration "$DURATION" \
            --warmup "$WARMUP" $flag | tee -a "$OUT/results.jsonl"
    done
done
curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-after-rate.txt" || true
grep -E '^samewise_(record_queue_dropped_total|records_written_total|record_write_errors_total)' \
    "$OUT/metrics-after-rate.txt" | tee "$OUT/records.txt" >&2 || true
echo "proxy peak RSS during the last rate run: $(rss_kb "$PROXY_PID" VmHWM) kB" >&2

# memory with STREAMS open streams, on a fresh proxy
kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true
start_proxy
sleep 1
RSS_BEFORE=$(rss_kb "$PROXY_PID" VmRSS)
$BIN/loadgen hold --proxy "http://127.0.0.1:$PORT/v1" --key "$KEY" --model hold --streams "$STREAMS" \
    --hold 5 >"$OUT/hold.log" 2>&1 &
HOLD_PID=$!
for _ in $(seq 1 600); do grep -q '^ready' "$OUT/hold.log" && break; sleep 0.1; done
sleep 2
RSS_OPEN=$(rss_kb "$PROXY_PID" VmRSS)
HWM=$(rss_kb "$PROXY_PID" VmHWM)
READY=$(sed -n 's/^ready \([0-9]*\).*/\1/p' "$OUT/hold.log")
wait "$HOLD_PID" || echo "loadgen hold reported failures (see $OUT/hold.log)" >&2
printf '{"streams": %s, "ready": %s, "rss_before_kb": %s, "rss_open_kb": %s, "hwm_kb": %s}\n' \
    "$STREAMS" "${READY:-0}" "$RSS_BEFORE" "$RSS_OPEN" "$HWM" | tee "$OUT/hold.json"

{
    python3 bench/proxy/report.py "$OUT/results.jsonl" "$OUT/hold.json"
    echo
    echo "Request records of the last rate point (from /metrics):"
    sed 's/^/    /' "$OUT/records.txt"
    echo
    echo "Load average before the rate runs: $LOAD_BEFORE; after everything: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); load generator, mock and proxy on the same machine."
} | tee "$OUT/table.md"
echo "results in $OUT" >&2
