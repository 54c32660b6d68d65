#!/usr/bin/env bash
# The CUDA backend's benchmark table (docs/PERFORMANCE.md) in one run on the GPU machine:
# generated models in real shapes (random codes: seconds to make), `tessera bench` on each
# with --json, then tests/gpu/perf_table.py OUT prints the table against the ceilings and
# llama.cpp's figures on the same GPU.
#
#   tests/gpu/perf_table.sh RUN_DIR OUT [PART...]
#
# Parts (all by default, in this order):
#   q8b      Qwen3-8B shape q4_K_M: pp2048 pp32768 tg128; tg128 at each depth with f16 KV and
#            with q8_0 KV; then pp2048 and tg32 with --op-times (where the time goes), and tg128
#            without the defaults' q8 gemv (TESSERA_CUDA_GEMV=f32), CUDA graphs
#            (TESSERA_CUDA_GRAPHS=0), and either; tg128 at 0 and each depth with attention's
#            opt-in pipelined tile loop (TESSERA_CUDA_ATTN_PIPELINE=1; f16 and q8_0 KV) and
#            with decode splits of 64 keys (TESSERA_CUDA_ATTN_SPLIT_KEYS=64)
#   q8b_bf16 the same shape in bf16: pp2048 tg128
#   g26      Gemma-4-26B-A4B shape q4_K_M: pp2048 (ubatch 512, and 2048 as the 1M run's) and
#            tg128 at 0, tg128 at each depth, f16 and q8_0 KV; tg32
#            and pp2048 with --op-times, tg128 without the q8 gemv, graphs, either; tg128 with
#            the pipelined attention and with splits of 64 keys
#   kernels  tests/gpu/gpu_bench: the attention and product kernels alone (node times); the
#            products with the f32 gemv, the attention with the pipelined tile loop, the
#            decode attention with splits of 64 keys, on the tile kernels
#            (TESSERA_CUDA_ATTN_GQA_DECODE=0) and on the GQA decode kernel never staged (=1)
#   turbo    (not in the default list) kv_turbo: the Qwen3-8B and Gemma-4-26B-A4B shapes in
#            q4_K_M, pp2048 and tg64 at 0 and each depth (filled by positions) with f16, q8_0,
#            turbo3 and turbo4 K/V (PERF_TURBO_KV, PERF_TURBO_N, PERF_TURBO_LIKE; kv_tcq's tiers
#            may be named too); those of
#            PERF_TURBO_UNSTAGED again with TESSERA_CUDA_ATTN_GQA_DECODE=1
#   sparse   (not in the default list) sparse_v: the Gemma-4-26B-A4B shape in q4_K_M with q8_0
#            K/V, decode (tg PERF_SPARSE_N, 32) at each of PERF_SPARSE_DEPTHS (65536 131072
#            262144) without the plugin and with it (its defaults: the auto-policy's 0.05 on the
#            full layers), the depths filled by compute in ubatches of 2048 (a cache of
#            positions alone holds zeros: uniform attention, nothing to skip); its counters
#            (rows skipped, mass dropped) in the log
#   dca      (not in the default list) DCA on against off, tests/gpu/dca_bench.sh, on the
#            Qwen3-8B and Gemma-4-26B-A4B shapes in q4_0 at each of PERF_DCA_DEPTHS (the
#            issue's 32768 131072 262144): pp512 and tg32, one fill to the deepest per profile
#            in ubatches of PERF_DCA_UBATCH (2048: a quarter of the expert products' launches);
#            DCA_ORDER="flash dca flash dca" (dca_bench.sh) alternates the profiles;
#            PERF_DCA_FILL=positions reaches the depths without computing them
#   dca1m    (not in the default list) issue #9's 1M run: the Gemma-4-26B-A4B shape in q4_K_M
#            with conf/gemma4-26b-a4b-1m-dca.yaml (DCA on the 5 full layers, q8_0 K / q4_0 V):
#            its composition and memory plan (profile check), then one fill of
#            PERF_1M_DEPTH (1048544) tokens in ubatches of PERF_1M_UBATCH (2048),
#            a progress line every PERF_1M_PROGRESS (65536), then PERF_1M_N (32) decode steps
#            at 1M and the device memory at its peak, into OUT/dca1m.json (PERF_1M_CONTEXT
#            overrides the profile's context, for the CPU test; PERF_1M_FILL=positions fills
#            the depth without compute, tessera bench --depth-fill positions: the decode at
#            1M without the fill's 25 minutes, said so in the output; PERF_1M_PROFILE runs
#            another profile of that model, e.g. conf/gemma4-26b-a4b-1m-tcq.yaml)
#   verify   (not in the default list) speculation's verify batches: the Qwen3-8B and
#            Gemma-4-26B-A4B shapes in q4_K_M, pp2..pp9 and tg32 at PERF_VERIFY_DEPTH (4096,
#            filled by positions): a batch of k + 1 rows against k + 1 single steps
#   ncu      (not in the default list) tests/gpu/ncu_kernels.sh on the kernels of the missed
#            bars (flash decode f16 and q8_0 at 32k, the q4_K gemv at 4096x4096, flash
#            prefill at D 128 and 512) into OUT/ncu_*.log
# A run of several parts lasts past one 10-minute device command: start it detached,
#   mkdir -p OUT && setsid nohup bash tests/gpu/perf_table.sh RUN_DIR OUT >OUT/log 2>&1 &
# and read OUT/log in later commands. RUN_DIR is copied into OUT first, so the next
# command's carry cannot replace what runs. OUT/done is written last.
# Environment (the CPU test shrinks everything): PERF_BACKEND (cuda), PERF_CUT (extra
# gen-model arguments, e.g. "--layers 1"), PERF_CUT_MOE (more of them for the MoE model,
# e.g. "--experts 4"), PERF_DEPTHS ("32768 131072"), PERF_PP ("2048,32768"), PERF_N (128),
# PERF_REPS (3), PERF_DCA_DEPTHS ("32768 131072 262144"), PERF_DCA_PP (512), PERF_DCA_N (32),
# PERF_DCA_UBATCH (2048), PERF_DCA_FILL (compute).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }
src=$1 out=$2
shift 2
parts=${*:-q8b q8b_bf16 g26 kernels}
backend=${PERF_BACKEND:-cuda} cut=${PERF_CUT:-} depths=${PERF_DEPTHS:-32768 131072}
pp=${PERF_PP:-2048,32768} n=${PERF_N:-128} reps=${PERF_REPS:-3}
[ -x "$src/core/cli/tessera" ] || { echo "perf_table: no $src/core/cli/tessera" >&2; exit 1; }
mkdir -p "$out" && rm -f "$out/done" && rm -rf "$out/run" && cp -r "$src" "$out/run" || exit 1
b=$out/run
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH="$b/core/cli:${LD_LIBRARY_PATH:-}"
export TESSERA_CUDA_BACKEND="$b/core/cuda/libtessera-cuda.so"
fails=0

