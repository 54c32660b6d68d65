#!/usr/bin/env bash
# A plugin folder whose code is not written yet must say so everywhere:
# `tessera plugins` lists it as having no code, and a profile that loads it
# is refused (exit 2) with "has no code yet", never silently skipped.
# usage: check_unwritten_plugin.sh TESSERA SOURCE_ROOT NAME
set -uo pipefail
tessera=$1 root=$2 name=$3
status=0
if "$tessera" plugins | grep -E "^  $name +.*\[no code yet\]" >/dev/null; then
  echo "ok   plugins_lists_${name}_without_code"
else
  echo "FAIL plugins_lists_${name}_without_code"; status=1
fi
profile=$(mktemp --suffix=.yaml)
printf 'extends: %s/conf/default.yaml\nplugins: [arch_qwen, %s]\n' "$root" "$name" >"$profile"
out=$("$tessera" profile check "$profile" 2>&1 >/dev/null); rc=$?
rm -f "$profile"
if [ $rc -eq 2 ] && grep -q "$name.*has no code yet" <<<"$out"; then
  echo "ok   loading_${name}_is_refused"
else
  echo "FAIL loading_${name}_is_refused (exit $rc: $out)"; status=1
fi
exit $status
