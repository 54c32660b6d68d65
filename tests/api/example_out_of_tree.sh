#!/usr/bin/env bash
# examples/chat.c built out of tree the way a user builds it: install the project
# (to a staging directory), then cc with pkg-config's flags for tessera, and run it
# on the embedded default model for two turns.
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
meson install -C "$build" --destdir "$work/stage" --no-rebuild --quiet >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "FAIL: meson install"; exit 1; }
pc=$(find "$work/stage" -name tessera.pc | head -1)
[ -n "$pc" ] || { echo "FAIL: no tessera.pc was installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --define-variable=prefix="$work/stage$prefix" --cflags --libs tessera)
echo "pkg-config tessera: $flags"
# only the installed header and library: the source tree is not on the include path
cp "$src/examples/chat.c" "$work/"
(cd "$work" && cc -std=c11 -Wall -Wextra -Werror chat.c $flags -o chat)
libdir=$(pkg-config --define-variable=prefix="$work/stage$prefix" --variable=libdir tessera)
printf 'Hello\nTell me more.\n' |
  LD_LIBRARY_PATH="$libdir" "$work/chat" sampling.max_tokens=8 sampling.temperature=0 \
  >"$work/out.txt" 2>"$work/err.txt" || { cat "$work/err.txt"; echo "FAIL: the example exited $?"; exit 1; }
cat "$work/out.txt"
turns=$(grep -c '^\[8 tokens, limit\]$' "$work/out.txt" || true)
[ "$turns" = 2 ] || { echo "FAIL: expected two 8-token replies"; cat "$work/err.txt"; exit 1; }
echo "ok: the installed example chatted for two turns"
