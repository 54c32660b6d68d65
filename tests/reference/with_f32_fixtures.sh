#!/usr/bin/env bash
# Runs TEST on the qwen3 and gemma4 reference fixtures, converted to f32 here (plugin tests
# that run whole models through the engine: kv_turbo's, sparse_v's).
# usage: with_f32_fixtures.sh TESSERA TEST FIXTURES OUT_DIR [TEST_FLAG...]
#   -> TEST [TEST_FLAG...] OUT_DIR qwen3_tied.f32.gguf GOLDEN gemma4_dense.f32.gguf GOLDEN
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
