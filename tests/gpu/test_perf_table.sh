#!/usr/bin/env bash
# perf_table.sh and perf_table.py on this machine's CPU with every model cut to a layer and
# every test to a few tokens: each part writes its bench JSON, the table has a row per model,
# KV and test, the op-times split is printed, and llama.cpp's figure and the ratio appear
# where the test matches one of the issue's. Runs in CI (no GPU needed).
#   test_perf_table.sh SOURCE_ROOT BUILD_ROOT      prints "ok   name" / "FAIL name"
set -uo pipefail
src=$1 build=$2
. "$(dirname "$0")/test_lib.sh"
cd "$src" || exit 1
check every_part_runs_and_says_done \
  'PERF_BACKEND=cpu PERF_CUT="--layers 1 --vocab 512" PERF_CUT_MOE="--experts 4" PERF_DEPTHS="64 128" \
   PERF_PP="32,64" PERF_N=4 PERF_REPS=1 bash tests/gpu/perf_table.sh "$build" "$tmp/o" >"$tmp/log" 2>&1 &&
   grep -qx "0 failed" "$tmp/o/done" && [ ! -e "$tmp/o/q8b.gguf" ] && [ -x "$tmp/o/run/core/cli/tessera" ]'
python3 tests/gpu/perf_table.py "$tmp/o" >"$tmp/table" 2>&1
check the_table_has_each_model_kv_and_test \
  'grep -q "^| Qwen3-8B q4_K_M | f16 | pp64 |" "$tmp/table" &&
   grep -q "^| Qwen3-8B q4_K_M | q8_0 | tg4 @ d128 |" "$tmp/table" &&
   grep -q "^| Qwen3-8B bf16 | f16 | tg4 |" "$tmp/table" &&
   grep -q "^| Gemma-4-26B-A4B q4_K_M | q8_0 | tg4 @ d64 |" "$tmp/table" &&
   grep -q "^| Gemma-4-26B-A4B q4_K_M (ubatch 2048) | f16 | pp32 |" "$tmp/table" &&
   grep -q "^Qwen3-8B q4_K_M, tg32 (ms per token): .* in nodes" "$tmp/table" &&
   grep -q "mat_mul q4_K n=1" "$tmp/table" && grep -q "^BENCH flash_attn decode" "$tmp/table"'
# a test named as the issue's llama.cpp row gets its figure and the ratio
mkdir -p "$tmp/ref" && python3 - "$tmp/o/q8b.json" "$tmp/ref/q8b.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["tests"] = [dict(j["tests"][-1], test="tg128", tokens_per_second_median=108.0)]
json.dump(j, open(sys.argv[2], "w"))
PY
check llama_cpp_figure_and_ratio \
  'python3 tests/gpu/perf_table.py "$tmp/ref" | grep -q "^| Qwen3-8B q4_K_M | f16 | tg128 | 108.0 | .* | 216.0 | 0.50 |$"'
# alternating runs: each run's rate, then DCA's mean over flash's
check the_dca_part_compares_flash_and_dca \
  'DCA_ORDER="flash dca flash dca" PERF_BACKEND=cpu PERF_CUT="--layers 1 --vocab 512" PERF_CUT_MOE="--experts 4" \
   PERF_DCA_DEPTHS="64" PERF_DCA_UBATCH=32 PERF_DCA_PP=16 PERF_DCA_N=2 PERF_REPS=1 \
   bash tests/gpu/perf_table.sh "$build" "$tmp/d" dca >"$tmp/dlog" 2>&1 &&
   grep -qx "0 failed" "$tmp/d/done" &&
   [ $(grep -cE "^\| tg2 @ d64 (\| [0-9.]+ ){4}\| [0-9]\.[0-9]{3} \|$" "$tmp/dlog") -eq 2 ] &&
   [ -s "$tmp/d/dca_qwen3/dca.2.json" ] && [ -s "$tmp/d/dca_gemma/flash.2.json" ] &&
   grep -q "\"depth_fill\":[[:space:]]*\"compute\"" "$tmp/d/dca_qwen3/dca.json"'
