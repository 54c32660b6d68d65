#!/usr/bin/env bash
# Installs the Debian 12 packages tessera builds and tests with, if missing.
set -euo pipefail
pkgs=(meson ninja-build gcc pkg-config python3 clang libclang-rt-14-dev valgrind libyaml-dev libinih-dev libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev curl python3-pip procps chromium chromium-driver)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
