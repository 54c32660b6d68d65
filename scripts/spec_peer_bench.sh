#!/usr/bin/env bash
# Speculative decoding, tessera against llama.cpp's speculative example, on the CPU: the same
# GGUF files, prompts, threads and draft settings, one after the other in one sitting
# (issue #30's speed aim):
#   scripts/spec_peer_bench.sh TESSERA LLAMA_BIN [ROUNDS]
# TESSERA: a tessera binary (build/core/cli/tessera); LLAMA_BIN: the folder of llama.cpp's
# llama-bench and llama-speculative-simple, built for the CPU. Pairs:
#   coder    Qwen2.5-Coder 1.5B drafted by Qwen2.5-Coder 0.5B (tests/reference/real fetches
#            them into ~/.cache/tessera/models), a ChatML code prompt: draft_model /
#            llama.cpp's draft-simple
#   nextn    models/ref-qwen35-9m-mtp.gguf through its own MTP head, held-out text: nextn /
#            draft-mtp
#   gemma4   models/ref-gemma4-23m.gguf drafted by models/ref-gemma4-23m-assistant.gguf,
#            held-out text: assistant / draft-mtp (the drafter reads the target's K/V). Both
#            tools read a copy without the ordered-embedding tensors (masked_embd_*), which
#            llama.cpp's loader fails on (a shape check indexing an empty dims list); the
#            drafter then scores the whole vocabulary (python3 and gguf-py write the copy).
# Both tools draft N_MAX (3) tokens a step, every step (no early stop: p_min 0), greedy, GEN
# (128) tokens after the prompt. Each round: llama-bench tgGEN at the prompt's depth (plain),
# llama-speculative-simple once, tessera bench -r 3 --speculate (plain tgGEN and the same
# through the speculator, on the prompt). The table gives medians over rounds: plain and
# speculative tokens/s of each tool, the speedup, drafts kept / drafted, and tessera's
# speculative tokens/s over llama.cpp's. THREADS (2) sets the threads; PAIRS (coder,nextn,gemma4)
# which pairs run.
set -uo pipefail
cd "$(dirname "$0")/.."
tessera=${1:?usage: $0 TESSERA LLAMA_BIN [ROUNDS]} bin=${2:?usage: $0 TESSERA LLAMA_BIN [ROUNDS]}
rounds=${3:-1} threads=${THREADS:-2} cache=${TESSERA_MODELS:-$HOME/.cache/tessera/models}
n_max=${N_MAX:-3} gen=${GEN:-128}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

printf '<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number, with a docstring and type hints.<|im_end|>\n<|im_start|>assistant\n' >"$out/code.txt"
cat >"$out/docs.txt" <<'EOF'
The sqlite3 module provides an interface to the SQLite database. To use the module, you must first create a Connection object that represents the database. Here the data will be stored in the example.db file. Once you have a Connection, you can create a Cursor object and call its execute() method to perform SQL commands. The data you have saved is persistent and is available in subsequent sessions. Usually your SQL operations will need to use values from Python variables. You should not assemble your query using Python's string operations because doing so is insecure; it makes your program vulnerable to an SQL injection attack.
EOF


# name|target|draft (- none)|tessera engine|llama spec type|prompt|architecture plugin
pairs=("coder|$cache/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|$cache/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf|draft_model|draft-simple|code.txt|arch_qwen"
       "nextn|models/ref-qwen35-9m-mtp.gguf|-|nextn|draft-mtp|docs.txt|arch_qwen"
       "gemma4|models/ref-gemma4-23m.gguf|$out/assistant-full-head.gguf|assistant|draft-mtp|docs.txt|arch_gemma4")
wanted=",${PAIRS:-coder,nextn,gemma4},"
chosen=()
for p in "${pairs[@]}"; do
  [[ $wanted == *",${p%%|*},"* ]] && chosen+=("$p")
done
pairs=("${chosen[@]}")
[[ $wanted != *,gemma4,* ]] ||
  python3 - models/ref-gemma4-23m-assistant.gguf "$out/assistant-full-head.gguf" <<'PY' ||
import sys

import gguf
import numpy as np

