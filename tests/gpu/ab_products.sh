#!/usr/bin/env bash
# The product kernels of two CUDA backend builds in one machine session: op parity of the
# product cases with each, then gpu_bench's product shapes with A and B alternating, and per
# shape the median node time of each and A over B (above 1: B is faster). A build is a
# libtessera-cuda.so or an .xz of one; RUN_DIR holds the test tools (tests/gpu/run.sh build).
#
#   tests/gpu/ab_products.sh RUN_DIR SO_A SO_B OUT [ROUNDS] [FILTER]
#
# ROUNDS: of the benchmarks (default 2); FILTER: the cases and shapes whose names hold it
# (default mat_mul: every mat_mul and mat_mul_id). Exit status 1 when op parity fails with
# either build; the timings are printed all the same.
set -uo pipefail
usage="usage: $0 RUN_DIR SO_A SO_B OUT [ROUNDS] [FILTER]"
run=$(cd "${1:?$usage}" && pwd) a=${2:?$usage} b=${3:?$usage} out=${4:?$usage}
rounds=${5:-2} filter=${6:-mat_mul}
mkdir -p "$out" && out=$(cd "$out" && pwd)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH="$run/core/cli:${LD_LIBRARY_PATH:-}"
take() { # side, .so or .so.xz
  case $2 in
  *.xz) xz -dc "$2" >"$out/$1.so" ;;
  *) cp "$2" "$out/$1.so" ;;
  esac || { echo "ab_products: cannot read $2" >&2; exit 2; }
}
take A "$a"
take B "$b"
rc=0
for side in A B; do
  TESSERA_CUDA_BACKEND="$out/$side.so" "$run/tests/gpu/gpu_op_parity" "$filter" >"$out/ops.$side.log" 2>&1
  np=$(grep -c '^PASS' "$out/ops.$side.log") nf=$(grep -c '^FAIL' "$out/ops.$side.log")
  echo "op parity $side ($filter): $np passed, $nf failed"
  [ "$nf" -eq 0 ] && [ "$np" -gt 0 ] || rc=1
done
for r in $(seq "$rounds"); do
  for side in A B; do
    TESSERA_CUDA_BACKEND="$out/$side.so" "$run/tests/gpu/gpu_bench" "$filter" >"$out/bench.$side.$r.log" 2>&1 ||
      echo "gpu_bench $side round $r failed: $(tail -1 "$out/bench.$side.$r.log")"
  done
done
python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
node = {}  # shape -> side -> node ms of each round
for side in "AB":
    for r in range(1, rounds + 1):
        for line in open(f"{out}/bench.{side}.{r}.log", errors="replace"):
            m = re.match(r"BENCH (.*?)\s+wall\s+[0-9.]+ ms .*\snode\s+([0-9.]+) ms", line)
            if m:
                node.setdefault(m.group(1), {}).setdefault(side, []).append(float(m.group(2)))
print(f"| shape | A node ms | B node ms | A / B |  ({rounds} rounds, medians)")
print("| --- | ---: | ---: | ---: |")
for shape, v in node.items():
    if "A" in v and "B" in v:
        a, b = statistics.median(v["A"]), statistics.median(v["B"])
        print(f"| {shape} | {a:.4f} | {b:.4f} | {a / b:.2f} |")
PY
exit $rc
