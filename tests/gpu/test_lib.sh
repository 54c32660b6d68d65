# The shell tests' harness, sourced: a temporary directory $tmp (removed on exit) and
# `check NAME COMMAND`, which evals COMMAND and prints "ok   NAME", or "FAIL NAME" and what it
# printed, counting the failures in $fails.
tmp=$(mktemp -d) fails=0
trap 'rm -rf "$tmp"' EXIT
check() { if eval "$2" >"$tmp/out" 2>&1; then echo "ok   $1"; else echo "FAIL $1"; cat "$tmp/out"; fails=$((fails + 1)); fi; }
