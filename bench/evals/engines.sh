# Sourced by the eval benchmarks (run.sh, long_context.sh): `engine NAME PROFILE` starts
# `$BIN engine serve` on the test model ($MODEL: SAMEWISE_MODEL or the fetched test model) with a
# serving profile on a free loopback port, logs to $OUT/engine-NAME.log and sets URL_NAME to its
# base URL; every engine started is killed when the script exits.
MODEL=${SAMEWISE_MODEL:-$HOME/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf}
ENGINE_PIDS=()
trap 'for p in "${ENGINE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

engine() {
    local log="$OUT/engine-$1.log"
    "$BIN" engine serve --model "$MODEL" --listen 127.0.0.1:0 --model-name smol --profile "$2" \
        >"$log" 2>&1 &
    ENGINE_PIDS+=($!)
    for _ in $(seq 1 600); do
        local url
        url=$(sed -n 's/^listening on //p' "$log" | head -1)
        if [ -n "$url" ]; then
            printf -v "URL_$1" '%s' "$url"
            return 0
        fi
        sleep 0.1
    done
    echo "engine $1 did not start: $(cat "$log")" >&2
    return 1
}
