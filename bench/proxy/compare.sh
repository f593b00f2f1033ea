#!/usr/bin/env bash
# The proxy's cost and capacity, with LiteLLM's proxy beside it (issue 15, items 2, 3, 5). Every
# point fires `loadgen rate` (one request straight to the mock and one through the proxy per
# tick, open loop; WARMUP + DURATION seconds) and reads, from /proc, the user + system CPU of
# the proxy's process (and its children) before and after: CPU µs per proxied request, beside
# the paired added latency. Not a test: it prints numbers.
#
#  1. CPU points (POINTS, each "target:mode:rate", REPEATS times in turn): `samewise serve`
#     (release, SQLite records, inspection and metrics on, a fresh gateway per point; target
#     `samewise-1w`: the same with TOKIO_WORKER_THREADS=1, one runtime worker) and LiteLLM's
#     proxy (bench/proxy/litellm.sh; one process for the whole run, its RSS after each point).
#     The mock streams 16 text pieces: 20 SSE events per stream. The mock's own CPU per
#     request it served (direct and proxied alike) is kept too: a floor for any proxy, which
#     does the mock's socket work twice. Targets `relay`, `relay-http` and `relay-axum` are the
#     floors measured: `tcp-relay` in the proxy's place, a byte relay on the gateway's runtime (no
#     HTTP, no records), with `--http` a pass-through on the gateway's HTTP stack (hyper's server
#     and pooled client; no routing, no body inspection, no records), and with `--axum` that
#     pass-through as an axum handler under `axum::serve`, the gateway's framework. Target
#     `samewise-base` (with BASE=DIR, a `samewise` built at an earlier commit, e.g. the one
#     issue 15 was filed against): that gateway on the same points, its own data directory and
#     key, and the per-key stream bound left out of its config (builds before the bound refuse
#     the key; later ones default to 256 open streams, which these rates never reach), so a
#     change can be read as a ratio on any host. Any target with `+slice` (`samewise+slice`,
#     `relay-axum+slice`): that target with a short scheduler slice asked for its threads
#     (SLICE_US, default 100; bench/proxy/slice.py, Linux 6.12 or later).
#  2. Capacity (CAP_RATES, per target of CAP_TARGETS and mode, CAP_REPEATS times): the rate
#     steps up on a fresh gateway per step until a step fails: paired added p99 > CAP_P99_MS (default 2), an error, or a
#     dropped record (/metrics `samewise_record_queue_dropped_total`). The highest passing
#     step is the capacity.
#
#   bench/proxy/compare.sh              # both phases (30 minutes on a busy machine, more when
#                                       # the capacity search climbs further)
#   PHASES=cpu POINTS="samewise:json:1000" REPEATS=1 bench/proxy/compare.sh
#   LITELLM=0 bench/proxy/compare.sh                        # samewise only
#   TRACE=1 ...   # also every tick's latencies: OUT/trace-TARGET-MODE-RATE-REPEAT.tsv (bench/proxy/tail.py reads them)
# Results: bench/out/compare-TIMESTAMP/ (cpu.jsonl, capacity.jsonl, table.md, logs).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-3}
REPEATS=${REPEATS:-3}
PHASES=${PHASES:-"cpu capacity"}
POINTS=${POINTS:-"samewise:json:25 samewise:stream:25 samewise:json:1000 samewise:stream:1000 \
samewise:json:4000 samewise:stream:4000 relay:json:1000 relay:stream:1000 relay:json:4000 \
relay:stream:4000 relay-http:json:1000 relay-http:stream:1000 relay-http:json:4000 \
relay-http:stream:4000 relay-axum:json:1000 relay-axum:stream:1000 relay-axum:json:4000 \
relay-axum:stream:4000 samewise-1w:json:1000 samewise-1w:stream:1000 \
samewise-1w:json:4000 samewise-1w:stream:4000 litellm:json:25 litellm:stream:25 litellm:json:50 \
litellm:stream:50"}
CAP_RATES=${CAP_RATES:-"2000 4000 6000 8000 10000 12000 14000 16000"}
CAP_P99_MS=${CAP_P99_MS:-2}
CAP_TARGETS=${CAP_TARGETS:-"samewise samewise-1w relay relay-http"}
CAP_REPEATS=${CAP_REPEATS:-$REPEATS}
LITELLM=${LITELLM:-1}
OUT=${OUT:-bench/out/compare-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/data"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
. bench/proxy/common.sh
. bench/proxy/litellm.sh

$BIN/mock-upstream --name bench --model bench-model --pieces 16 >"$OUT/mock.log" 2>&1 &
MOCK_PID=$!
PIDS+=("$MOCK_PID")
MOCK=$(wait_url "$OUT/mock.log")
PORT=$(free_port)
bench_config "$OUT/samewise.toml" "$PORT" "$OUT/data" "$MOCK"
KEY=$(create_key "$OUT/samewise.toml" "$OUT/keys.log")
if [ -n "${BASE:-}" ]; then
    bench_config "$OUT/base.toml" "$PORT" "$OUT/data-base" "$MOCK" old
    BASE_KEY=$(create_key "$OUT/base.toml" "$OUT/keys.log" "$BASE/samewise")
fi
LL_PORT=$(free_port)
if [ "$LITELLM" = 1 ] && [[ "$PHASES" == *cpu* ]]; then
    LL_VERSION=$(litellm_setup)
    start_litellm "$MOCK" "$LL_PORT" "$OUT"
fi
CLK_TCK=$(getconf CLK_TCK)

# point TARGET MODE RATE REPEAT: one loadgen run; prints one JSON line
point() {
    local pid url key flag t0 t1 m0 m1 dropped=null written=null rss name=$1 slice=
    # TARGET+slice: TARGET with a short scheduler slice asked for its threads (bench/proxy/slice.py)
    if [[ "$1" == *+slice ]]; then slice=${SLICE_US:-100}; set -- "${1%+slice}" "${@:2}"; fi
    flag=""; [ "$2" = stream ] && flag="--stream"
    if [[ "$1" == relay* ]]; then
        local http=
        case "$1" in relay-http) http=--http ;; relay-axum) http=--axum ;; esac
        $BIN/tcp-relay --to "${MOCK#http://}" $http >"$OUT/relay.log" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        url="$(wait_url "$OUT/relay.log")/v1" key=none
    elif [ "$1" = samewise-base ]; then
        GW_ENV=
        start_gateway "$OUT/base.toml" "$PORT" "$OUT/proxy-base.log" "$BASE/samewise"
        sleep 1
        pid=$GW_PID url="http://127.0.0.1:$PORT/v1" key=$BASE_KEY
    elif [ "$1" != litellm ]; then
        GW_ENV=; [ "$1" = samewise-1w ] && GW_ENV=TOKIO_WORKER_THREADS=1
        start_gateway "$OUT/samewise.toml" "$PORT" "$OUT/proxy.log"
        sleep 1
        pid=$GW_PID url="http://127.0.0.1:$PORT/v1" key=$KEY
    else
        pid=$LL_PID url="http://127.0.0.1:$LL_PORT/v1" key=$LITELLM_MASTER_KEY
    fi
    if [ -n "$slice" ]; then python3 bench/proxy/slice.py "$pid" "$slice" >>"$OUT/slice.log"; fi
    echo "== $name $2 at $3 rps, repeat $4 (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    local load
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(cpu_ticks "$pid") m0=$(cpu_ticks "$MOCK_PID")
    $BIN/loadgen rate --direct "$MOCK/v1" --proxy "$url" --key "$key" --model bench \
        --direct-model bench-model --rate "$3" --duration "$DURATION" --warmup "$WARMUP" $flag \
        ${TRACE:+--trace "$OUT/trace-$name-$2-$3-$4.tsv"} >"$OUT/point.json" 2>>"$OUT/loadgen.log" || echo '{}' >"$OUT/point.json"
    sleep 2 # the record writer's last batch (written at most flush_interval, 1 s, after its first record)
    t1=$(cpu_ticks "$pid") m1=$(cpu_ticks "$MOCK_PID")
    rss=$(rss_kb "$pid")
    if [[ "$1" == relay* ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    elif [ "$1" != litellm ]; then
        curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt" || : >"$OUT/metrics.txt"
        dropped=$(awk '$1 == "samewise_record_queue_dropped_total" {print $2}' "$OUT/metrics.txt")
        written=$(awk '$1 == "samewise_records_written_total" {print $2}' "$OUT/metrics.txt")
        stop_gateway
    fi
    python3 - "$OUT/point.json" "$name" "$3" "$4" "$((t1 - t0))" "$CLK_TCK" "$WARMUP" "$DURATION" \
        "$rss" "${dropped:-null}" "${written:-null}" "$load" "$((m1 - m0))" <<'PY'
import json, sys
f, target, rate, rep, ticks, hz, warm, dur, rss, dropped, written, load, mock = sys.argv[1:]
r = json.load(open(f))
sent = round(float(warm) * float(rate)) + round(float(dur) * float(rate))
cpu_us = int(ticks) * 1e6 / int(hz)
print(json.dumps({"target": target, "repeat": int(rep), **r, "rate_rps": float(rate),
    "proxied": sent, "cpu_s": cpu_us / 1e6, "cpu_us_per_req": cpu_us / sent, "rss_kb": int(rss),
    "dropped": json.loads(dropped), "written": json.loads(written), "load1": float(load),
    "mock_cpu_us_per_req": int(mock) * 1e6 / int(hz) / (2 * sent)}))
PY
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
if [[ "$PHASES" == *cpu* ]]; then
    for rep in $(seq 1 "$REPEATS"); do
        for p in $POINTS; do
            IFS=: read -r target mode rate <<<"$p"
            [ "$target" = litellm ] && [ "$LITELLM" != 1 ] && continue
            point "$target" "$mode" "$rate" "$rep" | tee -a "$OUT/cpu.jsonl"
        done
    done
fi
if [[ "$PHASES" == *capacity* ]]; then
    for rep in $(seq 1 "$CAP_REPEATS"); do
        for target in $CAP_TARGETS; do for mode in json stream; do
            for rate in $CAP_RATES; do
                line=$(point "$target" "$mode" "$rate" "$rep")
                echo "$line" | tee -a "$OUT/capacity.jsonl"
                python3 -c "import json,sys; r=json.loads(sys.argv[1]); p=(r.get('added_paired_ms') or {}).get('p99'); \
sys.exit(0 if p is not None and p <= $CAP_P99_MS and not r['errors'] and not r['dropped'] else 1)" "$line" || break
            done
        done; done
    done
fi
{
    python3 bench/proxy/report.py compare "$OUT" "$CAP_P99_MS"
    echo
    echo "LiteLLM ${LL_VERSION:-not run}. Load average before: $LOAD_BEFORE; after: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); load generator, mock and proxy on the same machine."
} | tee "$OUT/table.md"
echo "results in $OUT" >&2
