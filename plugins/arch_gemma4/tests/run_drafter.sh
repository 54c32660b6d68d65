#!/usr/bin/env bash
# Converts the gemma4 assistant fixture and its target (gemma4_e2b) at f32 and
# runs the drafter test against the assistant's golden draft steps.
# usage: run_drafter.sh TESSERA TEST_EXE FIXTURES_DIR OUT_DIR
set -euo pipefail
tessera=$1 test_exe=$2 fixtures=$3 out=$4
mkdir -p "$out"
"$tessera" convert "$fixtures/gemma4_assistant" "$out/assistant.f32.gguf" --outtype f32 >/dev/null
"$tessera" convert "$fixtures/gemma4_e2b" "$out/e2b.f32.gguf" --outtype f32 >/dev/null
exec "$test_exe" "$out/assistant.f32.gguf" "$out/e2b.f32.gguf" "$fixtures/gemma4_assistant/golden.gguf"
