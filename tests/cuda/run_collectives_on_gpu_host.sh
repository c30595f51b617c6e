#!/usr/bin/env bash
# The NCCL collectives of a GPU decode group beside PyTorch's, on every GPU of the host, in one call:
# unpack the offline kit, configure + build k3-bench, then (logs under OUT_DIR)
#   k3.log     k3-bench collectives --gpus N (transfer/nccl/comm_nccl.h, one process per GPU);
#   torch.log  bench/torch_collectives.py --gpus N (torch.distributed over NCCL: the anchor);
#   ranks.log  k3-bench ranks --backend cuda --k3-heads over NCCL, one GPU per rank, DCP and EP over all N
#              GPUs, batch 1 / 16 / 64 (the decode step split into compute and collectives).
# N = the GPUs nvidia-smi lists (at least 2 for anything to cross a link; with 1 the figures are the
# calls' fixed cost).
#   tests/cuda/run_collectives_on_gpu_host.sh OUT_DIR [MAX_BYTES]
set -uo pipefail
OUT=${1:?output dir}
MAX=${2:-256M}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 300 ninja -C $B -j16 k3-bench >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
N=$(nvidia-smi -L | wc -l)
gpu_host_stage k3.log 300 "." $B/bin/k3-bench collectives --gpus "$N" --max-bytes "$MAX"
gpu_host_stage torch.log 300 "." python3 bench/torch_collectives.py --gpus "$N" --max-bytes "$MAX"
if [ "$N" -ge 2 ]; then
  {
    for b in 1 16 64; do
      $B/bin/k3-bench ranks --backend cuda --k3-heads --heads "$N" --dcp "$N" --gpus "$N" --collectives nccl \
        --batch $b --context 2048 --steps 20
      $B/bin/k3-bench ranks --backend cuda --k3-heads --ep "$N" --gpus "$N" --collectives nccl --batch $b \
        --context 2048 --steps 20
    done
  } > "$OUT/ranks.log" 2>&1
  grep -v "^$" "$OUT/ranks.log" | head -60
fi
