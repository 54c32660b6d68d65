#!/usr/bin/env bash
# Converts the fixtures test_dca_model runs on (f32) and runs it.
# usage: run_dca_model.sh TESSERA TEST_EXE FIXTURES_DIR OUT_DIR
set -euo pipefail
tessera=$1 test_exe=$2 fixtures=$3 out=$4
mkdir -p "$out"
models=()
for f in qwen3_tied qwen3_5 gemma4_dense gemma4_e2b; do
  "$tessera" convert "$fixtures/$f" "$out/$f.f32.gguf" --outtype f32 >/dev/null
  models+=("$out/$f.f32.gguf")
done
exec "$test_exe" "$out" "${models[@]}"