# bench NAME MODEL ARGS...: one tessera bench into OUT/NAME.json (its table into the log)
bench() {
  local name=$1 model=$2
  shift 2
  echo "== $name: tessera bench $* ($(date +%T))"
  if ! "$b/core/cli/tessera" bench ${model:+-m "$model"} --set backend="$backend" "$@" \
       --json "$out/$name.json"; then
    echo "FAIL $name"
    fails=$((fails + 1))
  fi
}

# gen NAME ARGS...: a generated model at OUT/NAME.gguf
gen() {
  local name=$1
  shift
  echo "== gen-model $* $cut ($(date +%T))"
  "$b/core/cli/tessera" gen-model "$@" $cut -o "$out/$name.gguf" || { fails=$((fails + 1)); return 1; }
}

# at_depths NAME MODEL REPS WARMUP: tg at each depth, f16 KV then q8_0 KV
at_depths() {
  local name=$1 model=$2 list
  list=$(echo "$depths" | tr ' ' ',')
  bench "$name.f16kv" "$model" -p 0 -n "$n" -d "$list" -r "$3" --warmup "$4"
  bench "$name.q8kv" "$model" -p 0 -n "$n" -d "$list" -r "$3" --warmup "$4" \
    --set kv.k=q8_0 --set kv.v=q8_0
}

