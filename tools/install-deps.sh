#!/usr/bin/env bash
# Installs the Debian 12 packages k3serve builds and runs with. Idempotent; run as root.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates python3 python3-venv python3-pip
      libucx-dev ucx-utils libzmq3-dev cppzmq-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
      libboost-dev libboost-system-dev catch2 libcli11-dev libopenblas-dev)
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
# NCCL for the GPU ranks' Comm (transfer/nccl/): where the CUDA toolkit is but NCCL is not, the PyPI
# wheel nvidia-nccl-cu13 goes to /opt/k3/nccl (CMake looks there). Without it k3_nccl is not built.
if [[ -x /usr/local/cuda/bin/nvcc && ! -f /usr/local/cuda/include/nccl.h && ! -f /opt/k3/nccl/nvidia/nccl/include/nccl.h ]]; then
  if ! python3 -m pip install -q --disable-pip-version-check --break-system-packages --target /opt/k3/nccl nvidia-nccl-cu13; then
    echo "install-deps: could not install nvidia-nccl-cu13 (PyPI unreachable?); the NCCL Comm will not be built" >&2
  fi
fi
