#!/usr/bin/env bash
# The GPU check of the engine's CUDA backend (issue #16), in two halves:
#
#   scripts/gpu-check.sh prepare        # here (Rust, the test model): builds and strips the
#                                       # check binary and cuts the test model to 4 layers,
#                                       # into gpu-check/ (about 40 MiB, under the 64 MiB
#                                       # that travels to the GPU machine)
#   scripts/gpu-check.sh run OUT_DIR    # there (CUDA 13, no Rust, no network)
#
# The run: `device run --carry gpu-check 'scripts/gpu-check.sh run $OUT'` (the folder is
# git-ignored, so it travels only when carried).
#
# `run` goes through stages that each append one line to OUT_DIR/results.jsonl (the stage's
# name, exit status, seconds and JSON result) and their messages to OUT_DIR/log.txt, so a stage that times out leaves the ones before it: the binary runs at
# all (a sandboxed kernel can refuse it), smoke (CUDA loads, the kernels compile, one
# sequence matches the CPU), parity on real weights (the 4-layer cut), the OpenAI API over
# the GPU engine against the CPU's, parity on a synthetic
# SmolLM2-135M-shaped model with realistic weight scales, then throughput on the Llama 1B
# and 8B shapes, and last the GEMM kernels under compute-sanitizer. Sized for about 4
# minutes on one H200; STAGE_TIMEOUT bounds each long stage.
set -uo pipefail
cd "$(dirname "$0")/.."

DIR=gpu-check
case "${1:-}" in
prepare)
    set -e
    cargo build --release -p samewise-engine --example gpu_check
    cargo build --release --bin samewise
    mkdir -p "$DIR"
    strip -o "$DIR/gpu_check" target/release/examples/gpu_check
    model="$(scripts/fetch-model.sh | tail -1)"
    target/release/samewise engine synth --from "$model" --layers 4 --out "$DIR/smollm2-4l.gguf"
    du -b "$DIR"/* | awk '{ s += $1; print } END { printf "total %.1f MiB\n", s / 1048576 }'
    ;;
run)
    OUT="${2:?usage: scripts/gpu-check.sh run OUT_DIR}"
    mkdir -p "$OUT"
    T="${STAGE_TIMEOUT:-120}"
    BIN="$DIR/gpu_check"
    TMP="$(mktemp -d)"
    LOG="$OUT/log.txt"
    : >"$OUT/results.jsonl"
    # each stage's JSON line is appended to results.jsonl as the stage ends (the device
    # returns at most 8 files)
    stage() {
        local name="$1" limit="$2"
        shift 2
        local t0=$SECONDS
        timeout "$limit" "$BIN" "$@" >"$TMP/$name.json" 2>>"$LOG"
        local rc=$?
        echo "stage $name: rc $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
        printf '{"stage_name":"%s","rc":%d,"s":%d,"result":%s}\n' "$name" "$rc" "$((SECONDS - t0))" \
            "$(head -c 1000000 "$TMP/$name.json" | grep . || echo null)" >>"$OUT/results.jsonl"
        cat "$TMP/$name.json"
        return $rc
    }
    {
        date -u
        uname -a
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
        ls /usr/local/cuda*/lib64/libnvrtc.so* 2>&1 | head -3
    } >>"$LOG"
    # NVRTC and cuBLAS from the CUDA toolkit, or from the Python wheels beside PyTorch,
    # where cudarc looks for them
    for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        "$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)"; do
        [ -n "$d" ] && [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
    done
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$LOG"
    # 0: the binary runs at all (usage error, exit 1, but a JSON line)
    "$BIN" >>"$LOG" 2>&1
    echo "stage 0-runs: rc $? (1 expected)" | tee -a "$LOG"
    stage 1-smoke 90 smoke --model "$DIR/smollm2-4l.gguf"
    stage 2-parity-real "$T" parity --model "$DIR/smollm2-4l.gguf" --max-len 4096
    stage 2-serve 90 serve --model "$DIR/smollm2-4l.gguf"
    stage 3-synth-1b 60 synth --shape 1b --seed 7 --out "$TMP/1b.gguf" &&
        stage 4-throughput-1b "$T" throughput --model "$TMP/1b.gguf" --threads 16
    # the large-batch GEMMs under Nsight Compute: where their time goes (a few launches)
    NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
    if [ -n "$NCU" ] && [ -f "$TMP/1b.gguf" ]; then
        timeout 90 "$NCU" --clock-control none -k 'regex:gemm_q4_wide$' \
            --launch-count 2 --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section LaunchStats \
            "$BIN" gemm --model "$TMP/1b.gguf" --m 2048 --reps 1 >"$OUT/ncu.txt" 2>&1
        echo "stage ncu: rc $?" | tee -a "$LOG"
    fi
    rm -f "$TMP/1b.gguf"
    stage 5-synth-smol 60 synth --shape smol --seed 7 --out "$TMP/smol.gguf" &&
        stage 6-parity-smol "$T" parity --model "$TMP/smol.gguf" --max-len 2048
    rm -f "$TMP/smol.gguf"
    stage 7-synth-8b "$T" synth --shape 8b --seed 7 --out "$TMP/8b.gguf" &&
        stage 8-throughput-8b "$T" throughput --model "$TMP/8b.gguf" --no-cpu
    # last, the new kernels under compute-sanitizer's memcheck (out-of-bounds and misaligned
    # accesses), each forced for every product of a short scoring run
    if command -v compute-sanitizer >/dev/null; then
        for k in wide; do
            SAMEWISE_CUDA_GEMM=$k timeout 60 compute-sanitizer --tool memcheck --print-limit 5 \
                "$BIN" smoke --model "$DIR/smollm2-4l.gguf" >"$TMP/memcheck" 2>&1
            echo "stage 9-memcheck-$k: rc $?" | tee -a "$LOG"
            { echo "== $k"; cat "$TMP/memcheck"; } >>"$OUT/memcheck.txt"
            tail -5 "$TMP/memcheck"
        done
    fi
    rm -rf "$TMP"
    ;;
*)
    echo "usage: scripts/gpu-check.sh prepare | run OUT_DIR" >&2
    exit 2
    ;;
esac
