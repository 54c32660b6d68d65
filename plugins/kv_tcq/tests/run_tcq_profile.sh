#!/usr/bin/env bash
# `tessera profile check` on kv_tcq profiles: the composition names each tier and how it is
# read on each backend, the memory plan counts its blocks (1M tokens of turbo3_tcq on
# Gemma-4-26B-A4B's full layers), codebook files are read as hostile input, and the
# cpu-only settings are refused on cuda.
# usage: run_tcq_profile.sh TESSERA SOURCE_DIR OUT_DIR
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
profile=$src/conf/gemma4-26b-a4b-1m-tcq.yaml
"$tessera" gen-model --like gemma-4-26b-a4b --type q4_K_M --shape-only -o "$out/g26.gguf" >/dev/null
expect one_million_tokens_of_turbo3_tcq_are_planned 0 \
  "K turbo3_tcq (kv_tcq 1.0.0; lift to f16, its own layout; hooks prepare_rows, prepare_q, finish_out)" \
  "KV full (1048576 cells)" -- "$profile" --set model="$out/g26.gguf"
# the plan's full-layer KV against f16's: 5 layers x 2 KV heads x (K + V) x 1048576 cells,
# each 512-dim row 8 blocks of 26 bytes instead of 1024 bytes
full() { "$tessera" profile check "$@" 2>&1 | awk '/KV full/ { print $(NF - 1) }'; }
t3=$(full "$profile" --set model="$out/g26.gguf")
f16=$(full "$src/conf/gemma4-26b-a4b-1m.yaml" --set model="$out/g26.gguf")
want=$(awk 'BEGIN { printf "%.2f", 5 * 2 * 2 * (1024 - 8 * 26) }') # MiB: x 1048576 cells / 2^20
got=$(awk -v a="$f16" -v b="$t3" 'BEGIN { printf "%.2f", a - b }')
if [ -n "$t3" ] && [ "$got" = "$want" ]; then
  echo "ok   turbo3_tcq_plan_is_f16_less_the_bytes_it_saves ($f16 - $t3 MiB)"
else
  echo "FAIL turbo3_tcq_plan_is_f16_less_the_bytes_it_saves: f16 $f16, tcq $t3 MiB, saves $got, want $want"
  status=1
fi
expect the_cpu_reads_tcq_in_register 0 \
  "K turbo3_tcq (kv_tcq 1.0.0; in-register through its decoder" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu
expect flash_on_cuda_reads_tcq_pairs_with_the_codec_kernel 0 \
  "K turbo3_tcq (kv_tcq 1.0.0; in-register by its read kernel" -- \
  "$src/conf/gemma4-26b-a4b-1m.yaml" --set model="$out/g26.gguf" --set kv.k=turbo3_tcq \
  --set kv.v=turbo2_tcq --set "plugins=[arch_gemma4, kv_tcq]"
expect dca_with_lifting_forbidden_is_refused 2 \
  "attention dca (attn_dca 0.2.0) reads K codec turbo3_tcq (kv_tcq 1.0.0) on cuda only by lifting" -- \
  "$profile" --set model="$out/g26.gguf" --set kv.lift=false
expect the_f64_audit_on_cuda_is_refused 2 \
  "K codec turbo3_tcq (kv_tcq 1.0.0) has no cuda encoder (it runs on: cpu)" -- \
  "$profile" --set model="$out/g26.gguf" \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_tcq, settings: {viterbi: f64}}]"
expect dumping_on_cuda_is_refused 2 \
  "K codec turbo3_tcq (kv_tcq 1.0.0) has no cuda encoder (it runs on: cpu)" -- \
  "$profile" --set model="$out/g26.gguf" \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_tcq, settings: {dump_blocks: $out/d.bin}}]"
expect an_unwritable_dump_is_refused 2 "kv_tcq: dump_blocks: cannot write $out/no/such/dir/d.bin" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_tcq, settings: {dump_blocks: $out/no/such/dir/d.bin}}]"
rm -f "$out/fifo" && mkfifo "$out/fifo"
expect a_dump_into_a_fifo_is_refused 2 "kv_tcq: dump_blocks: cannot write $out/fifo" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_tcq, settings: {dump_blocks: $out/fifo}}]"
expect an_unknown_precision_is_refused 2 "viterbi" "f16" -- \
  "$profile" --set model="$out/g26.gguf" \
  --set "plugins=[arch_gemma4, attn_dca, {name: kv_tcq, settings: {viterbi: f16}}]"
