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
# Each depth is filled once per profile (random tokens), then every test runs on top
# of it; the JSON of each run stays in OUT_DIR.
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

for d in $depths; do
  for p in flash dca; do
    echo "== $p at depth $d"
    if ! "$tessera" bench --profile "$out/$p.yaml" -d "$d" "${args[@]}" --json "$out/$p.$d.json"; then
      echo "dca_bench: tessera bench failed ($p, depth $d)" >&2
      exit 1
    fi
  done
done

python3 - "$out" $depths <<'EOF'
import json, sys
out, depths = sys.argv[1], sys.argv[2:]
print("\n| test | flash t/s | DCA t/s | DCA / flash |")
print("| --- | --- | --- | --- |")
for d in depths:
    runs = {p: json.load(open(f"{out}/{p}.{d}.json"))["tests"] for p in ("flash", "dca")}
    for f, c in zip(runs["flash"], runs["dca"]):
        a, b = f["tokens_per_second_median"], c["tokens_per_second_median"]
        print(f"| {f['test']} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
EOF
