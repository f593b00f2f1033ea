# Sourced by the proxy harnesses (run.sh, hung.sh, soak.sh): builds the gateway and the test
# binaries (release; PROFILE=dev for a debug build, whose numbers mean nothing) and sets BIN;
# kills every pid pushed onto PIDS when the script exits; `free_port` prints a free loopback
# port; `wait_url LOG` waits for "listening on URL" in LOG and prints URL.
TARGET=${CARGO_TARGET_DIR:-target}
if [ "${PROFILE:-release}" = dev ]; then
    cargo build -p samewise -p samewise-testkit --bins
    BIN=$TARGET/debug
else
    cargo build --release -p samewise -p samewise-testkit --bins
    BIN=$TARGET/release
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
