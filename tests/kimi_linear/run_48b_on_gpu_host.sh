#!/usr/bin/env bash
# One call on a GPU host: kimi-linear-48b dimensions with synthetic bf16 weights (98 GB, drawn in GPU
# memory: no files) through transformers and through k3serve on the same GPU, then decode speed.
#   env.log      GPU, Python, torch and the packages found (printed first: the host has no network);
#   hf.log       transformers' KimiLinearForCausalLM built on the meta device, allocated on the GPU,
#                filled by tests/kimi_linear/synthetic_weights.py (seed $SEED), teacher-forced logits of
#                4 prompts x 64 tokens (runs while k3serve builds; its process ends before k3serve starts);
#   tests.log    cuda_test_cuda_weight_fill (the GPU fill equals the host generator bit for bit);
#   generate.log k3-generate --backend cuda --model synthetic:kimi-linear-48b:$SEED --logits-out (same prompts);
#   compare.json max logit error and top-1 agreement of k3serve against transformers;
#   bench.log    k3-bench engine --preset kimi-linear-48b: decode tok/s at batch 1 and 64 against the
#                bandwidth roofline (copy bandwidth measured in the same run);
#   greedy.log   k3-generate --backend cuda, 32 greedy tokens, batch 1.
# Usage: tests/kimi_linear/run_48b_on_gpu_host.sh OUT_DIR
# Needs .kit/k3-offline-kit.tar.gz, CFG_DIR (default .kimi-48b) holding the config.json of
#   build/bin/k3-genweights --preset kimi-linear-48b --config-only --out .kimi-48b
# and WHL_DIR (default .whl-kimi) holding transformers and the wheels it needs beyond a PyTorch
# install (docs/MODELS.md lists them). Each stage has its own time limit.
# A dry run of the same steps at a tiny size on a machine without a GPU (no kit, an existing build):
#   PRESET=kimi-linear-tiny VOCAB=512 DEVICE=cpu HF_DTYPE=f32 BUILD=build PYTHON=build/venv/bin/python3 \
#     CFG_DIR=<k3-genweights --preset kimi-linear-tiny --config-only> tests/kimi_linear/run_48b_on_gpu_host.sh OUT
set -uo pipefail
OUT=${1:?output dir}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SEED=${SEED:-7}
PRESET=${PRESET:-kimi-linear-48b}
VOCAB=${VOCAB:-163840}
DEVICE=${DEVICE:-cuda}      # transformers' device and k3serve's backend
HF_DTYPE=${HF_DTYPE:-bf16}
PYTHON=${PYTHON:-python3}
CFG_DIR=${CFG_DIR:-.kimi-48b}
WHL_DIR=${WHL_DIR:-.whl-kimi}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

{ nvidia-smi -L; nvidia-smi --query-gpu=memory.total,memory.used --format=csv; date -u; python3 --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  python3 -m pip list 2>/dev/null | grep -i -E "^(numpy|transformers|tokenizers|safetensors|huggingface|regex|pyyaml|tqdm|packaging|filelock|fsspec|typer|httpx) "
  df -h /tmp | tail -1; free -g | head -2; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

# Wheels unpacked into /tmp/site in one step (a wheel is a zip of the installed files and their
# metadata; numpy only when the host has none).
mkdir -p /tmp/site
$PYTHON - "$WHL_DIR" > "$OUT/pip.log" 2>&1 <<'PY'
import glob, importlib.util, os, sys, zipfile
for w in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
    if os.path.basename(w).startswith("numpy-") and importlib.util.find_spec("numpy"):
        print("numpy: the host's"); continue
    zipfile.ZipFile(w).extractall("/tmp/site"); print("unpacked", os.path.basename(w))
PY
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
PY="$PYTHON tests/kimi_linear/synthetic_kimi_linear.py"
$PY prompts --vocab $VOCAB --count 4 --length 64 --seed 1 --out /tmp/prompts.json > "$OUT/prompts.log" 2>&1 ||
  { echo "prompts: failed"; cat "$OUT/prompts.log"; }
cp /tmp/prompts.json "$OUT/" 2>/dev/null
stamp "wheels installed; transformers starts"
( timeout 170 $PY hf-logits --config "$CFG_DIR" --seed "$SEED" --prompts /tmp/prompts.json --out /tmp/hf.f32 \
    --device "$DEVICE" --dtype "$HF_DTYPE" > "$OUT/hf.log" 2>&1; echo "hf-logits: rc $?" >> "$OUT/hf.log" ) &
HF_PID=$!

if [[ -n "${BUILD:-}" ]]; then
  B=$BUILD  # an existing build (the dry run)
else
  deploy/offline-kit.sh unpack .kit/k3-offline-kit.tar.gz /tmp/k3kit >/dev/null || exit 1
  # shellcheck disable=SC1091
  source /tmp/k3kit/env.sh
  B=build-gpu
  cmake -S . -B $B -G Ninja -DK3_CUDA=ON -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; }
  timeout 240 ninja -C $B -j16 k3-generate k3-bench cuda_test_cuda_weight_fill >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -40; }
fi
stamp "build done; waiting for transformers"
wait $HF_PID
grep -v "falling back" "$OUT/hf.log" | tail -5
stamp "transformers done"

if [[ $DEVICE == cuda ]]; then
  timeout 60 $B/tests/cuda_test_cuda_weight_fill > "$OUT/tests.log" 2>&1
  echo "cuda_test_cuda_weight_fill: rc $?" | tee -a "$OUT/tests.log"; tail -3 "$OUT/tests.log"
fi

timeout 120 $B/bin/k3-generate --backend "$DEVICE" --model "synthetic:$PRESET:$SEED" --prompts-file /tmp/prompts.json \
  --logits-out /tmp/k3.f32 > "$OUT/generate.log" 2>&1
echo "k3-generate --logits-out: rc $?" | tee -a "$OUT/generate.log"; tail -2 "$OUT/generate.log"
stamp "k3serve logits done"
if [[ -s /tmp/hf.f32 && -s /tmp/k3.f32 ]]; then
  $PY compare --ref /tmp/hf.f32 --got /tmp/k3.f32 --vocab $VOCAB --json "$OUT/compare.json" 2>&1 | tail -2
fi

if [[ $DEVICE == cuda ]]; then  # k3-bench engine is GPU-only
  timeout 150 $B/bin/k3-bench engine --preset "$PRESET" --seed "$SEED" --batches 1 64 --contexts 1024 \
    --prefill 1024 --steps 10 --no-profile > "$OUT/bench.log" 2>&1
  echo "k3-bench engine: rc $?" | tee -a "$OUT/bench.log"
  grep -E "^\||ceilings|upload" "$OUT/bench.log" | tail -14
  stamp "bench done"
fi

IDS=$($PYTHON -c "import json; print(','.join(map(str, json.load(open('/tmp/prompts.json'))[0][:16])))")
timeout 60 $B/bin/k3-generate --backend "$DEVICE" --model "synthetic:$PRESET:$SEED" --prompt-ids "$IDS" \
  --max-tokens 32 --ignore-eos > "$OUT/greedy.log" 2>&1
echo "k3-generate greedy: rc $?" | tee -a "$OUT/greedy.log"; tail -3 "$OUT/greedy.log"
stamp "all done"
