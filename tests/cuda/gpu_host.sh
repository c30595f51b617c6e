# Sourced by the scripts that run on the GPU host (tests/cuda/run_*_on_gpu_host.sh,
# bench/transfer_on_gpu_host.sh): the set-up they all share, written once.
#   gpu_host_setup OUT_DIR   cd to the repository root, unpack the offline kit (.kit/, made by
#                            deploy/offline-kit.sh pack), load its environment, write the machine to
#                            OUT_DIR/build.log and configure build-gpu (CUDA on, Release). Sets B and T0.
#   gpu_host_stage LOG LIMIT PATTERN CMD...
#                            runs CMD for at most LIMIT seconds into OUT_DIR/LOG, appends its exit code
#                            and time, and prints the lines matching PATTERN (an extended regex).
# shellcheck shell=bash
gpu_host_setup() {
  GPU_HOST_OUT=$1
  mkdir -p "$GPU_HOST_OUT"
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
  deploy/offline-kit.sh unpack .kit/k3-offline-kit.tar.gz /tmp/k3kit >/dev/null || exit 1
  # shellcheck disable=SC1091
  source /tmp/k3kit/env.sh
  { nvidia-smi -L; nvcc --version | tail -1; g++ --version | head -1; cmake --version | head -1
    echo "NCCL_ROOT=${NCCL_ROOT:-none}"; date -u; } 2>&1 | tee "$GPU_HOST_OUT/build.log"
  B=build-gpu
  T0=$(date +%s)
  cmake -S . -B $B -G Ninja -DK3_CUDA=ON -DCMAKE_BUILD_TYPE=Release >> "$GPU_HOST_OUT/build.log" 2>&1 ||
    { tail -40 "$GPU_HOST_OUT/build.log"; exit 1; }
}

gpu_host_stage() {
  local log=$1 lim=$2 pattern=$3 s rc
  shift 3
  s=$(date +%s)
  timeout "$lim" "$@" > "$GPU_HOST_OUT/$log" 2>&1
  rc=$?
  echo "$log: rc $rc, $(( $(date +%s) - s )) s" | tee -a "$GPU_HOST_OUT/$log"
  grep -E "$pattern" "$GPU_HOST_OUT/$log" | tail -30
}
