#!/usr/bin/env bash
# Builds the out-of-tree example plugin, then runs the plugin host tests.
# usage: run_plugin_tests.sh BUILD_ROOT TEST_BINARY BAD_PLUGIN_DIR OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/build_out_of_tree.sh" "$1" "$4"
status=0
"$2" "$1" "$3" "$4" || status=1

# --require-engaged on a real run: the swapped-in attention and the arch
# count their work; a plugin that is not loaded fails the run with exit 2.
tessera="$1/core/cli/tessera"
fixture="$here/../reference/fixtures/qwen3_tied"
model="$4/qwen3_tied.f32.gguf"
"$tessera" convert "$fixture" "$model" --outtype f32 >/dev/null
check() { # name, wanted exit code, command...
  local name=$1 want=$2 rc=0
  shift 2
  "$@" >/dev/null 2>&1 || rc=$?
  if [ "$rc" -eq "$want" ]; then echo "ok   $name"; else echo "FAIL $name (exit $rc, wanted $want)"; status=1; fi
}
check run_with_swapped_attention_engages_it 0 "$tessera" parity "$model" "$fixture/golden.gguf" \
  --attention example_attention --plugin-path "$4/good" \
  --require-engaged example_attention --require-engaged arch_qwen
# flash (the core's) did no work in that run: requiring it fails the run
check require_engaged_fails_when_the_plugin_did_nothing 1 "$tessera" parity "$model" \
  "$fixture/golden.gguf" --attention example_attention --plugin-path "$4/good" \
  --require-engaged core
check require_engaged_names_a_plugin_that_is_not_loaded 2 "$tessera" parity "$model" \
  "$fixture/golden.gguf" --require-engaged example_attention
exit $status
