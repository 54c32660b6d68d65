#!/usr/bin/env bash
# Converts a fixture with an MTP block and a trunk-only one at f32, then runs
# the NextN head test against make_mtp_golden.py's reference.
# usage: run_nextn.sh TESSERA TEST_EXE FIXTURES_DIR NAME OUT_DIR
set -euo pipefail
tessera=$1 test_exe=$2 fixtures=$3 name=$4 out=$5
mkdir -p "$out"
"$tessera" convert "$fixtures/$name" "$out/$name.f32.gguf" --outtype f32 >/dev/null
"$tessera" convert "$fixtures/qwen3_tied" "$out/qwen3_tied.f32.gguf" --outtype f32 >/dev/null
exec "$test_exe" "$out/$name.f32.gguf" "$fixtures/$name/golden.gguf" \
  "$fixtures/$name/mtp_golden.gguf" "$out/qwen3_tied.f32.gguf"
