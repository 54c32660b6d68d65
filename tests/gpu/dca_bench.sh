#!/usr/bin/env bash
# DCA on against off on one model, in one run: `tessera bench` at each depth with
# flash and with attn_dca on the full-attention layers (sliding layers keep flash),
# the same prefill and decode tests, then a table of DCA's tokens/s over flash's.
#
#   tests/gpu/dca_bench.sh MODEL.gguf OUT_DIR "DEPTHS" [BENCH_ARGS...]
#     DEPTHS: e.g. "32768 131072"; BENCH_ARGS default: -p 512 -n 32 -r 3
#   env: TESSERA (default build-gpu-run/core/cli/tessera), BACKEND (default cuda),
#        DCA_SETTINGS (attn_dca settings, default "{}": chunk from the model's
#        dual_chunk_attention_config, else 3/4 of its trained context),
#        DCA_ORDER (the runs in order, default "flash dca"; at least one of each, e.g.
#        "flash dca flash dca" alternates them, so that what moves from one process to the
#        next (the GPU's clocks, an MoE's expert load) shows: the table then gives each run
#        and the mean of DCA's over the mean of flash's)
#
# One `tessera bench` per profile over every depth: the sequence is filled once, each
# depth continuing the last one's fill (random tokens), and each test at a depth runs
# on top of it (the tested tokens come off again between repetitions); the JSON of
# each profile stays in OUT_DIR as flash.json and dca.json (a second run of one:
# flash.2.json, ...).
set -uo pipefail
model=$(realpath "${1:?usage: dca_bench.sh MODEL.gguf OUT_DIR "DEPTHS" [BENCH_ARGS...]}")
out=${2:?OUT_DIR}
depths=${3:?DEPTHS}
shift 3
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-p 512 -n 32 -r 3)
tessera=${TESSERA:-build-gpu-run/core/cli/tessera}
mkdir -p "$out"

common="model: $model
backend: ${BACKEND:-cuda}
plugins:
  - arch_qwen
  - arch_gemma4"
printf '%s\nattention: flash\n' "$common" >"$out/flash.yaml"
printf '%s\n  - name: attn_dca\n    settings: %s\nattention: {full: dca, sliding: flash}\n' \
  "$common" "${DCA_SETTINGS:-{\}}" >"$out/dca.yaml"

list=$(echo $depths | tr ' ' ',')
order=${DCA_ORDER:-flash dca}
declare -A runs=([flash]=0 [dca]=0)
for p in $order; do
  [ -n "${runs[$p]+set}" ] || { echo "dca_bench: DCA_ORDER names '$p' (flash, dca)" >&2; exit 2; }
  runs[$p]=$((runs[$p] + 1))
done
[ "${runs[flash]}" -ge 1 ] && [ "${runs[dca]}" -ge 1 ] ||
  { echo "dca_bench: DCA_ORDER '$order' needs a dca run and a flash run" >&2; exit 2; }
jsons=()
declare -A seen=([flash]=0 [dca]=0)
for p in $order; do
  seen[$p]=$((seen[$p] + 1))
  json=$out/$p.json
  [ "${seen[$p]}" -gt 1 ] && json=$out/$p.${seen[$p]}.json
  jsons+=("$json")
  echo "== $p at depths $list ($(date +%T))"
  if ! "$tessera" bench --profile "$out/$p.yaml" -d "$list" "${args[@]}" --json "$json"; then
    echo "dca_bench: tessera bench failed ($p)" >&2
    exit 1
  fi
done

python3 - "${jsons[@]}" <<'EOF'
import json, os, sys
runs = {"flash": [], "dca": []}
for path in sys.argv[1:]:
    runs[os.path.basename(path).split(".")[0]].append(json.load(open(path))["tests"])
def heads(name, n):
    return [f"{name} t/s ({i + 1})" for i in range(n)] if n > 1 else [f"{name} t/s"]
cols = heads("flash", len(runs["flash"])) + heads("DCA", len(runs["dca"]))
print("\n| test | " + " | ".join(cols) + " | DCA / flash |")
print("| --- | " + "--- | " * len(cols) + "--- |")
for i, first in enumerate(runs["dca"][0]):
    rows = [run[i] for p in ("flash", "dca") for run in runs[p]]
    assert all(r["test"] == first["test"] for r in rows), [r["test"] for r in rows]
    ts = {p: [run[i]["tokens_per_second_median"] for run in runs[p]] for p in runs}
    ratio = (sum(ts["dca"]) / len(ts["dca"])) / (sum(ts["flash"]) / len(ts["flash"]))
    cells = " | ".join(f"{x:.2f}" for p in ("flash", "dca") for x in ts[p])
    print(f"| {first['test']} | {cells} | {ratio:.3f} |")
EOF
