#!/usr/bin/env bash
# What limits a kernel, from the GPU's counters: runs tests/gpu/gpu_bench on the shapes whose
# line holds FILTER under Nsight Compute (ncu) and prints, for the kernels it profiles, the
# speed of light (DRAM and SM throughput as % of peak, duration), the launch (grid, registers,
# shared memory), occupancy (theoretical and achieved, and what limits it) and the warp
# stall reasons. On the GPU machine, over a copy of the tree with RUN_DIR carried:
#
#   tests/gpu/ncu_kernels.sh RUN_DIR FILTER [SKIP [COUNT]]
#
# SKIP (default 2) launches are passed over first, so the profiled ones run warm, then
# COUNT (default 2) are profiled: a shape's compute launches one to three kernels (the
# product or attention kernel, a split merge, the q8 path's x coding). Clocks are left
# alone (--clock-control none). TESSERA_CUDA_GEMV=f32 in the environment profiles the f32 gemv.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
b=$(cd "$1" && pwd) filter=$2 skip=${3:-2} count=${4:-2}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu_kernels: no ncu on this machine"; exit 1; }
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH="$b/core/cli:${LD_LIBRARY_PATH:-}"
export TESSERA_CUDA_BACKEND="$b/core/cuda/libtessera-cuda.so"
"$ncu" --clock-control none --launch-skip "$skip" --launch-count "$count" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --print-summary none "$b/tests/gpu/gpu_bench" "$filter"