# extras NAME MODEL [DEPTHS]: where a decode step's time goes; the decode test without what
# the defaults add (the q8 gemv, CUDA graphs, either), for what each buys; with attention's
# opt-in pipelined tile loop (TESSERA_CUDA_ATTN_PIPELINE=1) and with decode splits of 64 keys
# (TESSERA_CUDA_ATTN_SPLIT_KEYS=64, against the default 256), at depth 0 and DEPTHS
extras() {
  local name=$1 model=$2 pipe_depths=0${3:+,$3}
  bench "$name.optimes" "$model" -p "${pp%%,*}" -n 32 -r 1 --op-times
  [ "$backend" = cuda ] || return 0
  TESSERA_CUDA_GEMV=f32 bench "$name.gemvf32" "$model" -p 0 -n "$n" -r "$reps"
  TESSERA_CUDA_GRAPHS=0 bench "$name.nographs" "$model" -p 0 -n "$n" -r "$reps"
  TESSERA_CUDA_GEMV=f32 TESSERA_CUDA_GRAPHS=0 bench "$name.neither" "$model" -p 0 -n "$n" -r "$reps"
  TESSERA_CUDA_ATTN_PIPELINE=1 bench "$name.attnpipe" "$model" -p 0 -n "$n" -d "$pipe_depths" \
    -r "$reps"
  # with q8_0 KV too: the pipelined loop stages q8_0 tiles a quarter block per thread
  TESSERA_CUDA_ATTN_PIPELINE=1 bench "$name.attnpipe_q8kv" "$model" -p 0 -n "$n" \
    -d "$pipe_depths" -r "$reps" --set kv.k=q8_0 --set kv.v=q8_0
  TESSERA_CUDA_ATTN_SPLIT_KEYS=64 bench "$name.split64" "$model" -p 0 -n "$n" -d "$pipe_depths" \
    -r "$reps"
}

