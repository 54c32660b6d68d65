#!/usr/bin/env bash
# The main job on the embedded default model. Until the architecture plugins
# land, the default model is a small random-weight Qwen3-shaped GGUF that the
# build generates: this writes it, then reads and validates it back.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
builddir=${BUILDDIR:-build}
[ -d "$builddir" ] || meson setup "$builddir" >/dev/null
ninja -C "$builddir" >/dev/null
model="$builddir/default-model.gguf"
"$builddir/core/cli/tessera" gen-model --arch qwen3 --preset tiny --type q8_0 -o "$model"
"$builddir/core/cli/tessera" gguf info "$model"
