#!/usr/bin/env bash
# peer_table.sh on this machine's CPU: tessera's side for real (gen-model files cut to a
# layer, `tessera bench` on the cpu), llama.cpp's by stand-in llama-bench and
# llama-batched-bench that print llama.cpp's tables with known rates, so the build is
# skipped and every ratio is known: the table has each model's pp, tg and decode rows, the
# stand-in's rates in them, and tessera / llama.cpp of the medians. Runs in CI (no GPU).
#   test_peer_table.sh SOURCE_ROOT BUILD_ROOT      prints "ok   name" / "FAIL name"
set -uo pipefail
src=$1 build=$2
. "$(dirname "$0")/test_lib.sh"
cd "$src" || exit 1
mkdir -p "$tmp/o/peer/bin"
# llama-bench: pp 1000 t/s, tg 100 t/s whatever the model (-p/-n read from the arguments)
cat >"$tmp/o/peer/bin/llama-bench" <<'SH'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do case $1 in -p) p=$2; shift;; -n) n=$2; shift;; esac; shift; done
echo "| model | size | params | backend | ngl | fa | test | t/s |"
echo "| --- | ---: | ---: | --- | --: | -: | --: | ---: |"
echo "| qwen3 8B Q4_K - Medium | 1.00 GiB | 1.00 B | CUDA | 99 | 1 | pp$p | 1000.00 ± 1.00 |"
echo "| qwen3 8B Q4_K - Medium | 1.00 GiB | 1.00 B | CUDA | 99 | 1 | tg$n | 100.00 ± 0.50 |"
SH
# llama-batched-bench: aggregate decode 50 t/s per sequence (-npl read from the arguments)
cat >"$tmp/o/peer/bin/llama-batched-bench" <<'SH'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do case $1 in -npl) npl=$2; shift;; esac; shift; done
echo "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"
echo "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|"
for b in ${npl//,/ }; do
  printf '|    16 |      4 | %4d |    100 |    0.010 |  1000.00 |    0.100 | %8.2f |    0.110 |   100.00 |\n' "$b" "$((50 * b))"
done
SH
chmod +x "$tmp/o/peer/bin/"*
check the_script_runs_both_sides \
  'PEER_BACKEND=cpu PEER_GEN_ARGS="--layers 1 --vocab 512" PEER_LIKE="qwen3-8b" PEER_TYPE=q8_0 \
   PEER_PP=32 PEER_TG=4 PEER_NPL="2 3" PEER_BPP=16 PEER_BTG=4 \
   bash tests/gpu/peer_table.sh "$build" /nonexistent-source "$tmp/o" 2 >"$tmp/table" 2>&1 &&
   [ -f "$tmp/o/qwen3-8b.q8_0.gguf" ]'
# the ratio column is tessera over the stand-in's rate, from the rounds the row lists
ratio_ok() { # test, llama.cpp rate
  python3 - "$tmp/table" "$1" "$2" <<'PY'
import statistics, sys
table, test, peer = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = [[c.strip() for c in l.split("|")[1:-1]] for l in open(table) if l.startswith("| qwen3-8b |")]
row = next(r for r in rows if r[1] == test)
ours = statistics.median(float(x) for x in row[2].split(", "))
sys.exit(0 if ours > 0 and abs(float(row[4]) - ours / peer) <= 0.006 * ours / peer + 0.005 else 1)
PY
}
check the_table_has_each_row_and_its_ratio \
  'grep -q "^| qwen3-8b | pp32 | .* | 1000.00, 1000.00 |" "$tmp/table" &&
   grep -q "^| qwen3-8b | tg4 | .* | 100.00, 100.00 |" "$tmp/table" &&
   grep -q "^| qwen3-8b | decode x3 | .* | 150.00, 150.00 |" "$tmp/table" &&
   ratio_ok pp32 1000 && ratio_ok tg4 100 && ratio_ok "decode x2" 100 && ratio_ok "decode x3" 150'
check a_failing_peer_is_named \
  'printf "#!/bin/sh\necho broken >&2; exit 1\n" >"$tmp/o/peer/bin/llama-bench" &&
   ! PEER_BACKEND=cpu PEER_LIKE="qwen3-8b" PEER_TYPE=q8_0 PEER_PP=32 PEER_TG=4 PEER_NPL=2 \
     PEER_BPP=16 PEER_BTG=4 bash tests/gpu/peer_table.sh "$build" /nonexistent "$tmp/o" 1 >"$tmp/e" 2>&1 &&
   grep -q "llama-bench failed on .*qwen3-8b.q8_0.gguf: broken" "$tmp/e"'
echo "$fails failed"
[ "$fails" -eq 0 ]
