#!/usr/bin/env bash
# One <10-minute chunk of training one reference model on the GPU machine; run it again with
# the same arguments to continue. From the repository root of a copy of the tree:
#
#   tests/reference/train/run_gpu.sh MODEL OUT_DIR CKPT_DIR [PREP_DIR]
#
#   MODEL     qwen3 | gemma4
#   OUT_DIR   what should come back (point it at $OUT); emptied by nothing here
#   CKPT_DIR  state.pt, the cumulative log and, when done, hf/; resumed from when it holds a
#             state.pt (keep it outside OUT_DIR, e.g. /tmp/tessera-train/qwen3: the optimizer
#             state is 250 MB and stays on the machine)
#   PREP_DIR  the folder `train.py prepare` wrote, carried in (default .train-prep)
#
# Environment: MAX_MINUTES (8.5): wall-clock limit of this call's training, after which it
# saves and stops; BUDGET_MINUTES (11): training time the schedule is sized to on the first
# call; EVAL_N (50): samples per task cell in the final eval; TRAIN_ARGS: more train.py
# options (e.g. "--steps 5230" to repeat a run whose schedule was printed).
#
# OUT_DIR receives MODEL-train.log, MODEL-loss.tsv and MODEL-status.json every call; the
# call that finishes the schedule also runs the eval and packs CKPT_DIR/hf into
# MODEL-hf.tar.00, .01, ... (15 MiB parts: `cat MODEL-hf.tar.* | tar x` joins them).
set -euo pipefail
if [ $# -lt 3 ]; then sed -n '2,22p' "$0"; exit 2; fi
model=$1 out=$2 ckpt=$3 prep=${4:-.train-prep}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "$out" "$ckpt"
log="$ckpt/train.log"
{
  echo "=== $(date -u +%FT%TZ) run_gpu.sh $*"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
} >>"$log"

set +e
# shellcheck disable=SC2086
python3 "$here/train.py" train --prep "$prep" --model "$model" --out "$ckpt" --ckpt "$ckpt" \
  --max-minutes "${MAX_MINUTES:-8.5}" --budget-minutes "${BUDGET_MINUTES:-11}" ${TRAIN_ARGS:-} \
  2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
set -e
cp "$log" "$out/$model-train.log"
[ -f "$ckpt/loss.tsv" ] && cp "$ckpt/loss.tsv" "$out/$model-loss.tsv"
[ -f "$ckpt/status.json" ] && cp "$ckpt/status.json" "$out/$model-status.json"
if [ "$rc" -ne 0 ]; then echo "train.py exited $rc" | tee -a "$log"; exit "$rc"; fi

if python3 -c "import json,sys; sys.exit(0 if json.load(open('$ckpt/status.json'))['done'] else 1)"
then
  python3 "$here/train.py" eval --prep "$prep" --hf "$ckpt/hf" --n "${EVAL_N:-50}" 2>&1 \
    | tee -a "$log"
  cp "$ckpt/loss.tsv" "$ckpt/train.log" "$ckpt/hf/"
  cp "$ckpt/hf/eval.json" "$out/$model-eval.json"
  tar -C "$ckpt" -cf - hf | split -b 15M -d -a 2 - "$out/$model-hf.tar."
  cp "$log" "$out/$model-train.log"
  ls -l "$out"
else
  echo "not finished: run the same command again to continue" | tee -a "$out/$model-train.log"
fi
