#!/usr/bin/env bash
# gpu_model_parity on the cpu (--self: the second side a cpu backend with 8-bit activations):
# on a q8_0 model the two sides differ, so every layer's line is printed, some layer's
# distance is above zero, and a --max-vs-cpu bar below it fails the verdict line.
#   test_model_parity_self.sh TESSERA GPU_MODEL_PARITY FIXTURE_DIR OUT_DIR
#   prints "ok   name" / "FAIL name"
set -uo pipefail
tessera=$1 tool=$2 fixture=$3 out=$4
. "$(dirname "$0")/test_lib.sh"
mkdir -p "$out"
m="$out/$(basename "$fixture").q8_0.gguf"
"$tessera" convert "$fixture" "$m" --outtype q8_0 >/dev/null || exit 1
# the tool's own lines, indented so that its verdict is not read as a test case's
run_tool() { "$tool" "$m" "$fixture/golden.gguf" self --self --min-argmax 0 --max-kl 1 "$@" >"$tmp/log"; }
check without_a_bar_it_passes_and_every_layer_is_compared_and_some_differ \
  'run_tool && sed "s/^/  | /" "$tmp/log" &&
   [ "$(grep -c "^  self layer [0-9]* *cuda vs cpu max rel" "$tmp/log")" -ge 2 ] &&
   [ "$(grep "^  self layer" "$tmp/log" | awk "\$NF + 0 > 0" | wc -l)" -ge 1 ]'
check a_bar_below_the_distance_fails_the_verdict \
  '! run_tool --max-vs-cpu 1e-9 && tail -1 "$tmp/log" | grep -q "^FAIL  model self .*vs cpu <= 1e-09"'
echo "$fails failed"
[ "$fails" -eq 0 ]
