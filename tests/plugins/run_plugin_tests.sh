#!/usr/bin/env bash
# Builds the out-of-tree example plugin, then runs the plugin host tests.
# usage: run_plugin_tests.sh BUILD_ROOT TEST_BINARY BAD_PLUGIN_DIR OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/build_out_of_tree.sh" "$1" "$4"
exec "$2" "$1" "$3" "$4"
