#!/usr/bin/env bash
# The main job on the embedded default model (models/ref-qwen3-21m.gguf,
# trained by tests/reference/train) and profile: check the profile
# (composition, memory plan), continue a sentence of the Python docs it was
# trained on, then retrieve a pass key hidden in 2,000 tokens of filler.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
builddir=${BUILDDIR:-build}
[ -d "$builddir" ] || meson setup "$builddir" >/dev/null
ninja -C "$builddir" >/dev/null
"$builddir/core/cli/tessera" profile check conf/default.yaml
"$builddir/core/cli/tessera" run --profile conf/default.yaml -p "A list comprehension" -n 32 --temp 0
echo
"$builddir/core/cli/tessera" ruler --profile conf/default.yaml --task passkey --ctx 2048 --n 5 \
  --no-chat -v
