#!/usr/bin/env bash
# tessera with attn_dca: --require-engaged attn_dca passes a run that used DCA
# and fails one that loaded it but attended with flash; an iSWA model's profile
# check prints dca on the full layers and flash on the sliding ones, and
# `attention: dca` alone is refused naming the sliding layer and the fix.
# usage: run_dca_cli.sh TESSERA FIXTURES_DIR OUT_DIR
set -uo pipefail
tessera=$1 fixtures=$2 out=$3
mkdir -p "$out"
status=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; status=1; }
"$tessera" convert "$fixtures/qwen3_tied" "$out/q.gguf" --outtype f32 >/dev/null 2>&1 || fail convert
"$tessera" convert "$fixtures/gemma4_dense" "$out/g.gguf" --outtype f32 >/dev/null 2>&1 || fail convert
profile() { # NAME MODEL ARCH ATTENTION
  printf 'model: %s\ncontext: 256\nattention: %s\nplugins:\n  - %s\n  - name: attn_dca\n    settings: {chunk_size: 8, local_size: 2}\n' \
    "$2" "$4" "$3" >"$out/$1.yaml"
  echo "$out/$1.yaml"
}
p=$(profile dca "$out/q.gguf" arch_qwen dca)
if "$tessera" run --profile "$p" -p "hello there" -n 12 --temp 0 --require-engaged attn_dca \
     >"$out/dca.txt" 2>&1; then ok require_engaged_passes_a_dca_run
else fail require_engaged_passes_a_dca_run; cat "$out/dca.txt"; fi
p=$(profile flash "$out/q.gguf" arch_qwen flash)
"$tessera" run --profile "$p" -p "hello there" -n 4 --temp 0 --require-engaged attn_dca \
  >"$out/flash.txt" 2>&1
if [ $? -eq 1 ] && grep -q "attn_dca .*never engaged" "$out/flash.txt"; then
  ok require_engaged_fails_a_run_without_dca
else fail require_engaged_fails_a_run_without_dca; cat "$out/flash.txt"; fi
p=$(profile iswa "$out/g.gguf" arch_gemma4 "{full: dca, sliding: flash}")
if "$tessera" profile check "$p" 2>&1 | tr -s ' ' | tr '\n' '|' |
     grep -q "sliding layers 0-1,3 (3).*| attention flash (core.*full layers 2,4 (2).*| attention dca (attn_dca"
then ok iswa_composition_prints_attention_per_layer_kind
else fail iswa_composition_prints_attention_per_layer_kind; "$tessera" profile check "$p"; fi
p=$(profile iswa_all "$out/g.gguf" arch_gemma4 dca)
msg=$("$tessera" profile check "$p" 2>&1 >/dev/null)
if grep -q "layer 0 (sliding.*dca runs full-attention layers only.*sliding: flash" <<<"$msg"
then ok dca_on_sliding_layers_is_refused_with_the_fix
else fail dca_on_sliding_layers_is_refused_with_the_fix; echo "$msg"; fi
exit $status
