#!/usr/bin/env bash
# Builds the example plugin the way a third party would: install tessera into
# a staging root, then compile against the installed header through
# pkg-config alone. Three copies: the real one, one claiming the next ABI
# major and one claiming a newer ABI minor.
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
for variant in good:0:0:1.1 next_major:1:0:2.1 newer_minor:0:1:1.2; do
  IFS=: read -r name major minor abi <<<"$variant"
  dir="$out/$name/example_attention"
  mkdir -p "$dir"
  cc $cflags -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
    -DEXAMPLE_ABI_MAJOR_SKEW="$major" -DEXAMPLE_ABI_MINOR_SKEW="$minor" \
    "$here/example_attention/example_attention.c" -o "$dir/libexample_attention.so"
  cat >"$dir/plugin.ini" <<INI
[plugin]
name = example_attention
version = 1.0.0
abi = $abi
provides = attention:1
requires =
library = libexample_attention.so
description = flash, wrapped by a third party, counting the layers it builds
INI
done
# the example codec (kv_codec version 2 hooks), and its cuda kernels where
# nvcc is on the machine: the same installed headers, nothing else
dir="$out/good/example_codec"
mkdir -p "$dir"
cc $cflags -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
  "$here/example_codec/example_codec.c" -o "$dir/libexample_codec.so" -lm
nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
if [ -n "$nvcc" ] && [ -z "${TSR_NO_CUDA_PLUGINS:-}" ]; then
  "$nvcc" $cflags -std=c++17 -O2 -arch=sm_90 -Xcompiler -fPIC,-fvisibility=hidden -shared \
    "$here/example_codec/example_codec_cuda.cu" -o "$dir/example_codec_cuda.so"
fi
cat >"$dir/plugin.ini" <<INI
[plugin]
name = example_codec
version = 1.0.0
abi = 1.1
provides = kv_codec:2
requires =
library = libexample_codec.so
description = rot_f16 (a rotation through kv_codec hooks) and q8_f32 (an own block layout)
INI
# the example decode policy
dir="$out/good/example_policy"
mkdir -p "$dir"
cc $cflags -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
  "$here/example_policy/example_policy.c" -o "$dir/libexample_policy.so"
cat >"$dir/plugin.ini" <<INI
[plugin]
name = example_policy
version = 1.0.0
abi = 1.1
provides = decode_policy:2
requires =
library = libexample_policy.so
description = V rows below a threshold skipped on decode steps, with sink and recent guards
INI
# the example speculator
dir="$out/good/example_speculator"
mkdir -p "$dir"
cc $cflags -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
  "$here/example_speculator/example_speculator.c" -o "$dir/libexample_speculator.so"
cat >"$dir/plugin.ini" <<INI
[plugin]
name = example_speculator
version = 1.0.0
abi = 1.1
provides = speculator:2
requires =
library = libexample_speculator.so
description = prompt lookup: proposes what followed the sequence's last n-gram before
INI
echo "built the example attention, codec, policy and speculator against $(pkg-config --variable=includedir tessera-plugin)"
