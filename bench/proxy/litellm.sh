# Sourced by bench/proxy/compare.sh: LiteLLM's proxy (`litellm[proxy]` from PyPI, in a venv at
# LITELLM_VENV, default .venv-litellm, git-ignored; LITELLM_VERSION pins it) in front of the
# same mock as `samewise serve`, on 127.0.0.1. `litellm_setup` makes the venv once;
# `start_litellm MOCK_URL PORT DIR` starts one uvicorn worker with model `bench` → the mock's
# `bench-model` and sets LL_PID; its client key is LITELLM_MASTER_KEY (LiteLLM 1.108 refuses
# to start without a master key). Offline: the model cost map is read from the package
# (LITELLM_LOCAL_MODEL_COST_MAP=True), telemetry is off.
LITELLM_VENV=${LITELLM_VENV:-.venv-litellm}
export LITELLM_MASTER_KEY=${LITELLM_MASTER_KEY:-sk-bench-$RANDOM$RANDOM}

litellm_setup() {
    if [ ! -x "$LITELLM_VENV/bin/litellm" ]; then
        python3 -m venv "$LITELLM_VENV"
        "$LITELLM_VENV/bin/pip" install -q "litellm[proxy]${LITELLM_VERSION:+==$LITELLM_VERSION}"
    fi
    "$LITELLM_VENV/bin/pip" show litellm | sed -n 's/^Version: //p'
}

LL_PID=
start_litellm() {
    cat >"$3/litellm.yaml" <<YAML
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench-model
      api_base: $1/v1
      api_key: mock
general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
litellm_settings:
  telemetry: false
YAML
    LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR \
        "$LITELLM_VENV/bin/litellm" --config "$3/litellm.yaml" --host 127.0.0.1 --port "$2" \
        --num_workers 1 >>"$3/litellm.log" 2>&1 &
    LL_PID=$!
    PIDS+=("$LL_PID")
    wait_http "http://127.0.0.1:$2/health/liveliness" 600 "LiteLLM did not come up (see $3/litellm.log)"
}
