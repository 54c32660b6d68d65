#!/usr/bin/env bash
# sparse_v's quality table for one model (docs/QUALITY.md): mean KL against dense decoding
# with f16 K/V, `tessera perplexity --decode --kl-divergence` on TEXT (each window's scored
# half decoded a token at a time: V skipping acts on decode steps only), the q8_0 control
# first, then each setting. One markdown row per run on stdout; each run's report in OUT/.
#
#   quality.sh TESSERA TEXT OUT MODEL CTX CHUNKS [KV:SETTINGS...]
#
# MODEL: a .gguf, run on the cpu with f32 activations. KV:SETTINGS: the K/V codec and
# sparse_v's settings map, e.g. "q8_0:layers: all, threshold: 1e-4, sink: 4, recent: 16";
# "q8_0:-" runs that codec without sparse_v (the control). Default: the control, the
# auto-policy's defaults, and thresholds 1e-4, 1e-3, 1e-2, 0.05 on every layer with small
# guards (sink 4, recent 16: the text's windows are short).
set -uo pipefail
tessera=$1 text=$2 out=$3 model=$4 ctx=$5 chunks=$6
shift 6
mkdir -p "$out"
runs=("$@")
g="sink: 4, recent: 16"
[ ${#runs[@]} -gt 0 ] || runs=("q8_0:-" "q8_0:" "q8_0:layers: all, threshold: 1e-4, $g"
  "q8_0:layers: all, threshold: 1e-3, $g" "q8_0:layers: all, threshold: 1e-2, $g"
  "q8_0:layers: all, threshold: 0.05, $g")
src=(-m "$model" --set "backend={name: cpu, activations: f32}")
run() { "$tessera" perplexity "$text" "${src[@]}" --ctx "$ctx" --chunks "$chunks" --decode "$@"; }
[ -s "$out/base.gguf" ] ||
  run --set "plugins=[arch_qwen, arch_gemma4]" --kl-divergence-base "$out/base.gguf" \
    >"$out/base.log" 2>&1 || { echo "base failed: $(tail -2 "$out/base.log")"; exit 1; }
echo "| V | sparse_v | PPL | mean KL (nats) | p99 KL | same top % | V rows skipped | mass dropped a row |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
i=0
for r in "${runs[@]}"; do
  kv=${r%%:*} settings=${r#*:} i=$((i + 1))
  log="$out/run_$i.log"
  if [ "$settings" = - ]; then
    sets=(--set "plugins=[arch_qwen, arch_gemma4]") label="off"
  else
    sets=(--set "plugins=[arch_qwen, arch_gemma4, {name: sparse_v, settings: {$settings}}]"
          --set "decode_policies=[sparse_v]") label="{${settings}}"
  fi
  if run --kl-divergence "$out/base.gguf" --set kv.k="$kv" --set kv.v="$kv" "${sets[@]}" \
    >"$log" 2>&1; then
    awk -v kv="$kv" -v sv="$label" '
      /^PPL\(cand\)/ { ppl = $2 } /^mean KL/ { kl = $3 } /^p99 KL/ { p99 = $3 }
      /^same top/ { top = $3 }
      /^decode policy sparse_v, / { # "..., KIND layers: S of R V rows skipped (P%), M of a row..."
        kind = $4; sk += $6; rd += $8
        m = $0; sub(/.*\), /, "", m); sub(/ of a row.*/, "", m)
        mass = mass (mass ? " / " : "") kind " " m
      }
      END { printf "| %s | %s | %.3f | %.4g | %.3g | %.2f | %s | %s |\n", kv, sv, ppl, kl, p99, top,
                   rd ? sprintf("%d of %d (%.1f%%)", sk, rd, 100 * sk / rd) : "none",
                   mass ? mass : "-" }' "$log"
  else
    echo "| $kv | $label | failed: $(tail -1 "$log") | | | | | |"
  fi
done
