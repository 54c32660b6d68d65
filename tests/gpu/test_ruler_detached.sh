#!/usr/bin/env bash
# ruler_detached.sh on this machine's CPU with the embedded model at a tiny context: start
# fills one TSV per task x attention, wait reports them, stop ends a run that would take
# minutes, a missing model is refused. Runs in CI (no GPU needed).
#   test_ruler_detached.sh SOURCE_ROOT BUILD_ROOT      prints "ok   name" / "FAIL name"
set -uo pipefail
src=$1 build=$2
script=$src/tests/gpu/ruler_detached.sh model=$src/models/ref-qwen3-21m.gguf
. "$(dirname "$0")/test_lib.sh"
trap 'bash "$script" stop "$tmp/long" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
cd "$src" || exit 1
export BACKEND=cpu
check start_runs_flash_and_dca_to_their_own_tsv \
  'bash "$script" start "$build" "$tmp/short" 2 "$model:256" passkey 1 &&
   bash "$script" wait "$tmp/short" 120 >"$tmp/w" &&
   grep -q "^running: none" "$tmp/w" &&
   [ $(grep -cP "^ref-qwen3-21m\tpasskey\t256\t1\t(flash|dca)\t2\t[0-9.]+\t" "$tmp/w") -eq 2 ]'
# 64x the trained 256: a cell of minutes on this CPU
check stop_ends_a_running_cell \
  'ATTNS=flash bash "$script" start "$build" "$tmp/long" 1 "$model:256" passkey 64 && sleep 2 &&
   bash "$script" stop "$tmp/long" | grep -q "stopped ref-qwen3-21m.passkey.flash" &&
   sleep 1 && bash "$script" wait "$tmp/long" 5 | grep -q "^running: none" &&
   { ! pgrep -af "$tmp/long" || { echo "left running"; false; }; }'
# a second model into the same OUT_DIR while the first runs: both keep running
gemma=$src/models/ref-gemma4-23m.gguf
check a_second_start_leaves_the_first_running \
  'ATTNS=flash bash "$script" start "$build" "$tmp/long" 1 "$model:256" passkey 64 && sleep 1 &&
   FLASH_PROFILE=conf/ref-gemma4.yaml ATTNS=flash bash "$script" start "$build" "$tmp/long" 2 \
     "$gemma:256" passkey 1 &&
   for i in $(seq 120); do [ $(wc -l <"$tmp/long/ref-gemma4-23m.passkey.flash.tsv") -eq 2 ] &&
     break; sleep 1; done && bash "$script" wait "$tmp/long" 1 >"$tmp/w" &&
   grep -qP "^ref-gemma4-23m\tpasskey\t256\t1\tflash\t2\t[0-9.]+\t" "$tmp/w" &&
   grep -q "^running:.* ref-qwen3-21m.passkey.flash" "$tmp/w" &&
   ! ATTNS=flash bash "$script" start "$build" "$tmp/long" 1 "$model:256" passkey 64 &&
   bash "$script" stop "$tmp/long" | grep -q "stopped ref-qwen3-21m.passkey.flash"'
check a_missing_model_is_refused \
  '! bash "$script" start "$build" "$tmp/none" 2 "$tmp/absent.gguf:256" passkey 1 &&
   [ ! -d "$tmp/none" ]'
exit $((fails > 0))
