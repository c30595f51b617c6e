#!/usr/bin/env bash
# Builds everything and runs the whole test suite (CTest), printing its summary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/build.sh"
cd "${K3_BUILD_DIR:-$ROOT/build}"
# Multi-process tests pick their own ports; run two at a time on the 2-core machines.
ctest --output-on-failure -j "${K3_TEST_JOBS:-2}" --timeout 900 "$@"
