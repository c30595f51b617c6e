#!/usr/bin/env bash
# The embedded default: installs what is missing, builds, generates a k3-tiny model on first use and
# serves it with the OpenAI-compatible API on http://127.0.0.1:${K3_PORT:-8000} (foreground; Ctrl-C stops).
# It runs the disaggregated cluster of deploy/cluster-default.json through k3-cluster: the router, a
# pipeline-parallel prefill instance (2 stages) and a decode rank, every token crossing prefill -> UCX ->
# decode. K3_MODEL_DIR overrides the model dir; extra arguments go to k3-cluster (see --help).
# K3_API_KEY, when set, is the API key /v1 requires (k3-cluster hands it to the router through the
# environment; it never appears on a command line). k3-cluster restarts a node that dies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
K3_TARGETS="${K3_TARGETS:-k3-cluster k3-router k3-prefill k3-decode k3-genweights k3-generate}" bash "$ROOT/tools/build.sh"
cd "$ROOT"
if [[ -n "${K3_API_KEY:-}" ]]; then export K3_API_KEY; fi
exec "$ROOT/build/bin/k3-cluster" --spec "$ROOT/deploy/cluster-default.json" --port "${K3_PORT:-8000}" \
  --model "${K3_MODEL_DIR:-$ROOT/models/k3-tiny}" "$@"
