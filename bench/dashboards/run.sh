#!/usr/bin/env bash
# The dashboards' latency benchmark (dashboards/examples/dash_bench.rs): traffic loaded through
# the real record writer and rollup path, then the overview and an endpoint page timed cold
# and warm. Not a test: it prints a table.
#
#   bench/dashboards/run.sh                       # PostgreSQL, 50 endpoints, 2 days, 1 rpm each
#   ENDPOINTS=50 DAYS=30 RPM=5 bench/dashboards/run.sh   # the issue's 10.8 M records
#   BACKEND=sqlite bench/dashboards/run.sh
#   PROFILE=dev bench/dashboards/run.sh           # a dev build (dependencies still optimised)
#
# PostgreSQL: $SAMEWISE_TEST_PG_URL (default postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-bench/out/dashboards-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
if [ "${PROFILE:-release}" = dev ]; then
    # dependencies are optimised in dev builds too (the workspace's profile.dev.package."*")
    cargo build -p samewise-dashboards --example dash_bench
    BIN=${CARGO_TARGET_DIR:-target}/debug/examples/dash_bench
else
    cargo build --release -p samewise-dashboards --example dash_bench
    BIN=${CARGO_TARGET_DIR:-target}/release/examples/dash_bench
fi
START=$(date +%s)
RUST_LOG=${RUST_LOG:-warn} "$BIN" "${BACKEND:-postgres}" | tee "$OUT/table.md"
echo "Wall time $(( $(date +%s) - START )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)." | tee -a "$OUT/table.md"
