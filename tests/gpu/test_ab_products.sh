#!/usr/bin/env bash
# ab_products.sh on the CPU with stand-in tools: a RUN_DIR whose gpu_op_parity and gpu_bench
# print what the .so they are handed (TESSERA_CUDA_BACKEND) makes them print, so every ratio
# and verdict is known. Runs in CI (no GPU).
#   test_ab_products.sh SOURCE_ROOT      prints "ok   name" / "FAIL name"
set -uo pipefail
src=$1
. "$(dirname "$0")/test_lib.sh"
cd "$src" || exit 1
mkdir -p "$tmp/run/tests/gpu" "$tmp/run/core/cli"
# a ".so" is a text file: its first line the node ms of every shape, its second PASS or FAIL
cat >"$tmp/run/tests/gpu/gpu_bench" <<'SH'
#!/usr/bin/env bash
ms=$(sed -n 1p "$TESSERA_CUDA_BACKEND")
echo "ceiling lines and the like"
echo "BENCH mat_mul q4_K 4096x4096 n=32                  wall    0.500 ms    18.8 GB/s   node    $ms ms    9.4 GB/s"
echo "BENCH mat_mul_id q4_K 768x2048 E=8/128 tokens=512  wall    1.000 ms     8.2 TFLOP/s   node    $ms ms    1.0 TFLOP/s"
SH
cat >"$tmp/run/tests/gpu/gpu_op_parity" <<'SH'
#!/usr/bin/env bash
v=$(sed -n 2p "$TESSERA_CUDA_BACKEND")
echo "$v  mat_mul w=q4_K n=17    err 1e-3 (tol 1e-2)"
echo "PASS  mat_mul w=q4_K n=64    err 1e-3 (tol 1e-2)"
SH
chmod +x "$tmp/run/tests/gpu/"*
printf '0.2000\nPASS\n' >"$tmp/a.so"
printf '0.1000\nPASS\n' >"$tmp/b"
xz -c "$tmp/b" >"$tmp/b.so.xz"
printf '0.1000\nFAIL\n' >"$tmp/bad.so"
check a_faster_b_shows_twice_as_fast_and_passes \
  'bash tests/gpu/ab_products.sh "$tmp/run" "$tmp/a.so" "$tmp/b.so.xz" "$tmp/o1" 3 >"$tmp/t1" 2>&1 &&
   grep -q "op parity B (mat_mul): 2 passed, 0 failed" "$tmp/t1" &&
   grep -q "^| mat_mul q4_K 4096x4096 n=32 | 0.2000 | 0.1000 | 2.00 |" "$tmp/t1" &&
   grep -q "^| mat_mul_id q4_K 768x2048 E=8/128 tokens=512 | 0.2000 | 0.1000 | 2.00 |" "$tmp/t1" &&
   [ "$(ls "$tmp"/o1/bench.B.*.log | wc -l)" -eq 3 ]'
check a_failing_op_parity_fails_the_run_and_still_times \
  '! bash tests/gpu/ab_products.sh "$tmp/run" "$tmp/a.so" "$tmp/bad.so" "$tmp/o2" 1 >"$tmp/t2" 2>&1 &&
   grep -q "op parity B (mat_mul): 1 passed, 1 failed" "$tmp/t2" &&
   grep -q "| 0.2000 | 0.1000 | 2.00 |" "$tmp/t2"'
check a_missing_build_is_named \
  'bash tests/gpu/ab_products.sh "$tmp/run" "$tmp/none.so" "$tmp/a.so" "$tmp/o3" >"$tmp/t3" 2>&1;
   [ $? -eq 2 ] && grep -q "cannot read $tmp/none.so" "$tmp/t3"'
exit $((fails > 0))
