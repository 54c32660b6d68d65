#!/usr/bin/env bash
# `tessera profile check` on turbo profiles: the composition names each tier and how it is
# read on each backend, the memory plan counts its blocks and, on cuda, the f16 copy of a
# full layer's K and V that dca reads (1048576 cells x 2 heads x 512 x 2 bytes x K and V =
# 4096 MiB), and an impossible composition is refused naming both sides.
# usage: run_turbo_profile.sh TESSERA SOURCE_DIR OUT_DIR
set -uo pipefail
tessera=$1 src=$2 out=$3
mkdir -p "$out"
status=0
expect() { # NAME WANT_EXIT NEEDLE... -- ARGS
  local name=$1 want=$2
  shift 2
  local needles=()
  while [ "$1" != -- ]; do needles+=("$1"); shift; done
  shift
  local got rc
  got=$("$tessera" profile check "$@" 2>&1) && rc=0 || rc=$?
  for n in "${needles[@]}"; do
    if ! grep -qF -- "$n" <<<"$got"; then
      echo "FAIL $name: exit $rc, no '$n' in: $(tail -3 <<<"$got")"; status=1; return
    fi
  done
  if [ "$rc" -ne "$want" ]; then echo "FAIL $name: exit $rc, wanted $want"; status=1; return; fi
  echo "ok   $name"
}
# the 1M Gemma-4-26B-A4B profile with turbo3 on its full layers, on a file of its shape
"$tessera" gen-model --like gemma-4-26b-a4b --type q4_K_M --shape-only -o "$out/g26.gguf" >/dev/null
expect one_million_tokens_of_turbo3_are_planned 0 \
  "K turbo3 (kv_turbo 1.0.0; lift to f16, its own layout; hooks prepare_rows, prepare_q, finish_out)" \
  "KV full (1048576 cells)" "K/V lifted to f16           4096.00 MiB" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf"
# the plan's full-layer KV against f16's: 5 layers x 2 KV heads x (K + V) x 1048576 cells,
# each 512-dim row 8 blocks of 26 bytes instead of 1024 bytes
full() { "$tessera" profile check "$@" 2>&1 | awk '/KV full/ { print $(NF - 1) }'; }
t3=$(full "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf")
f16=$(full "$src/conf/gemma4-26b-a4b-1m.yaml" --set model="$out/g26.gguf")
want=$(awk 'BEGIN { printf "%.2f", 5 * 2 * 2 * (1024 - 8 * 26) }') # MiB: x 1048576 cells / 2^20
got=$(awk -v a="$f16" -v b="$t3" 'BEGIN { printf "%.2f", a - b }')
if [ -n "$t3" ] && [ "$got" = "$want" ]; then
  echo "ok   turbo3_plan_is_f16_less_the_bytes_it_saves ($f16 - $t3 MiB)"
else
  echo "FAIL turbo3_plan_is_f16_less_the_bytes_it_saves: f16 $f16, turbo3 $t3 MiB, saves $got, want $want"
  status=1
fi
expect the_cpu_reads_turbo_in_register 0 \
  "K turbo3 (kv_turbo 1.0.0; in-register through its decoder" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf" --set backend=cpu
expect flash_on_cuda_reads_turbo_pairs_with_the_codec_kernel 0 \
  "K turbo4 (kv_turbo 1.0.0; in-register by its read kernel" -- \
  "$src/conf/gemma4-26b-a4b-1m.yaml" --set model="$out/g26.gguf" --set kv.k=turbo4 \
  --set kv.v=turbo2 --set "plugins=[arch_gemma4, kv_turbo]"
expect dca_with_lifting_forbidden_is_refused 2 \
  "attention dca (attn_dca 0.2.0) reads K codec turbo3 (kv_turbo 1.0.0) on cuda only by lifting" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf" --set kv.lift=false
# kv.boundary: the first and last 2 of the 30 layers at q8_0 K/V, groups of their own by
# kind (0, 1 and 28 slide, 29 is full)
expect boundary_layers_are_a_group_of_their_own 0 \
  "sliding layers 0-1,28 (3), kv.boundary" "full    layers 29 (1), kv.boundary" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf" \
  --set "kv.boundary={layers: 2, k: q8_0, v: q8_0}"
expect a_boundary_over_every_layer_is_refused 2 \
  "kv.boundary.layers 15: the model has 30 layers that keep K/V" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf" \
  --set "kv.boundary={layers: 15, k: q8_0}"
# InnerQ: a calibration measures keys on the cpu only; a scales file must exist
expect innerq_calibration_on_cuda_is_refused 2 \
  "K codec turbo3 (kv_turbo 1.0.0) has no cuda encoder (it runs on: cpu)" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf" \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_turbo, settings: {innerq_calibrate: $out/k.iq}}]"
expect innerq_scales_file_must_exist 2 \
  "kv_turbo innerq_scales: cannot open $out/absent.iq" -- \
  "$src/conf/gemma4-26b-a4b-1m-turbo3.yaml" --set model="$out/g26.gguf" \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_turbo, settings: {innerq_scales: $out/absent.iq}}]"
rm -f "$out/g26.gguf"
exit $status
