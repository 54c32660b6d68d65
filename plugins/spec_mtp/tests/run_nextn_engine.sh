#!/usr/bin/env bash
# Converts the Qwen3.5 fixture at f32 and runs the nextn engine test on it.
# usage: run_nextn_engine.sh TESSERA TEST_EXE FIXTURE_DIR OUT_DIR [--backend cuda]
set -euo pipefail
tessera=$1 test_exe=$2 fixture=$3 out=$4
shift 4
mkdir -p "$out"
"$tessera" convert "$fixture" "$out/qwen3_5.f32.gguf" --outtype f32 >/dev/null
exec "$test_exe" "$@" "$out" "$out/qwen3_5.f32.gguf"
