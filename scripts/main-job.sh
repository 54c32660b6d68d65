#!/usr/bin/env bash
# The main job on the default model and profile: check the profile
# (composition, memory plan), then generate. Until a trained model ships, the
# default model is a small random-weight Qwen3-shaped GGUF the build
# generates, so the generated text is noise; the pipeline is the real one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
builddir=${BUILDDIR:-build}
[ -d "$builddir" ] || meson setup "$builddir" >/dev/null
ninja -C "$builddir" >/dev/null
"$builddir/core/cli/tessera" profile check conf/default.yaml
"$builddir/core/cli/tessera" run --profile conf/default.yaml -p "Once upon a time" -n 32 --temp 0
echo
