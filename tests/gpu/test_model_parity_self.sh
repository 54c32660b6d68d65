#!/usr/bin/env bash
# gpu_model_parity on the cpu (--self: the second side a cpu backend with 8-bit activations):
# on a q8_0 model the two sides differ, so every layer's line is printed, some layer's
# distance is above zero, and a --max-vs-cpu bar below it fails the verdict line.
#   test_model_parity_self.sh TESSERA GPU_MODEL_PARITY FIXTURE_DIR OUT_DIR
set -uo pipefail
tessera=$1 tool=$2 fixture=$3 out=$4
mkdir -p "$out"
m="$out/$(basename "$fixture").q8_0.gguf"
"$tessera" convert "$fixture" "$m" --outtype q8_0 >/dev/null || exit 1
"$tool" "$m" "$fixture/golden.gguf" self --self --min-argmax 0 --max-kl 1 --max-vs-cpu 1e-9 >"$out/self.log"
rc=$?
cat "$out/self.log"
layers=$(grep -c '^  self layer [0-9]* *cuda vs cpu max rel' "$out/self.log")
nonzero=$(grep '^  self layer' "$out/self.log" | awk '$NF + 0 > 0' | wc -l)
[ "$rc" -eq 1 ] && [ "$layers" -ge 2 ] && [ "$nonzero" -ge 1 ] &&
  tail -1 "$out/self.log" | grep -q '^FAIL  model self .*vs cpu <= 1e-09' || { echo "FAIL"; exit 1; }
"$tool" "$m" "$fixture/golden.gguf" self --self --min-argmax 0 --max-kl 1 >"$out/self2.log" ||
  { cat "$out/self2.log"; echo "FAIL: without the bar"; exit 1; }
echo "ok: $layers layers, $nonzero apart; the bar fails it, no bar passes"
