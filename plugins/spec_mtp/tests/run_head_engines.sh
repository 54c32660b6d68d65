#!/usr/bin/env bash
# Converts the Qwen3.5, Gemma 4 E2B and assistant fixtures at f32 and runs the nextn and
# assistant engine tests on them.
# usage: run_head_engines.sh TESSERA TEST_EXE FIXTURES_DIR OUT_DIR [--backend cuda]
set -euo pipefail
tessera=$1 test_exe=$2 fixtures=$3 out=$4
shift 4
mkdir -p "$out"
for f in qwen3_5 gemma4_e2b gemma4_assistant; do
  "$tessera" convert "$fixtures/$f" "$out/$f.f32.gguf" --outtype f32 >/dev/null
done
exec "$test_exe" "$@" "$out" "$out/qwen3_5.f32.gguf" "$out/gemma4_e2b.f32.gguf" \
  "$out/gemma4_assistant.f32.gguf" "$fixtures/gemma4_assistant/golden.gguf"
