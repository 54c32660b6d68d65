#!/usr/bin/env bash
# Converts one Gemma 4 reference fixture at f32 with tessera convert, then runs
# the engine's KV-cache decode test on it against the fixture's golden logits.
# usage: run_engine_decode.sh TESSERA TEST_EXE FIXTURE_DIR OUT_DIR [MAX_REL_GOLDEN]
set -euo pipefail
tessera=$1 test_exe=$2 fixture=$3 out=$4
shift 4
mkdir -p "$out"
model="$out/$(basename "$fixture").engine.f32.gguf"
"$tessera" convert "$fixture" "$model" --outtype f32 >/dev/null
exec "$test_exe" "$model" "$fixture/golden.gguf" "$@"
