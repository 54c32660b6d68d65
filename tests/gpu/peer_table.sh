#!/usr/bin/env bash
# tessera against llama.cpp on one GPU, the same GGUF files, one after the other in one run
# (issue #31's table): llama.cpp built once per machine from a source snapshot, then every
# round runs both tools on every model.
#
#   tests/gpu/peer_table.sh RUN_DIR PEER_SRC OUT [ROUNDS]
#
# RUN_DIR: tests/gpu/run.sh build's carried tree. PEER_SRC: a llama.cpp source tree, or a
# .txz of one (its CMakeLists.txt, cmake, ggml, src, include, common, tools, vendor, app):
# built in OUT/peer with CUDA for sm_90 (llama-bench, llama-batched-bench), skipped when
# OUT/peer/bin/llama-bench exists. Models (OUT/*.gguf, made once by `tessera gen-model
# --random-codes`, which llama.cpp loads unchanged): PEER_LIKE (default "qwen3-8b
# qwen3-30b-a3b gemma-4-26b-a4b") in PEER_TYPE (q4_K_M). Tests: pp PEER_PP (512) and tg
# PEER_TG (128), flash attention on for llama.cpp, -r 3 each; then aggregate decode of
# PEER_NPL (8 32) sequences: llama-batched-bench -npp PEER_BPP (128) -ntg PEER_BTG (128)
# against `tessera bench --parallel N` with the same prompt and generated lengths. The table
# gives every round's tokens/s, the ratio of the medians and the card. PEER_GEN_ARGS adds to
# gen-model's (a cut, "--layers 1 --vocab 1024") and PEER_BACKEND (cuda) is tessera's: the
# CPU test (tests/gpu/test_peer_table.sh) runs the script with both and stand-in tools.
set -uo pipefail
cd "$(dirname "$0")/../.."
usage="usage: $0 RUN_DIR PEER_SRC OUT [ROUNDS]"
run=$(cd "${1:?$usage}" && pwd) src=${2:?$usage} out=${3:?$usage} rounds=${4:-2}
likes=${PEER_LIKE:-qwen3-8b qwen3-30b-a3b gemma-4-26b-a4b} type=${PEER_TYPE:-q4_K_M}
gen_args=${PEER_GEN_ARGS:-} backend=${PEER_BACKEND:-cuda}
pp=${PEER_PP:-512} tg=${PEER_TG:-128} npl=${PEER_NPL:-8 32} bpp=${PEER_BPP:-128} btg=${PEER_BTG:-128}
mkdir -p "$out" && out=$(cd "$out" && pwd)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH="$run/core/cli:${LD_LIBRARY_PATH:-}"
export TESSERA_CUDA_BACKEND="$run/core/cuda/libtessera-cuda.so"
tessera="$run/core/cli/tessera"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

peer="$out/peer"
if [ ! -x "$peer/bin/llama-bench" ]; then
  echo "== building llama.cpp from $src"
  tree="$src"
  if [ -f "$src" ]; then
    tree="$out/peer-src" && rm -rf "$tree" && mkdir -p "$tree" && tar -xJf "$src" -C "$tree" ||
      { echo "peer_table: cannot unpack $src" >&2; exit 1; }
  fi
  t0=$(date +%s)
  cmake -S "$tree" -B "$peer" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >"$out/peer-cmake.log" 2>&1 &&
    ninja -C "$peer" -j"$(nproc)" llama-bench llama-batched-bench >"$out/peer-build.log" 2>&1 ||
    { echo "peer_table: building llama.cpp failed; see $out/peer-*.log" >&2; tail -20 "$out/peer-build.log" >&2; exit 1; }
  echo "   built in $(( $(date +%s) - t0 )) s"
fi

for like in $likes; do
  f="$out/$like.$type.gguf"
  [ -f "$f" ] || "$tessera" gen-model --like "$like" --type "$type" --random-codes $gen_args -o "$f" \
    >"$out/gen.log" 2>&1 || { echo "peer_table: gen-model $like failed: $(tail -1 "$out/gen.log")" >&2; exit 1; }
