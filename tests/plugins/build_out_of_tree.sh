#!/usr/bin/env bash
# Builds the example plugin the way a third party would: install tessera into
# a staging root, then compile against the installed header through
# pkg-config alone. Four copies: the real one, one claiming ABI 1.1 (what a
# plugin built before major 2 says), one claiming the next ABI major and one
# claiming a newer ABI minor.
# usage: build_out_of_tree.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$2"
mkdir -p "$2"
out=$(cd "$2" && pwd) # DESTDIR below is taken relative to the build dir otherwise
DESTDIR="$out/root" meson install -C "$build" --no-rebuild --quiet >/dev/null
pc=$(find "$out/root" -name tessera-plugin.pc | head -1)
[ -n "$pc" ] || { echo "tessera-plugin.pc was not installed" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR="$out/root"
cflags=$(pkg-config --cflags tessera-plugin)
# the installed headers' ABI, and the versions the skewed copies claim
abi_h=$(find "$out/root" -path '*tessera/plugin/abi.h' | head -1)
major=$(sed -n 's/^#define TSR_PLUGIN_ABI_MAJOR \([0-9]*\).*/\1/p' "$abi_h")
minor=$(sed -n 's/^#define TSR_PLUGIN_ABI_MINOR \([0-9]*\).*/\1/p' "$abi_h")
abi=$major.$minor
for variant in good:0:0:$abi abi1:-1:1:$((major - 1)).$((minor + 1)) \
               next_major:1:0:$((major + 1)).$minor newer_minor:0:1:$major.$((minor + 1)); do
  IFS=: read -r name major_skew minor_skew claims <<<"$variant"
  dir="$out/$name/example_attention"
  mkdir -p "$dir"
  cc $cflags -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
    -DEXAMPLE_ABI_MAJOR_SKEW="$major_skew" -DEXAMPLE_ABI_MINOR_SKEW="$minor_skew" \
    "$here/example_attention/example_attention.c" -o "$dir/libexample_attention.so"
  cat >"$dir/plugin.ini" <<INI
[plugin]
name = example_attention
version = 1.0.0
abi = $claims
provides = attention:1
requires =
library = libexample_attention.so
description = flash, wrapped by a third party, counting the layers it builds
INI
done
# An example plugin of the current ABI: NAME/NAME.c into good/NAME with its manifest.
# usage: example NAME PROVIDES DESCRIPTION
example() {
  local dir="$out/good/$1"
  mkdir -p "$dir"
  cc $cflags -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
    "$here/$1/$1.c" -o "$dir/lib$1.so" -lm
  printf '[plugin]\nname = %s\nversion = 1.0.0\nabi = %s\nprovides = %s\nrequires =\nlibrary = lib%s.so\ndescription = %s\n' \
    "$1" "$abi" "$2" "$1" "$3" >"$dir/plugin.ini"
}
example example_codec kv_codec:1 \
  "rot_f16 (a rotation through kv_codec hooks), scaled_f16 (per-channel scales as codec state), q8_f32 (an own block layout, read in register on cuda) and q8_f32_lift (the same, lifted)"
example example_policy decode_policy:1 \
  "V rows below a threshold skipped on decode steps, with sink and recent guards"
example example_speculator speculator:1 \
  "prompt lookup: proposes what followed the sequence's last n-gram before"
# the codec's cuda kernels where nvcc is on the machine: the same installed headers
nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
if [ -n "$nvcc" ]; then
  "$nvcc" $cflags -std=c++17 -O2 -arch=sm_90 -Xcompiler -fPIC,-fvisibility=hidden -shared \
    "$here/example_codec/example_codec_cuda.cu" -o "$out/good/example_codec/example_codec_cuda.so"
fi
echo "built the example attention, codec, policy and speculator against $(pkg-config --variable=includedir tessera-plugin)"