for part in $parts; do
  case $part in
  q8b)
    gen q8b --like qwen3-8b --type q4_K_M --random-codes || continue
    bench q8b "$out/q8b.gguf" -p "$pp" -n "$n" -r "$reps"
    at_depths q8b "$out/q8b.gguf" "$reps" 1
    extras q8b "$out/q8b.gguf" "$(echo "$depths" | tr " " ",")"
    rm -f "$out/q8b.gguf"
    ;;
  q8b_bf16)
    gen q8b_bf16 --like qwen3-8b --type bf16 || continue
    bench q8b_bf16 "$out/q8b_bf16.gguf" -p "${pp%%,*}" -n "$n" -r "$reps"
    rm -f "$out/q8b_bf16.gguf"
    ;;
  g26)
    gen g26 --like gemma-4-26b-a4b --type q4_K_M --random-codes ${PERF_CUT_MOE:-} || continue
    bench g26 "$out/g26.gguf" -p "${pp%%,*}" -n "$n" -r "$reps"
    # prefill in ubatches of 2048, the 1M run's (docs/PERFORMANCE.md)
    bench g26.ub2048 "$out/g26.gguf" -p "${pp%%,*}" -n 0 -r "$reps" --set ubatch=2048 \
      --set batch=2048
    # the sliding ring keeps window + ubatch positions, so a repetition's 128 tokens come
    # off again without a refill, as on Qwen3
    at_depths g26 "$out/g26.gguf" "$reps" 1
    extras g26 "$out/g26.gguf"
    rm -f "$out/g26.gguf"
    ;;
  kernels)
    echo "== gpu_bench ($(date +%T))"
    if [ "$backend" = cuda ]; then
      "$b/tests/gpu/gpu_bench" | tee "$out/kernels.log" || fails=$((fails + 1))
      TESSERA_CUDA_GEMV=f32 "$b/tests/gpu/gpu_bench" "mat_mul" | tee "$out/kernels_gemvf32.log" ||
        fails=$((fails + 1))
      TESSERA_CUDA_ATTN_PIPELINE=1 "$b/tests/gpu/gpu_bench" "flash_attn" |
        tee "$out/kernels_attnpipe.log" || fails=$((fails + 1))
      TESSERA_CUDA_ATTN_SPLIT_KEYS=64 "$b/tests/gpu/gpu_bench" "flash_attn decode" |
        tee "$out/kernels_split64.log" || fails=$((fails + 1))
      TESSERA_CUDA_ATTN_GQA_DECODE=0 "$b/tests/gpu/gpu_bench" "flash_attn decode" |
        tee "$out/kernels_tile_decode.log" || fails=$((fails + 1))
      TESSERA_CUDA_ATTN_GQA_DECODE=1 "$b/tests/gpu/gpu_bench" "flash_attn decode" |
        tee "$out/kernels_gqa_unstaged.log" || fails=$((fails + 1))
    else
      "$b/tests/gpu/gpu_bench" --cpu "decode f16 kv=4096" | tee "$out/kernels.log" || fails=$((fails + 1))
    fi
    ;;
  turbo)
    # kv_turbo against the scalar caches on the same file: decode at each depth (filled by
    # positions) and prefill, f16, q8_0, turbo3 and turbo4 K/V (PERF_TURBO_KV), on each of
    # PERF_TURBO_LIKE
    for like in ${PERF_TURBO_LIKE:-qwen3-8b gemma-4-26b-a4b}; do
      m=turbo_${like%%-*}
      [ "$like" = gemma-4-26b-a4b ] && extra=${PERF_CUT_MOE:-} || extra=
      gen "$m" --like "$like" --type q4_K_M --random-codes $extra || continue
      for kv in ${PERF_TURBO_KV:-f16 q8_0 turbo3 turbo4}; do
        printf 'model: %s\nbackend: %s\nkv: {k: %s, v: %s}\nplugins: [arch_qwen, arch_gemma4, kv_turbo, kv_tcq]\n' \
          "$out/$m.gguf" "$backend" "$kv" "$kv" >"$out/$m.$kv.yaml"
        bench "$m.$kv" "" --profile "$out/$m.$kv.yaml" -p "${pp%%,*}" -n "${PERF_TURBO_N:-64}" \
          -d "0,$(echo "$depths" | tr ' ' ',')" -r "$reps" --depth-fill positions
      done
      # the same profiles with the GQA decode kernel never staged, for what staging buys
      for kv in ${PERF_TURBO_UNSTAGED:-}; do
        TESSERA_CUDA_ATTN_GQA_DECODE=1 bench "$m.$kv.unstaged" "" --profile "$out/$m.$kv.yaml" \
          -p "${pp%%,*}" -n "${PERF_TURBO_N:-64}" -d "0,$(echo "$depths" | tr ' ' ',')" -r "$reps" \
          --depth-fill positions
      done
      rm -f "$out/$m.gguf"
    done
    ;;
  sparse)
    m=sparse_gemma
    gen "$m" --like gemma-4-26b-a4b --type q4_K_M --random-codes ${PERF_CUT_MOE:-} || continue
    sdepths=$(echo "${PERF_SPARSE_DEPTHS:-65536 131072 262144}" | tr ' ' ',')
    for pol in dense sparse_v; do
      { printf 'model: %s\nbackend: %s\ncontext: 270336\nubatch: 2048\nbatch: 2048\n' \
          "$out/$m.gguf" "$backend"
        printf 'kv: {k: q8_0, v: q8_0}\nplugins: [arch_gemma4%s]\n' \
          "$([ "$pol" = sparse_v ] && echo ", sparse_v")"
        [ "$pol" = sparse_v ] && printf 'decode_policies: [sparse_v]\n'; } >"$out/$m.$pol.yaml"
      bench "$m.$pol" "" --profile "$out/$m.$pol.yaml" -p 0 -n "${PERF_SPARSE_N:-32}" \
        -d "$sdepths" -r "$reps" --warmup 1
    done
    rm -f "$out/$m.gguf"
    ;;
  dca)
    for like in qwen3-8b gemma-4-26b-a4b; do
      m=dca_${like%%-*}
      [ "$like" = gemma-4-26b-a4b ] && extra=${PERF_CUT_MOE:-} || extra=
      gen "$m" --like "$like" --type q4_0 --random-codes $extra || continue
      echo "== dca_bench $like ($(date +%T))"
      TESSERA="$b/core/cli/tessera" BACKEND=$backend bash tests/gpu/dca_bench.sh "$out/$m.gguf" \
        "$out/$m" "${PERF_DCA_DEPTHS:-32768 131072 262144}" -p "${PERF_DCA_PP:-512}" \
        -n "${PERF_DCA_N:-32}" -r "$reps" --set ubatch="${PERF_DCA_UBATCH:-2048}" \
        --set batch="${PERF_DCA_UBATCH:-2048}" --depth-fill "${PERF_DCA_FILL:-compute}" ||
        fails=$((fails + 1))
      rm -f "$out/$m.gguf"
    done
    ;;
  verify)
    # what a speculation step's verify batch of k + 1 rows costs against k + 1 decode steps:
    # pp2..pp9 and tg at PERF_VERIFY_DEPTH (4096), filled by positions, per shape
    for like in qwen3-8b gemma-4-26b-a4b; do
      m=verify_${like%%-*}
      [ "$like" = gemma-4-26b-a4b ] && extra=${PERF_CUT_MOE:-} || extra=
      gen "$m" --like "$like" --type q4_K_M --random-codes $extra || continue
      bench "$m" "$out/$m.gguf" -p 2,3,4,5,6,7,8,9 -n 32 -d "${PERF_VERIFY_DEPTH:-4096}" \
        -r "$reps" --depth-fill positions
      rm -f "$out/$m.gguf"
    done
    ;;
  ncu)
    # the counters of the kernels whose bars PERFORMANCE.md says are missed
    for f in "flash_attn decode f16 kv=32768 D=128" "flash_attn decode q8_0 kv=32768" \
             "mat_mul q4_K 4096x4096 n=1" "flash_attn prefill f16 q=4096 kv=32768" \
             "flash_attn prefill f16 q=2048 kv=32768 D=512"; do
      echo "== ncu $f ($(date +%T))"
      bash tests/gpu/ncu_kernels.sh "$b" "$f" >"$out/ncu_$(echo "$f" | tr -c 'A-Za-z0-9\n' _).log" 2>&1 ||
        { echo "FAIL ncu $f: $(tail -1 "$out/ncu_$(echo "$f" | tr -c 'A-Za-z0-9\n' _).log")"; fails=$((fails + 1)); }
    done
    ;;
  dca1m)
    gen g26_1m --like gemma-4-26b-a4b --type q4_K_M --random-codes ${PERF_CUT_MOE:-} || continue
    ub=${PERF_1M_UBATCH:-2048}
    sets=(--set model="$(cd "$out" && pwd)/g26_1m.gguf" --set backend="$backend" --set ubatch="$ub"
          --set batch="$ub" ${PERF_1M_CONTEXT:+--set context=$PERF_1M_CONTEXT})
    profile=${PERF_1M_PROFILE:-conf/gemma4-26b-a4b-1m-dca.yaml}
    echo "== dca1m: $profile, the composition and memory plan ($(date +%T))"
    "$b/core/cli/tessera" profile check "$profile" "${sets[@]}" |
      sed -n '/^composition/,$p' || fails=$((fails + 1))
    echo "== dca1m ($(date +%T))"
    if ! "$b/core/cli/tessera" bench --profile "$profile" "${sets[@]}" \
         -p 0 -n "${PERF_1M_N:-32}" -d "${PERF_1M_DEPTH:-1048544}" -r 1 --warmup 0 \
         --progress "${PERF_1M_PROGRESS:-65536}" --depth-fill "${PERF_1M_FILL:-compute}" \
         --json "$out/dca1m.json"; then
      echo "FAIL dca1m"
      fails=$((fails + 1))
    fi
    rm -f "$out/g26_1m.gguf"
    ;;
  *) echo "perf_table: unknown part '$part' (q8b q8b_bf16 g26 kernels sparse dca dca1m ncu verify)"; fails=$((fails + 1)) ;;
  esac
done
echo "$fails failed" | tee "$out/done"
[ "$fails" -eq 0 ]
