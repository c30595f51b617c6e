#!/usr/bin/env bash
# Installs missing Debian packages, configures (once) and builds k3serve into build/ (binaries in build/bin/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/install-deps.sh"
BUILD="${K3_BUILD_DIR:-$ROOT/build}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${K3_CMAKE_ARGS:-}
fi
cmake --build "$BUILD" -j "${K3_JOBS:-$(nproc)}" ${K3_TARGETS:+--target $K3_TARGETS}
