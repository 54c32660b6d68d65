#!/usr/bin/env bash
# Real trained weights against transformers: fetch the model (cached outside
# the repository; a model that cannot be had fails the test with the reason),
# then run `tessera parity` on its golden outputs.
# usage: run_parity.sh TESSERA MODEL_NAME GOLDEN [parity options...]
set -euo pipefail
tessera=$1 name=$2 golden=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
fetch="$here/../reference/real/fetch_models.py"
python3 "$fetch" --model "$name" >&2
model=$(python3 "$fetch" --path "$name")
exec "$tessera" parity "$model" "$golden" "$@"
