#!/usr/bin/env bash
# The main job on the default model and profile. Until the architecture
# plugins build graphs, the default model is a small random-weight
# Qwen3-shaped GGUF that the build generates: this checks the default profile
# against it (composition, memory plan) and describes the model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
builddir=${BUILDDIR:-build}
[ -d "$builddir" ] || meson setup "$builddir" >/dev/null
ninja -C "$builddir" >/dev/null
"$builddir/core/cli/tessera" profile check conf/default.yaml
"$builddir/core/cli/tessera" gguf info "$builddir/core/cli/default-model.gguf"