done

# tokens/s of TEST in a markdown table on stdin: the number after its cell
rate() { awk -F'|' -v t="$1" '{for (i = 1; i < NF; i++) { c = $i; gsub(/ /, "", c);
  if (c == t) { split($(i + 1), v, " "); print v[1]; exit } } }'; }
# llama-batched-bench's aggregate decode tokens/s (S_TG) of the row with N sequences
batched_rate() { awk -F'|' -v n="$1" '$4 + 0 == n && NF > 8 {gsub(/ /, "", $9); print $9; exit}'; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
plugins="plugins=[arch_qwen, arch_gemma4]"

for r in $(seq "$rounds"); do
  for like in $likes; do
    f="$out/$like.$type.gguf"
    echo "== round $r: $like"
    "$peer/bin/llama-bench" -m "$f" -p "$pp" -n "$tg" -fa 1 -ngl 99 -r 3 >"$out/l.$like.$r" 2>"$out/l.$like.$r.err" ||
      { echo "peer_table: llama-bench failed on $f: $(tail -1 "$out/l.$like.$r.err")" >&2; exit 1; }
    "$tessera" bench -m "$f" -p "$pp" -n "$tg" -r 3 --set backend="$backend" --set "$plugins" \
      >"$out/t.$like.$r" 2>"$out/t.$like.$r.err" ||
      { echo "peer_table: tessera bench failed on $f: $(tail -1 "$out/t.$like.$r.err")" >&2; exit 1; }
    ctx=$(( (bpp + btg) * ${npl##* } + 256 ))
    "$peer/bin/llama-batched-bench" -m "$f" -c "$ctx" -b 2048 -ub 512 -npp "$bpp" -ntg "$btg" \
      -npl "$(echo $npl | tr ' ' ',')" -fa 1 -ngl 99 >"$out/lb.$like.$r" 2>"$out/lb.$like.$r.err" ||
      { echo "peer_table: llama-batched-bench failed on $f: $(tail -1 "$out/lb.$like.$r.err")" >&2; exit 1; }
    for n in $npl; do
      "$tessera" bench -m "$f" -p "$bpp" -n "$btg" -r 1 --parallel "$n" --set backend="$backend" \
        --set "$plugins" >"$out/tb.$like.$n.$r" 2>"$out/tb.$like.$n.$r.err" ||
        { echo "peer_table: tessera bench --parallel $n failed: $(tail -1 "$out/tb.$like.$n.$r.err")" >&2; exit 1; }
    done
  done
done

echo "card: ${card:-unknown}; $rounds rounds, the tools alternating; ratio = tessera / llama.cpp (medians)"
echo "| model ($type) | test | tessera | llama.cpp | ratio |"
echo "| --- | --- | ---: | ---: | ---: |"
row() { # name test tessera-rates llama-rates
  local tm lm
  tm=$(echo "$3" | median) lm=$(echo "$4" | median)
  printf '| %s | %s | %s | %s | %.2f |\n' "$1" "$2" "$(echo $3 | sed 's/ /, /g')" \
    "$(echo $4 | sed 's/ /, /g')" "$(awk -v a="$tm" -v b="$lm" 'BEGIN {print (b > 0 ? a / b : 0)}')"
}
for like in $likes; do
  for t in "pp$pp" "tg$tg"; do
    row "$like" "$t" "$(for r in $(seq "$rounds"); do rate "$t" <"$out/t.$like.$r"; done)" \
      "$(for r in $(seq "$rounds"); do rate "$t" <"$out/l.$like.$r"; done)"
  done
  for n in $npl; do
    row "$like" "decode x$n" \
      "$(for r in $(seq "$rounds"); do rate "tg${btg}x$n" <"$out/tb.$like.$n.$r"; done)" \
      "$(for r in $(seq "$rounds"); do batched_rate "$n" <"$out/lb.$like.$r"; done)"
  done
done
