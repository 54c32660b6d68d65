#!/usr/bin/env bash
# carry_parts.sh on this machine: split a file, join it back one part per simulated device
# call (stale parts of earlier calls left beside the next one), refuse a part out of turn and
# an unignored .carry/. Runs in CI (no GPU needed). Prints "ok   name" / "FAIL name".
set -uo pipefail
script=$(cd "$(dirname "$0")" && pwd)/carry_parts.sh
. "$(dirname "$0")/test_lib.sh"
mkdir -p "$tmp/repo" "$tmp/device/.carry"
cd "$tmp/repo" && git init -q . && echo "/.carry/" >>.git/info/exclude
head -c $((2 * 1048576 + 12345)) /dev/urandom >"$tmp/model.gguf"
check split_makes_three_parts 'PART_MIB=1 bash "$script" split "$tmp/model.gguf" && [ $(ls .carry/model.gguf.[0-9][0-9] | wc -l) -eq 3 ]'
cp .carry/model.gguf.meta "$tmp/device/.carry/"
# join takes the part size from NAME.meta, not from PART_MIB
join() { cp ".carry/model.gguf.$1" "$tmp/device/.carry/" && (cd "$tmp/device" && bash "$script" join model.gguf "$tmp/models"); }
check join_in_order_rebuilds_the_file 'join 00 && join 01 && join 02 | grep -q "sha256 matches" && cmp "$tmp/model.gguf" "$tmp/models/model.gguf"'
rm -f "$tmp/models/model.gguf" "$tmp/device/.carry/model.gguf.0"[12]
check a_part_out_of_turn_is_refused 'join 00 && ! join 00 && [ $(stat -c %s "$tmp/models/model.gguf") -eq 1048576 ]'
mkdir -p "$tmp/plain" && git -C "$tmp/plain" init -q .
check an_unignored_carry_folder_is_refused '! (cd "$tmp/plain" && bash "$script" split "$tmp/model.gguf")'
exit $((fails > 0))