src, dst = sys.argv[1:3]
r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(dst, arch=arch)
for k, f in r.fields.items():
    if k.startswith("GGUF.") or k in ("general.architecture", f"{arch}.centroid_intermediate_top_k"):
        continue
    w.add_key_value(k, f.contents(), f.types[0],
                    f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
for t in r.tensors:
    if not t.name.startswith("masked_embd"):
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY
  { echo "spec_peer_bench: cannot write the assistant's full-head copy" >&2; exit 1; }
for p in "${pairs[@]}"; do
  IFS='|' read -r name target draft _ _ _ _ <<<"$p"
  for f in "$target" ${draft#-}; do
    [ -f "$f" ] || { echo "spec_peer_bench: no $f" >&2; exit 1; }
  done
done

for r in $(seq "$rounds"); do
  for p in "${pairs[@]}"; do
    IFS='|' read -r name target draft engine type prompt arch <<<"$p"
    md=() model=""
    [ "$draft" != - ] && md=(-md "$draft") model=", model: $PWD/$draft"
    [ "$draft" != - ] && [ "${draft#/}" != "$draft" ] && model=", model: $draft"
    "$bin/llama-speculative-simple" -m "$target" "${md[@]}" -f "$out/$prompt" -n "$gen" \
      --temp 0 --top-k 1 --spec-type "$type" --spec-draft-n-max "$n_max" \
      --spec-draft-n-min "$n_max" --spec-draft-p-min 0 -t "$threads" -c 4096 \
      >"$out/ls.$name.$r.txt" 2>"$out/ls.$name.$r.err" ||
      { echo "spec_peer_bench: llama-speculative-simple failed on $name" >&2; tail -5 "$out/ls.$name.$r.err" >&2; exit 1; }
    depth=$(sed -n 's/.*encoded *\([0-9]*\) tokens.*/\1/p' "$out/ls.$name.$r.err" | head -1)
    "$bin/llama-bench" -m "$target" -p 0 -n "$gen" -d "$depth" -t "$threads" -r 3 \
      -o json >"$out/lb.$name.$r.json" 2>/dev/null ||
      { echo "spec_peer_bench: llama-bench failed on $name" >&2; exit 1; }
    target_path=$target
    [ "${target#/}" = "$target" ] && target_path=$PWD/$target
    printf 'model: %s\ncontext: 4096\nplugins:\n  - %s\n  - name: spec_mtp\n    settings: {engine: %s%s, n_max: %s, adaptive: false, p_min: 0}\nspeculator: {name: spec_mtp}\n' \
      "$target_path" "$arch" "$engine" "$model" "$n_max" >"$out/$name.yaml"
    "$tessera" bench --profile "$out/$name.yaml" -p 0 -n "$gen" -d "$depth" -r 3 -t "$threads" \
      --speculate --prompt-file "$out/$prompt" --json "$out/tb.$name.$r.json" >/dev/null 2>&1 ||
      { echo "spec_peer_bench: tessera bench failed on $name" >&2; exit 1; }
  done
done

python3 - "$out" "$rounds" "${pairs[@]}" <<'EOF'
import json, re, statistics, sys
out, rounds, pairs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
print("| pair | tessera plain | tessera spec | speedup | kept / drafted | llama.cpp plain "
      "| llama.cpp spec | speedup | kept / drafted | spec, tessera / llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for p in pairs:
    name = p.split("|")[0]
    tp, ts, tk, lp, lsp, lk = [], [], [], [], [], []
    for r in range(1, rounds + 1):
        tests = json.load(open(f"{out}/tb.{name}.{r}.json"))["tests"]
        tg = next(t for t in tests if t["kind"] == "tg")
        sp = next(t for t in tests if t["kind"] == "tg_spec")
        tp.append(tg["tokens_per_second_median"]), ts.append(sp["tokens_per_second_median"])
        tk.append((sp["speculation"]["accepted"], sp["speculation"]["drafted"]))
        lp.append(json.load(open(f"{out}/lb.{name}.{r}.json"))[0]["avg_ts"])
        err = open(f"{out}/ls.{name}.{r}.err").read()
        lsp.append(float(re.search(r"decoded +\d+ tokens in +[\d.]+ seconds, speed: +([\d.]+)", err)[1]))
        lk.append((int(re.search(r"n_accept += (\d+)", err)[1]),
                   int(re.search(r"n_drafted += (\d+)", err)[1])))
    a, b, c, d = med(tp), med(ts), med(lp), med(lsp)
    kept = lambda k: f"{sum(x for x, _ in k)} / {sum(y for _, y in k)}"
    print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {kept(tk)} | {c:.2f} | {d:.2f} | "
          f"{d / c:.2f}x | {kept(lk)} | {b / d:.2f} |")
EOF
