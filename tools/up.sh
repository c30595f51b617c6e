#!/usr/bin/env bash
# The embedded default: installs what is missing, builds, generates a k3-tiny model on first use and
# serves it with the OpenAI-compatible API on http://127.0.0.1:${K3_PORT:-8000} (foreground; Ctrl-C stops).
# Today the router runs the monolithic engine in-process; the disaggregated cluster (PP prefill +
# DP decode over UCX) replaces it when k3-cluster lands. Extra arguments go to k3-router.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
K3_TARGETS="${K3_TARGETS:-k3-router k3-genweights k3-generate}" bash "$ROOT/tools/build.sh"
MODEL="${K3_MODEL_DIR:-$ROOT/models/k3-tiny}"
if [[ ! -f "$MODEL/config.json" ]]; then
  "$ROOT/build/bin/k3-genweights" --preset k3-tiny --out "$MODEL" --seed 0 --force
fi
exec "$ROOT/build/bin/k3-router" --model "$MODEL" --port "${K3_PORT:-8000}" "$@"
