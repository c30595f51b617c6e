#!/usr/bin/env bash
# The embedded default: builds, generates a k3-tiny model on first use and runs it.
# (Until the cluster lands this runs the monolithic engine; see README.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/build.sh"
MODEL="${K3_MODEL_DIR:-$ROOT/models/k3-tiny}"
if [[ ! -f "$MODEL/model.safetensors" ]]; then
  "$ROOT/build/bin/k3-genweights" --preset k3-tiny --out "$MODEL" --seed 0 --force
fi
exec "$ROOT/build/bin/k3-generate" --model "$MODEL" --prompt "${K3_PROMPT:-Hello from k3serve}" --max-tokens "${K3_MAX_TOKENS:-32}" "$@"
