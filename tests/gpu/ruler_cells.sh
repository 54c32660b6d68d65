#!/usr/bin/env bash
# RULER-style cells of the long-context tables (docs/QUALITY.md) on the GPU machine:
# each model x task x multiple of its trained context, flash (conf/default.yaml) and
# DCA (conf/long-context-dca.yaml), greedy on backend cuda. From the repository root
# of a copy of the tree with RUN_DIR (tests/gpu/run.sh build) carried:
#
#   tests/gpu/ruler_cells.sh RUN_DIR OUT_TSV N "MODEL.gguf[:TRAINED_CTX] ..." "TASK ..." "MULT ..."
#
# One line per cell is appended to OUT_TSV as soon as it finishes (model, task, ctx,
# multiple, attention, n, accuracy %, prefill tok/s, seconds), so a call that runs
# out of time keeps what it measured. DEADLINE_S (default 480): no cell starts later;
# ATTNS ("flash dca"): which of the two to run; FLASH_PROFILE / DCA_PROFILE (conf/default.yaml /
# conf/long-context-dca.yaml; a model of another arch needs profiles loading its arch plugin,
# e.g. conf/ref-gemma4.yaml / conf/ref-gemma4-dca.yaml); BACKEND (cuda): the backend the cells run on;
# UBATCH (2048): tokens per prefill pass (the attention kernels fill the GPU with blocks of
# 64 rows, query x head, per KV head). A model over a call's carry limit (the real ones)
# goes over first in parts: tests/gpu/carry_parts.sh. Batches longer than one device command:
# tests/gpu/ruler_detached.sh.
set -uo pipefail
if [ $# -lt 6 ]; then sed -n '2,18p' "$0"; exit 2; fi
b=$(cd "$1" && pwd) tsv=$2 n=$3 models=$4 tasks=$5 mults=$6
deadline=$((SECONDS + ${DEADLINE_S:-480}))
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH="$b/core/cli:${LD_LIBRARY_PATH:-}"
export TESSERA_CUDA_BACKEND="$b/core/cuda/libtessera-cuda.so"
[ -s "$tsv" ] || printf 'model\ttask\tctx\tx\tattention\tn\taccuracy\tprefill_tok_s\tseconds\n' >"$tsv"
log=$(mktemp)
for spec in $models; do
  model=${spec%%:*} trained=2048
  [ "$spec" != "$model" ] && trained=${spec#*:}
  for mult in $mults; do
    for task in $tasks; do
      for attn in ${ATTNS:-flash dca}; do
        if [ $SECONDS -ge $deadline ]; then
          echo "deadline: $(basename "$model") $task ${mult}x $attn and later cells not started"
          continue
        fi
        profile=${FLASH_PROFILE:-conf/default.yaml}
        [ $attn = dca ] && profile=${DCA_PROFILE:-conf/long-context-dca.yaml}
        ctx=$((trained * mult)) t0=$SECONDS
        "$b/core/cli/tessera" ruler --profile $profile --set model="$model" --set backend="${BACKEND:-cuda}" --set ubatch="${UBATCH:-2048}" \
          --task "$task" --ctx $ctx --n "$n" --no-chat >"$log" 2>&1
        rc=$?
        acc=$(grep -o 'accuracy [0-9.]*' "$log" | awk '{print $2}')
        pf=$(grep -o 'prefill [0-9.]* tok/s' "$log" | awk '{print $2}')
        [ $rc -ne 0 ] && { echo "cell failed (exit $rc):"; tail -3 "$log"; acc="error"; }
        printf '%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\n' "$(basename "$model" .gguf)" "$task" $ctx \
          "$mult" $attn "$n" "${acc:-?}" "${pf:-?}" $((SECONDS - t0)) | tee -a "$tsv"
      done
    done
  done
done
rm -f "$log"
