#!/usr/bin/env bash
# The store-outage harness (issue 14, item 1): a release-built `samewise serve` on a private
# PostgreSQL cluster (initdb'd here on its own port; the shared server is never touched) serves
# open-loop load from `loadgen slo` while the cluster is stopped (`pg_ctl stop -m fast`) for
# AWAY seconds and started again. Reports what the clients saw (answered, errors, latency) and
# the record accounting: served (attempt records the gateway made) = stored (rows in the
# database) + dropped (queue full, on /metrics) + write errors. Not a test: it prints numbers.
#
#   bench/store/outage.sh                               # 500 rps for 60 s, away from 15 s to 45 s
#   RATE=100 DURATION=20 START=5 AWAY=10 bench/store/outage.sh   # a quick look
#   PROFILE=dev bench/store/outage.sh                   # the debug build (not for figures)
#
# Run as root, the cluster runs as the `postgres` user (PostgreSQL refuses root). Results land
# in bench/out/outage-TIMESTAMP/ (load.json, metrics-*.txt, table.md, logs).
set -euo pipefail
cd "$(dirname "$0")/../.."

RATE=${RATE:-500}
DURATION=${DURATION:-60}
START=${START:-15}
AWAY=${AWAY:-30}
OUT=${OUT:-bench/out/outage-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TARGET=${CARGO_TARGET_DIR:-target}

if [ "${PROFILE:-release}" = dev ]; then
    cargo build -p samewise -p samewise-testkit --bins
    BIN=$TARGET/debug
else
    cargo build --release -p samewise -p samewise-testkit --bins
    BIN=$TARGET/release
fi

PGBIN=${SAMEWISE_TEST_PG_BIN:-$(pg_config --bindir)}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port)
PGDIR=$(mktemp -d /tmp/samewise-outage-pg.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres: "$PGDIR"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$PGDIR"
}
trap cleanup EXIT

as_pg "$PGBIN/initdb" -D "$PGDIR/data" -U postgres -A trust -E UTF8 --no-sync >"$OUT/initdb.log"
cat >>"$PGDIR/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$PGDIR'
CONF
pg_start() { as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" start -w >/dev/null; }
pg_stop() { as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" stop -m fast -w >/dev/null; }
pg_start
psql_q() { psql -h 127.0.0.1 -p "$PGPORT" -U postgres -d outage -Atc "$1"; }
psql -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -qc "CREATE DATABASE outage"
export DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT/outage"

wait_url() {
    for _ in $(seq 1 100); do
        url=$(sed -n 's/^listening on //p' "$1" | head -1)
        if [ -n "$url" ]; then echo "$url"; return 0; fi
        sleep 0.1
    done
    echo "no 'listening on' line in $1" >&2; return 1
}
$BIN/mock-upstream --name up --model m >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
UP=$(wait_url "$OUT/mock.log")

PORT=$(free_port)
mkdir -p "$OUT/data"
cat >"$OUT/samewise.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
data_dir = "$OUT/data"

[providers.up]
base_url = "$UP/v1"

[models.m]
policy = "weighted"
[[models.m.endpoints]]
provider = "up"
model = "m"
TOML
KEY=$($BIN/samewise keys create bench --config "$OUT/samewise.toml" 2>>"$OUT/keys.log" | grep -Eo 'sw-[0-9a-f]+' | head -1)
if [ -z "$KEY" ]; then echo "could not create a key (see $OUT/keys.log)" >&2; exit 1; fi
RUST_LOG=${RUST_LOG:-warn} $BIN/samewise serve --config "$OUT/samewise.toml" >"$OUT/proxy.log" 2>&1 &
GW=$!
PIDS+=("$GW")
for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; then break; fi
    sleep 0.1
done
metric() { sed -n "s/^$1 //p" "$2" | head -1; }

echo "== $RATE rps for ${DURATION}s; PostgreSQL stopped at ${START}s for ${AWAY}s" >&2
$BIN/loadgen slo --proxy "http://127.0.0.1:$PORT/v1" --key "$KEY" --model m \
    --rate "$RATE" --duration "$DURATION" --skip 0 --within-ms 2000 >"$OUT/load.json" &
LOAD=$!
sleep "$START"
pg_stop
echo "   stopped at $(date -u +%T)" >&2
sleep $((AWAY / 2))
curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-during.txt"
sleep $((AWAY - AWAY / 2))
pg_start
echo "   started at $(date -u +%T)" >&2
wait "$LOAD"

# the writer catches up: the queue empties and every record is counted
for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-after.txt"
    depth=$(metric samewise_record_queue_depth "$OUT/metrics-after.txt")
    stalled=$(metric samewise_record_writer_stalled "$OUT/metrics-after.txt")
    [ "$depth" = 0 ] && [ "$stalled" = 0 ] && break
    sleep 0.1
done
sleep 1
curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-after.txt"
kill "$GW"; wait "$GW" 2>/dev/null || true
STORED=$(psql_q "SELECT count(*) FROM request_records")
cp "$PGDIR/server.log" "$OUT/postgres.log" 2>/dev/null || true

python3 - "$OUT" "$STORED" "$RATE" "$DURATION" "$START" "$AWAY" <<'PY' | tee "$OUT/table.md"
import json, re, sys
out, stored, rate, duration, start, away = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
load = json.load(open(f"{out}/load.json"))
def metrics(name):
    text = open(f"{out}/metrics-{name}.txt").read()
    get = lambda m: int(float(re.search(rf"^{m} (\S+)$", text, re.M).group(1)))
    served = sum(int(float(v)) for v in re.findall(r"^samewise_requests_total\{[^}]*\} (\S+)$", text, re.M))
    return dict(written=get("samewise_records_written_total"), dropped=get("samewise_record_queue_dropped_total"),
                errors=get("samewise_record_write_errors_total"), depth=get("samewise_record_queue_depth"), served=served)
during, after = metrics("during"), metrics("after")
a = load["all_ms"]
errs = ", ".join(f"{k} x{v}" for k, v in load["errors"].items()) or "0"
ok = load["answered"]
print(f"| load | PostgreSQL away | sent | answered 2xx | errors | p50 / p99 / max (ms) |")
print("|---|---|---|---|---|---|")
print(f"| {rate} rps, {duration} s | {away} s from {start} s | {load['sent']:,} | {ok:,} | {errs} "
      f"| {a['p50']:.1f} / {a['p99']:.1f} / {a['max']:.1f} |")
print()
print("| records | served | stored | dropped (queue full) | write errors | stored + dropped + errors |")
print("|---|---|---|---|---|---|")
print(f"| mid-outage (/metrics) | {during['served']:,} | {during['written']:,} | {during['dropped']:,} | {during['errors']} | queued {during['depth']:,} |")
total = stored + after["dropped"] + after["errors"]
print(f"| after | {after['served']:,} | {stored:,} (rows; /metrics written {after['written']:,}) | {after['dropped']:,} "
      f"| {after['errors']} | {total:,} ({'=' if total == after['served'] else '!='} served) |")
PY
echo "results in $OUT" >&2
