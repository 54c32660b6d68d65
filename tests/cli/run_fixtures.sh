#!/usr/bin/env bash
# `tessera run` on every converted Qwen fixture with each sampling mode:
# each run must exit 0 and generate exactly the asked number of tokens or
# stop at an end-of-generation token, and greedy must repeat itself.
# usage: run_fixtures.sh TESSERA FIXTURES_DIR OUT_DIR
set -uo pipefail
tessera=$1 fixtures=$2 out=$3
mkdir -p "$out"
status=0
modes=(
  "greedy|--temp 0"
  "temperature|--temp 0.8 --seed 7"
  "top_k|--temp 1 --top-k 5 --seed 8"
  "top_p|--temp 1 --top-p 0.9 --seed 9"
  "min_p|--temp 1 --min-p 0.1 --seed 10"
)
for f in qwen3_tied qwen3_untied qwen3_moe_norm qwen3_moe_nonorm qwen3_5 qwen3_5_moe; do
  model="$out/$f.f16.gguf"
  if ! "$tessera" convert "$fixtures/$f" "$model" --outtype f16 >/dev/null 2>&1; then
    echo "FAIL convert_$f"; status=1; continue
  fi
  for m in "${modes[@]}"; do
    name=${m%%|*} flags=${m#*|}
    # shellcheck disable=SC2086
    err=$("$tessera" run -m "$model" -p "The old lighthouse" -n 12 $flags --verbose 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 0 ] && grep -Eq "generated: (12 tokens \(stop: limit\)|[0-9]+ tokens \(stop: e)" <<<"$err"; then
      echo "ok   run_${f}_${name}"
    else
      echo "FAIL run_${f}_${name} (exit $rc: $(grep -E 'generated|tessera' <<<"$err" | head -2))"
      status=1
    fi
  done
  a=$("$tessera" run -m "$model" -p "The old lighthouse" -n 12 --temp 0 2>/dev/null)
  b=$("$tessera" run -m "$model" -p "The old lighthouse" -n 12 --temp 0 2>/dev/null)
  if [ "$a" == "$b" ]; then echo "ok   run_${f}_greedy_repeats"; else echo "FAIL run_${f}_greedy_repeats"; status=1; fi
done
exit $status