# codebooks: the source's books load on the cpu; a malformed book is refused naming its
# file and line; the setting is the cpu's
mkdir -p "$out/books" "$out/bad"
cp "$src/plugins/kv_tcq/codebooks/"*.txt "$out/books/"
cp "$out/books/"*.txt "$out/bad/"
line=$(grep -n '^kv_tcq-codebook' "$out/bad/turbo3_tcq.txt" | cut -d: -f1)
sed -i "$((line + 3))s/.*/1.1/" "$out/bad/turbo3_tcq.txt"
cpu_books() { echo "plugins=[arch_gemma4, attn_dca, {name: kv_tcq, settings: {codebooks: $1}}]"; }
expect codebooks_load_on_the_cpu 0 "K turbo3_tcq (kv_tcq 1.0.0" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu --set "$(cpu_books "$out/books")"
expect a_malformed_codebook_is_refused_naming_its_line 2 \
  "$out/bad/turbo3_tcq.txt:$((line + 3)): '1.1' is not an f16-exact finite number" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu --set "$(cpu_books "$out/bad")"
awk 'BEGIN { printf "# "; for (i = 0; i < 5000; i++) printf "x"; print "" }' >"$out/long.txt"
cat "$out/books/turbo2_tcq.txt" >>"$out/long.txt"
mkdir -p "$out/long" && cp "$out/books/turbo3_tcq.txt" "$out/long/" && mv "$out/long.txt" "$out/long/turbo2_tcq.txt"
expect an_overlong_line_is_refused 2 "$out/long/turbo2_tcq.txt:1: a line longer than 4096 bytes" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu --set "$(cpu_books "$out/long")"
# one directory a hostile book: a wrong header, one value short, one too many, a NUL byte,
# a fifo (which must not hang the load), each refused naming what is wrong
hostile() { # NAME NEEDLE: $out/h/turbo2_tcq.txt already written
  cp "$out/books/turbo3_tcq.txt" "$out/h/"
  expect "$1" 2 "$2" -- "$profile" --set model="$out/g26.gguf" --set backend=cpu \
    --set "$(cpu_books "$out/h")"
  rm -rf "$out/h" && mkdir -p "$out/h"
}
b2=$out/books/turbo2_tcq.txt
rm -rf "$out/h" && mkdir -p "$out/h"
sed 's/^kv_tcq-codebook 1 turbo2_tcq 256$/kv_tcq-codebook 1 turbo2_tcq 512/' "$b2" >"$out/h/turbo2_tcq.txt"
hostile a_wrong_header_is_refused "expected 'kv_tcq-codebook 1 turbo2_tcq 256'"
sed '$d' "$b2" >"$out/h/turbo2_tcq.txt"
hostile a_short_book_is_refused "$out/h/turbo2_tcq.txt: 255 values, not 256"
{ cat "$b2"; echo 0.5; } >"$out/h/turbo2_tcq.txt"
hostile a_long_book_is_refused "more than 256 values"
{ head -n "$line" "$b2"; printf '0.5\0001\n'; tail -n +$((line + 2)) "$b2"; } >"$out/h/turbo2_tcq.txt"
hostile a_nul_byte_is_refused "$out/h/turbo2_tcq.txt:$((line + 1)): a NUL byte"
mkfifo "$out/h/turbo2_tcq.txt"
hostile a_fifo_is_refused "$out/h/turbo2_tcq.txt is not a regular file"
expect a_missing_codebook_is_refused 2 "kv_tcq codebooks: cannot open $out/none/turbo2_tcq.txt" -- \
  "$profile" --set model="$out/g26.gguf" --set backend=cpu --set "$(cpu_books "$out/none")"
expect codebooks_on_cuda_are_refused 2 \
  "K codec turbo3_tcq (kv_tcq 1.0.0) has no cuda encoder (it runs on: cpu)" -- \
  "$profile" --set model="$out/g26.gguf" --set "$(cpu_books "$out/books")"
rm -rf "$out/g26.gguf" "$out/d.bin" "$out/fifo" "$out/books" "$out/bad" "$out/long" "$out/h"
exit $status
