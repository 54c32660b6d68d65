#!/usr/bin/env bash
# Fetches a real model (cached outside the repository; one that cannot be had
# fails the test with the reason), then runs a KV-cache decode test on it.
# usage: run_engine_decode_real.sh TEST_EXE MODEL_NAME GOLDEN
set -euo pipefail
test_exe=$1 name=$2 golden=$3
fetch="$(cd "$(dirname "$0")" && pwd)/../../../tests/reference/real/fetch_models.py"
python3 "$fetch" --model "$name" >&2
model=$(python3 "$fetch" --path "$name")
exec "$test_exe" "$model" "$golden"