# the DCA table's depths reached without compute, both profiles, said so
check the_dca_part_fills_positions_when_asked \
  'PERF_BACKEND=cpu PERF_CUT="--layers 1 --vocab 512" PERF_CUT_MOE="--experts 4" \
   PERF_DCA_DEPTHS="64" PERF_DCA_UBATCH=32 PERF_DCA_PP=16 PERF_DCA_N=2 PERF_REPS=1 PERF_DCA_FILL=positions \
   bash tests/gpu/perf_table.sh "$build" "$tmp/dp" dca >"$tmp/dplog" 2>&1 &&
   grep -qx "0 failed" "$tmp/dp/done" && [ $(grep -c "64 positions, filled without compute" "$tmp/dplog") -eq 4 ] &&
   grep -q "\"depth_fill\":[[:space:]]*\"positions\"" "$tmp/dp/dca_gemma/flash.json"'
check the_dca1m_part_fills_and_decodes \
  'PERF_BACKEND=cpu PERF_CUT="--layers 6 --vocab 512" PERF_CUT_MOE="--experts 4" PERF_1M_CONTEXT=512 \
   PERF_1M_DEPTH=448 PERF_1M_UBATCH=64 PERF_1M_PROGRESS=128 PERF_1M_N=2 \
   bash tests/gpu/perf_table.sh "$build" "$tmp/m" dca1m >"$tmp/mlog" 2>&1 &&
   grep -qx "0 failed" "$tmp/m/done" && grep -q "^  KV full (512 cells)" "$tmp/mlog" &&
   grep -q "attention dca (attn_dca" "$tmp/mlog" && grep -q "depth fill: 384 of 448 tokens" "$tmp/mlog" &&
   grep -q "| tg2 @ d448 " "$tmp/mlog" && grep -q "attn_dca *layers_served=9, tokens_served=450" "$tmp/mlog" &&
   [ -s "$tmp/m/dca1m.json" ] && [ ! -e "$tmp/m/g26_1m.gguf" ]'
# a fill of positions only: no progress lines, the decode at the depth, said so
check the_dca1m_part_fills_positions_when_asked \
  'PERF_BACKEND=cpu PERF_CUT="--layers 6 --vocab 512" PERF_CUT_MOE="--experts 4" PERF_1M_CONTEXT=512 \
   PERF_1M_DEPTH=448 PERF_1M_UBATCH=64 PERF_1M_PROGRESS=128 PERF_1M_N=2 PERF_1M_FILL=positions \
   bash tests/gpu/perf_table.sh "$build" "$tmp/mp" dca1m >"$tmp/mplog" 2>&1 &&
   grep -qx "0 failed" "$tmp/mp/done" && ! grep -q "depth fill: 384 of 448 tokens" "$tmp/mplog" &&
   grep -q "| tg2 @ d448 " "$tmp/mplog" && grep -q "448 positions, filled without compute" "$tmp/mplog" &&
   grep -q "\"depth_fill\":[[:space:]]*\"positions\"" "$tmp/mp/dca1m.json"'
# speculation's verify batches: pp2..pp9 and tg32 at a depth, per shape, the models removed
check the_verify_part_times_batches_of_2_to_9_rows_at_a_depth \
  'PERF_BACKEND=cpu PERF_CUT="--layers 1 --vocab 512" PERF_CUT_MOE="--experts 4" PERF_REPS=1 \
   PERF_VERIFY_DEPTH=64 bash tests/gpu/perf_table.sh "$build" "$tmp/v" verify >"$tmp/vlog" 2>&1 &&
   grep -qx "0 failed" "$tmp/v/done" && grep -q "| pp9 @ d64 " "$tmp/vlog" &&
   grep -q "| tg32 @ d64 " "$tmp/vlog" && [ -s "$tmp/v/verify_qwen3.json" ] &&
   [ -s "$tmp/v/verify_gemma.json" ] && [ ! -e "$tmp/v/verify_qwen3.gguf" ]'
check the_ncu_part_names_a_missing_ncu \
  '! PERF_BACKEND=cpu PATH=/usr/bin:/bin bash tests/gpu/perf_table.sh "$build" "$tmp/n" ncu >"$tmp/nlog" 2>&1 &&
   grep -qx "5 failed" "$tmp/n/done" && grep -q "^FAIL ncu flash_attn decode f16 kv=32768 D=128: ncu_kernels: no ncu" "$tmp/nlog"'
check an_unknown_part_fails \
  '! PERF_BACKEND=cpu bash tests/gpu/perf_table.sh "$build" "$tmp/x" nothing && grep -qx "1 failed" "$tmp/x/done"'
exit $((fails > 0))
