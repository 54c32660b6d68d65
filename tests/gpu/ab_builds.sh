#!/usr/bin/env bash
# Two builds on the same generated model in one machine session, alternating A B A B...,
# so a change is timed against its parent on the same card: `tessera bench` of each run
# dir (tests/gpu/run.sh build makes one) on a model gen-model makes with A's tessera.
#
#   tests/gpu/ab_builds.sh RUN_A RUN_B OUT LIKE TYPE ROUNDS [BENCH ARGS...]
#   e.g. ab_builds.sh build-base-run build-run /tmp/ab qwen3-8b q4_K_M 3 -p 512 -n 128 -r 3
#
# Writes OUT/LIKE.{A,B}.N.json and prints each run's lines and, last, the medians of
# every test per build and B over A.
set -uo pipefail
a=$1 b=$2 out=$3 like=$4 type=$5 rounds=$6
shift 6
mkdir -p "$out"
for d in "$a" "$b"; do
  for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$lib"
  done
done
model="$out/$like-$type.gguf"
[ -f "$model" ] || LD_LIBRARY_PATH="$a/core/cli:${LD_LIBRARY_PATH:-}" "$a/core/cli/tessera" \
  gen-model --like "$like" --type "$type" --random-codes -o "$model" >"$out/gen.log" 2>&1 ||
  { echo "gen-model failed: $(tail -1 "$out/gen.log")"; exit 1; }
for r in $(seq "$rounds"); do
  for side in A B; do
    dir=$a; [ $side = B ] && dir=$b
    LD_LIBRARY_PATH="$dir/core/cli:${LD_LIBRARY_PATH:-}" TESSERA_CUDA_BACKEND="$dir/core/cuda/libtessera-cuda.so" \
      TESSERA_PLUGIN_PATH="$dir/plugins" "$dir/core/cli/tessera" bench -m "$model" --set backend=cuda \
      "$@" --json "$out/$like.$side.$r.json" >"$out/$like.$side.$r.log" 2>&1 ||
      echo "$side round $r failed: $(tail -2 "$out/$like.$side.$r.log")"
  done
done
python3 - "$out" "$like" <<'PY'
import glob, json, statistics, sys
out, like = sys.argv[1], sys.argv[2]
res = {}
for side in "AB":
    for f in sorted(glob.glob(f"{out}/{like}.{side}.*.json")):
        for t in json.load(open(f))["tests"]:
            res.setdefault(t["test"], {}).setdefault(side, []).append(t["tokens_per_second_median"])
print(f"{like}: per test, each round's median t/s, the median of the rounds, B/A")
for test, v in res.items():
    a, b = v.get("A", [0]), v.get("B", [0])
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"  {test:>16}  A {' '.join(f'{x:.1f}' for x in a)} -> {ma:.1f}  "
          f"B {' '.join(f'{x:.1f}' for x in b)} -> {mb:.1f}  B/A {mb / ma if ma else 0:.3f}")
PY
