#!/usr/bin/env bash
# Builds the out-of-tree example plugin, then runs the plugin host tests.
# usage: run_plugin_tests.sh BUILD_ROOT TEST_BINARY BAD_PLUGIN_DIR OUT_DIR CODEC_TEST_BINARY
#                             POLICY_TEST_BINARY SPECULATOR_TEST_BINARY
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

# a composition the codec's hooks cannot make is refused at profile check,
# naming the attention, the codec and both plugins
codec_dir="$4/good/example_codec"
codec_profile() { # attention plugin-entry
  printf 'model: %s\ncontext: 64\nkv: {k: rot_f16, v: f16}\nattention: %s\nplugins:\n  - arch_qwen\n  - %s\n  - name: example_codec\n    path: %s\n' \
    "$model" "$1" "$2" "$codec_dir"
}
codec_profile bad_attention "{name: bad_rotates, path: $3/bad_rotates.ini}" >"$4/rotating.yaml"
out=$("$tessera" profile check "$4/rotating.yaml" 2>&1) && rc=0 || rc=$?
if [ "$rc" -eq 2 ] && grep -q "attention bad_attention (bad_rotates 1.0.0) positions queries" <<<"$out" &&
   grep -q "K codec rot_f16 (example_codec 1.0.0)'s query transform" <<<"$out"; then
  echo "ok   codec_hook_an_attention_cannot_apply_is_refused_naming_both"
else
  echo "FAIL codec_hook_an_attention_cannot_apply_is_refused_naming_both (exit $rc): $out"; status=1
fi
codec_profile flash arch_gemma4 >"$4/flash_codec.yaml"
out=$("$tessera" profile check "$4/flash_codec.yaml" 2>&1) && rc=0 || rc=$?
if [ "$rc" -eq 0 ] && grep -q "K rot_f16 (example_codec 1.0.0; native as f16; hooks prepare_rows, prepare_q, finish_out)" <<<"$out"; then
  echo "ok   codec_hooks_show_in_the_composition"
else
  echo "FAIL codec_hooks_show_in_the_composition (exit $rc): $out"; status=1
fi

# kv_codec hooks: the out-of-tree rot_f16 against f16 KV through flash and dca
gemma_fixture="$here/../reference/fixtures/gemma4_dense"
gemma="$4/gemma4_dense.f32.gguf"
"$tessera" convert "$gemma_fixture" "$gemma" --outtype f32 >/dev/null
"$5" "$4" "$4/good/example_codec" "$model" "$fixture/golden.gguf" \
  "$gemma" "$gemma_fixture/golden.gguf" || status=1

# decode_policy parameters: the out-of-tree example policy through the cpu's flash
"$6" "$4" "$4/good" "$model" "$fixture/golden.gguf" || status=1

# the speculator interface: the out-of-tree prompt-lookup speculator, lossless greedy
recurrent="$4/qwen3_5.f32.gguf"
"$tessera" convert "$here/../reference/fixtures/qwen3_5" "$recurrent" --outtype f32 >/dev/null
"$7" "$4" "$4/good" "$model" "$fixture/golden.gguf" "$recurrent" || status=1
# tessera run through it: the same greedy text as without, in fewer steps
printf 'model: %s\ncontext: 256\nubatch: 32\nplugins:\n  - arch_qwen\n  - name: example_speculator\n    path: %s\nspeculator: {name: example_lookup}\n' \
  "$model" "$4/good/example_speculator" >"$4/spec.yaml"
"$tessera" run --profile "$4/spec.yaml" -p "hello world" -n 48 --temp 0 >"$4/spec.txt" 2>"$4/spec.err"
"$tessera" run -m "$model" --set context=256 -p "hello world" -n 48 --temp 0 >"$4/plain.txt" 2>/dev/null
if [ -s "$4/spec.txt" ] && cmp -s "$4/spec.txt" "$4/plain.txt" && grep -q "speculative steps for 48 tokens" "$4/spec.err"; then
  echo "ok   run_with_a_speculator_writes_the_same_greedy_text"
else
  echo "FAIL run_with_a_speculator_writes_the_same_greedy_text: $(tail -2 "$4/spec.err")"; status=1
fi
exit $status
