#!/bin/sh
# Download, assemble and verify the real GGUF models the reference-parity tests use.
# They go to ${TESSERA_MODEL_CACHE:-$HOME/.cache/tessera/models}; see tests/reference/real/README.md.
exec python3 "$(dirname "$0")/../tests/reference/real/fetch_models.py" "$@"
