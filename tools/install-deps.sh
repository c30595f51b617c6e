#!/usr/bin/env bash
# Installs the Debian 12 packages k3serve builds and runs with. Idempotent; run as root.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates python3 python3-venv python3-pip
      libucx-dev ucx-utils libzmq3-dev cppzmq-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
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
