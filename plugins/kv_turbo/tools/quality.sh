#!/usr/bin/env bash
# kv_turbo's quality table for one model (docs/QUALITY.md): mean KL against f16 K/V with
# `tessera perplexity --kl-divergence` on TEXT, the q8_0 and q4_0 controls first, then each
# turbo tier symmetric, as K (f16 V), as V (f16 K), and the mixed pairs. One markdown row
# per run on stdout; each run's full report in OUT/.
#
#   quality.sh TESSERA TEXT OUT MODEL_OR_PROFILE CTX CHUNKS [PAIRS...]
#
# MODEL_OR_PROFILE: a .gguf (with the built-in default plugins and kv_turbo, on the cpu with
# f32 activations; QUALITY_PLUGINS replaces that plugin list, e.g. to add kv_tcq) or a
# profile (.yaml, which must load the plugins of the codecs named). PAIRS: K/V pairs to run (default: the full list below);
# K/V@N:BK/BV runs K/V with kv.boundary (the first and last N layers holding K/V at BK/BV,
# - for a side the boundary leaves alone), e.g. turbo4/turbo4@1:q8_0/-.
set -uo pipefail
tessera=$1 text=$2 out=$3 model=$4 ctx=$5 chunks=$6
shift 6
mkdir -p "$out"
if [[ $model == *.yaml ]]; then
  src=(--profile "$model")
else
  # f32 products on the cpu, so that the table measures the codecs alone (the default 8-bit
  # activations recode every product's input, which moves with any KV change)
  src=(-m "$model" --set "plugins=[${QUALITY_PLUGINS:-arch_qwen, arch_gemma4, kv_turbo}]"
       --set "backend={name: cpu, activations: f32}")
fi
pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || pairs=(q8_0/q8_0 q4_0/q4_0 turbo8/turbo8 turbo4/turbo4 turbo3/turbo3
  turbo2/turbo2 turbo4/f16 turbo3/f16 turbo2/f16 f16/turbo4 f16/turbo3 f16/turbo2
  q8_0/turbo4 q8_0/turbo3 q8_0/turbo2 turbo4/turbo2 turbo4/q4_0)
run() { "$tessera" perplexity "$text" "${src[@]}" --ctx "$ctx" --chunks "$chunks" "$@"; }
[ -s "$out/base.gguf" ] || run --kl-divergence-base "$out/base.gguf" >"$out/base.log" 2>&1 ||
  { echo "base failed: $(tail -2 "$out/base.log")"; exit 1; }
echo "| K / V | PPL | mean KL (nats) | p99 KL | same top % |"
echo "| --- | --- | --- | --- | --- |"
for p in "${pairs[@]}"; do
  kv=${p%%@*} k=${kv%/*} v=${kv#*/} label="$k / $v" boundary=()
  if [[ $p == *@* ]]; then
    b=${p#*@} n=${b%%:*} bkv=${b#*:}
    bk=${bkv%/*} bv=${bkv#*/} map="layers: $n"
    [ "$bk" = - ] || map+=", k: $bk"
    [ "$bv" = - ] || map+=", v: $bv"
    boundary=(--set "kv.boundary={$map}") label+=" (boundary $n: $bk / $bv)"
  fi
  log="$out/${p//[\/@:]/_}.log"
  if run --kl-divergence "$out/base.gguf" --set kv.k="$k" --set kv.v="$v" "${boundary[@]}" \
    >"$log" 2>&1; then
    awk -v kv="$label" '
      /^PPL\(cand\)/ { ppl = $2 } /^mean KL/ { kl = $3 } /^p99 KL/ { p99 = $3 }
      /^same top/ { top = $3 }
      END { printf "| %s | %.3f | %.4g | %.3g | %.2f |\n", kv, ppl, kl, p99, top }' "$log"
  else
    echo "| $label | failed: $(tail -1 "$log") | | | |"
  fi
done
