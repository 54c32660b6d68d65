#!/usr/bin/env bash
# DCA on against off on one model, in one run: `tessera bench` at each depth with
# flash and with attn_dca on the full-attention layers (sliding layers keep flash),
# the same prefill and decode tests, then a table of DCA's tokens/s over flash's.
#
#   tests/gpu/dca_bench.sh MODEL.gguf OUT_DIR "DEPTHS" [BENCH_ARGS...]
#     DEPTHS: e.g. "32768 131072"; BENCH_ARGS default: -p 512 -n 32 -r 3
#   env: TESSERA (default build-gpu-run/core/cli/tessera), BACKEND (default cuda),
#        DCA_SETTINGS (attn_dca settings, default "{}": chunk from the model's
#        dual_chunk_attention_config, else 3/4 of its trained context)
#
# One `tessera bench` per profile over every depth: the sequence is filled once, each
# depth continuing the last one's fill (random tokens), and each test at a depth runs
# on top of it (the tested tokens come off again between repetitions); the JSON of
# each profile stays in OUT_DIR as flash.json and dca.json.
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
for p in flash dca; do
  echo "== $p at depths $list"
  if ! "$tessera" bench --profile "$out/$p.yaml" -d "$list" "${args[@]}" --json "$out/$p.json"; then
    echo "dca_bench: tessera bench failed ($p)" >&2
    exit 1
  fi
done

python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
runs = {p: json.load(open(f"{out}/{p}.json"))["tests"] for p in ("flash", "dca")}
print("\n| test | flash t/s | DCA t/s | DCA / flash |")
print("| --- | --- | --- | --- |")
for f, c in zip(runs["flash"], runs["dca"]):
    assert f["test"] == c["test"], (f["test"], c["test"])
    a, b = f["tokens_per_second_median"], c["tokens_per_second_median"]
    print(f"| {f['test']} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
EOF
