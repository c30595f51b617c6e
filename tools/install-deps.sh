#!/usr/bin/env bash
# Installs the Debian 12 packages k3serve builds and runs with (root), then UCX 1.22 (the libucx-cu13 wheel:
# CUDA transports, CMake config, ucx_perftest) into the build venv, where cmake/ucx.cmake finds it.
# Idempotent.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates python3 python3-venv python3-pip
      libzmq3-dev cppzmq-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
      libboost-dev libboost-system-dev catch2 libcli11-dev libopenblas-dev)
# ctest -L deploy runs a real local Slurm job (slurmctld, slurmd, the clients, munge) on 127.0.0.1.
PKGS+=(slurmctld slurmd slurm-client munge)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# UCX: one version for CPU and CUDA builds, from PyPI (Debian's 1.13 has no CUDA transports).
UCX_VERSION=1.22.0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${K3_BUILD_DIR:-$ROOT/build}/venv"
if ! grep -qsx "$UCX_VERSION" "$VENV"/lib/python3*/site-packages/libucx/UCX_WHEEL_VERSION.txt; then
  if [[ ! -x "$VENV/bin/python3" ]]; then python3 -m venv "$VENV"; fi
  "$VENV/bin/python3" -m pip install -q --disable-pip-version-check "libucx-cu13==$UCX_VERSION" ||
    { echo "install-deps: could not install libucx-cu13==$UCX_VERSION from PyPI into $VENV" >&2; exit 1; }
fi
# NCCL for the GPU ranks' Comm (transfer/nccl/): where the CUDA toolkit is but NCCL is not, the PyPI
# wheel nvidia-nccl-cu13 goes to /opt/k3/nccl (CMake looks there). Without it k3_nccl is not built.
if [[ -x /usr/local/cuda/bin/nvcc && ! -f /usr/local/cuda/include/nccl.h && ! -f /opt/k3/nccl/nvidia/nccl/include/nccl.h ]]; then
  if ! python3 -m pip install -q --disable-pip-version-check --break-system-packages --target /opt/k3/nccl nvidia-nccl-cu13; then
    echo "install-deps: could not install nvidia-nccl-cu13 (PyPI unreachable?); the NCCL Comm will not be built" >&2
  fi
fi
