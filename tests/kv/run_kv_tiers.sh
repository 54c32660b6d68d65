#!/usr/bin/env bash
# Converts one reference fixture at f32 with tessera convert, then measures
# every KV tier against f16 KV on its golden token sequence.
# usage: run_kv_tiers.sh TESSERA TEST_EXE FIXTURE_DIR OUT_DIR
set -euo pipefail
tessera=$1 test_exe=$2 fixture=$3 out=$4
mkdir -p "$out"
model="$out/$(basename "$fixture").kv.f32.gguf"
"$tessera" convert "$fixture" "$model" --outtype f32 >/dev/null
exec "$test_exe" "$model" "$fixture/golden.gguf"
