#!/usr/bin/env bash
# test_sparse_v on the qwen3 and gemma4 fixtures, converted to f32 here.
# usage: run_sparse_v.sh TESSERA TEST FIXTURES OUT_DIR [--backend cuda]
set -euo pipefail
tessera=$1 test=$2 fixtures=$3 out=$4
shift 4
mkdir -p "$out"
args=()
for f in qwen3_tied gemma4_dense; do
  "$tessera" convert "$fixtures/$f" "$out/$f.f32.gguf" --outtype f32 >/dev/null
  args+=("$out/$f.f32.gguf" "$fixtures/$f/golden.gguf")
done
exec "$test" "$@" "$out" "${args[@]}"
