#!/usr/bin/env bash
# One reference fixture end to end: tessera convert (HF -> GGUF at OUTTYPE),
# then tessera parity against the fixture's golden outputs.
# usage: run_fixture.sh TESSERA FIXTURE_DIR OUT_DIR OUTTYPE [parity options...]
set -euo pipefail
tessera=$1 fixture=$2 out=$3 outtype=$4
shift 4
mkdir -p "$out"
model="$out/$(basename "$fixture").$outtype.gguf"
"$tessera" convert "$fixture" "$model" --outtype "$outtype" >/dev/null
exec "$tessera" parity "$model" "$fixture/golden.gguf" "$@"
