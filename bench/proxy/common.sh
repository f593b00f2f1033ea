# Sourced by the proxy harnesses (run.sh, cpu.sh, capacity.sh, hung.sh, soak.sh): builds the
# gateway and the test binaries (release; PROFILE=dist for the deployed build, Cargo.toml's LTO
# profile; PROFILE=dev for a debug build, whose numbers mean nothing) and sets BIN (BIN=DIR: binaries already built there, e.g. an earlier commit's); kills every pid pushed onto PIDS when the script exits; `free_port`
# prints a free loopback port; `wait_url LOG` waits for "listening on URL" in LOG and prints
# URL. The gateway helpers (`bench_config`, `create_key`, `start_gateway`, `stop_gateway`) run
# the one benchmark gateway shape: model `bench` on one mock provider, SQLite records, every
# feature on; `cpu_ticks` and `rss_kb` read /proc.
TARGET=${CARGO_TARGET_DIR:-target}
if [ -n "${BIN:-}" ]; then
    : # given
elif [ "${PROFILE:-release}" = dev ]; then
    cargo build -p samewise -p samewise-testkit --bins
    BIN=$TARGET/debug
else
    cargo build --profile "${PROFILE:-release}" -p samewise -p samewise-testkit --bins
    BIN=$TARGET/${PROFILE:-release}
fi

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_url() {
    for _ in $(seq 1 100); do
        url=$(sed -n 's/^listening on //p' "$1" | head -1)
        if [ -n "$url" ]; then echo "$url"; return 0; fi
        sleep 0.1
    done
    echo "no 'listening on' line in $1" >&2; return 1
}

# bench_config FILE PORT DATA_DIR MOCK_URL [old]: the gateway config: model `bench` → the mock's
# `bench-model`, SQLite records in DATA_DIR, a record queue of 100,000, no per-key stream bound
# in the way (every request is one key's); with `old`, without the bound's key, which a gateway
# built before it existed refuses (it had no bound)
bench_config() {
    local bound="max_streams_per_key = 1000000"
    [ "${5:-}" = old ] && bound=
    cat >"$1" <<TOML
[server]
listen = "127.0.0.1:$2"
data_dir = "$3"

[limits]
record_queue_capacity = 100000
$bound
TOML
    bench_model bench "$4" >>"$1"
}

# bench_model NAME URL: a provider NAME at URL (an OpenAI server's root) and a model NAME
# routed to its `NAME-model`, as a config stanza on stdout
bench_model() {
    cat <<TOML

[providers.$1]
base_url = "$2/v1"
first_byte_timeout_ms = 10000
idle_timeout_ms = 600000

[models.$1]
policy = "weighted"
[[models.$1.endpoints]]
provider = "$1"
model = "$1-model"
TOML
}

# create_key CONFIG LOG [GATEWAY]: prints a new client key (made by GATEWAY, default
# $BIN/samewise)
create_key() {
    local key
    key=$(env -u DATABASE_URL "${3:-$BIN/samewise}" keys create bench --config "$1" 2>>"$2" | grep -Eo 'sw-[0-9a-f]+' | head -1)
    if [ -z "$key" ]; then echo "could not create a key (see $2)" >&2; return 1; fi
    echo "$key"
}

# start_gateway CONFIG PORT LOG [GATEWAY]: starts `GATEWAY serve` (default $BIN/samewise; with
# GW_ENV, e.g. TOKIO_WORKER_THREADS=1, in its environment), sets GW_PID, waits for /healthz
GW_PID=
start_gateway() {
    RUST_LOG=${RUST_LOG:-warn} env -u DATABASE_URL ${GW_ENV:-} "${4:-$BIN/samewise}" serve --config "$1" >>"$3" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    wait_http "http://127.0.0.1:$2/healthz" 100 "the gateway did not come up (see $3)"
}

# wait_http URL TRIES MESSAGE: polls URL every 0.1 s until it answers 2xx; after TRIES tries,
# prints MESSAGE and fails
wait_http() {
    for _ in $(seq 1 "$2"); do
        if curl -fsS "$1" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "$3" >&2; return 1
}
stop_gateway() { kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; }

# descendants PID: PID and every process below it
descendants() {
    local c
    echo "$1"
    for c in $(pgrep -P "$1" || true); do descendants "$c"; done
}
# cpu_ticks PID: user + system CPU of PID and its descendants, in clock ticks (getconf CLK_TCK)
cpu_ticks() {
    local t=0 p v
    for p in $(descendants "$1"); do
        # fields 14 and 15: the 12th and 13th after the ")" that ends the command name
        v=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}')
        t=$((t + ${v:-0}))
    done
    echo "$t"
}
# rss_kb PID [FIELD]: VmRSS (or FIELD, e.g. VmHWM) of PID and its descendants, in kB
rss_kb() {
    local t=0 p v
    for p in $(descendants "$1"); do
        v=$(awk -v k="${2:-VmRSS}:" '$1 == k {print $2}' "/proc/$p/status" 2>/dev/null)
        t=$((t + ${v:-0}))
    done
    echo "$t"
}
