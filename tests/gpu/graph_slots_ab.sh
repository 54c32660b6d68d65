#!/usr/bin/env bash
# Speculative decoding on cuda with backend.graph_slots 1 (one capture kept: each change of
# graph drops it) against 8 (the default), on the GPU machine over a copy of the tree with
# RUN_DIR carried (tests/gpu/run.sh build): models/ref-gemma4-23m.gguf drafted by its trained
# assistant and by prompt lookup, 3 drafts a step, `tessera bench -p 0 -n 128 -d 512 -r 3
# --speculate` continuing PROMPT_FILE (at least 512 tokens of text), alternating, two rounds.
#   tests/gpu/graph_slots_ab.sh RUN_DIR PROMPT_FILE OUT
set -u
run=${1:?usage: $0 RUN_DIR PROMPT_FILE OUT} prompt=${2:?usage: $0 RUN_DIR PROMPT_FILE OUT}
out=${3:?usage: $0 RUN_DIR PROMPT_FILE OUT}
mkdir -p "$out"
T=$run/core/cli/tessera
for engine in assistant lookup; do
  model=""
  [ $engine = assistant ] && model=", model: $PWD/models/ref-gemma4-23m-assistant.gguf"
  printf 'model: %s\nbackend: cuda\ncontext: 4096\nplugins:\n  - arch_gemma4\n  - name: spec_mtp\n    settings: {engine: %s%s, n_max: 3, adaptive: false, p_min: 0}\nspeculator: {name: spec_mtp}\n' \
    "$PWD/models/ref-gemma4-23m.gguf" "$engine" "$model" >"$out/$engine.yaml"
  for r in 1 2; do
    for slots in 1 8; do
      TESSERA_CUDA_GRAPH_SLOTS=$slots "$T" bench --profile "$out/$engine.yaml" -p 0 -n 128 -d 512 \
        -r 3 --speculate --prompt-file "$prompt" --json "$out/$engine.s$slots.r$r.json" \
        >"$out/$engine.s$slots.r$r.txt" 2>&1
      echo "== $engine graph_slots $slots round $r"
      grep -E "tg128|speculation,|graph|rror" "$out/$engine.s$slots.r$r.txt" | head -6
    done
  done
done
