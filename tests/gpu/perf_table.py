"""The benchmark table of tests/gpu/perf_table.sh's OUT folder, in markdown.

usage: perf_table.py OUT

One row per (model, KV, test) from OUT/*.json (tessera bench --json): tokens/s, what
the model's size and shape imply it achieved (bytes/s for decode, FLOP/s for prefill)
as a fraction of the ceilings that bench measured, and, where the issue names one,
llama.cpp's figure on the same H200 with tessera's ratio to it. Then each --op-times
run's split of a decode step, and the kernel lines of gpu_bench.
"""
import glob
import json
import os
import sys

# llama.cpp (CUDA, sm_90, flash attention on) on the H200, random-weight Qwen3-8B shape
LLAMA_CPP = {
    ("q8b", "f16", "tg128"): 216.0,
    ("q8b", "f16", "pp2048"): 9252.0,
    ("q8b", "f16", "pp32768"): 7085.0,
    ("q8b", "f16", "tg128 @ d32768"): 126.8,
    ("q8b", "q8_0", "tg128 @ d32768"): 60.6,
    ("q8b", "f16", "tg128 @ d131072"): 57.8,
    ("q8b_bf16", "f16", "tg128"): 181.0,
    ("q8b_bf16", "f16", "pp2048"): 21407.0,
}
MODELS = {"q8b": "Qwen3-8B q4_K_M", "q8b_bf16": "Qwen3-8B bf16", "g26": "Gemma-4-26B-A4B q4_K_M"}


ORDER = ["", "ub2048", "f16kv", "q8kv", "gemvf32", "nographs", "neither", "attnpipe", "attnpipe_q8kv",
         "split64", "optimes"]  # perf_table.sh's runs
VARIANT = {"ub2048": " (ubatch 2048)", "gemvf32": " (f32 gemv)", "nographs": " (no CUDA graphs)",
           "neither": " (f32 gemv, no CUDA graphs)", "attnpipe": " (pipelined attention)",
           "attnpipe_q8kv": " (pipelined attention)",
           "split64": " (attention splits of 64 keys)"}


def runs(out):
    """(model, kv, variant, json) for every bench run: by model, then in ORDER"""
    found = []
    for f in glob.glob(os.path.join(out, "*.json")):
        model, _, rest = os.path.basename(f)[:-5].partition(".")
        if rest not in ORDER:
            continue
        with open(f) as fh:
            found.append((model, rest, json.load(fh)))
    found.sort(key=lambda r: (list(MODELS).index(r[0]) if r[0] in MODELS else len(MODELS), r[0],
                              ORDER.index(r[1])))
    return [(m, "q8_0" if rest.endswith("q8kv") else "f16",
             "" if rest in ("f16kv", "q8kv") else rest, j) for m, rest, j in found]


def table(out):
    lines = ["| model | KV | test | t/s | achieved | of ceiling | llama.cpp | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, kv, variant, j in runs(out):
        if variant == "optimes":
            continue
        label = MODELS.get(model, model) + VARIANT.get(variant, "")
        for t in j["tests"]:
            if t["kind"] == "tg":
                ach = "%.0f GB/s" % (t["bytes_per_second"] / 1e9)
            else:
                ach = "%.1f TFLOP/s" % (t["flops_per_second"] / 1e12)
            ref = None if variant else LLAMA_CPP.get((model, kv, t["test"]))
            ts = t["tokens_per_second_median"]
            lines.append("| %s | %s | %s | %.1f | %s | %.1f%% | %s | %s |" % (
                label, kv, t["test"], ts, ach, 100 * t["fraction_of_ceiling"],
                "%.1f" % ref if ref else "", "%.2f" % (ts / ref) if ref else ""))
    return lines


def splits(out):
    lines = []
    for model, _, variant, j in runs(out):
        if variant != "optimes":
            continue
        for t in j["tests"]:
            ot = t.get("op_times")
            if not ot:
                continue
            ms = lambda s: 1e3 * s
            wall = ot["wall_seconds_per_token"]
            lines.append("%s, %s (ms per token): %.3f wall = %.3f outside computes + %.3f in "
                         "computes outside nodes + %.3f in nodes" % (
                             MODELS.get(model, model), t["test"], ms(wall),
                             ms(wall - ot["compute_seconds_per_token"]),
                             ms(ot["compute_seconds_per_token"] - ot["node_seconds_per_token"]),
                             ms(ot["node_seconds_per_token"])))
            for k in sorted(ot["kinds"], key=lambda k: -k["seconds_per_token"])[:12]:
                lines.append("    %-40s %7.2f calls %8.4f ms %5.1f%%" % (
                    k["kind"], k["calls_per_token"], ms(k["seconds_per_token"]),
                    100 * k["seconds_per_token"] / wall))
    return lines


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = sys.argv[1]
    rows = table(out)
    if len(rows) == 2:
        print("perf_table: no bench results in %s" % out, file=sys.stderr)
        return 1
    ceil = runs(out)[0][3]
    print("ceilings: copy %.0f GB/s (%s); GEMM %.0f TFLOP/s (%s)\n" % (
        ceil["copy_bytes_per_second"] / 1e9, ceil["copy_measured_with"],
        ceil["gemm_flops"] / 1e12, ceil["gemm_measured_with"]))
    print("\n".join(rows))
    split = splits(out)
    if split:
        print("\n" + "\n".join(split))
    for log in ("kernels.log", "kernels_gemvf32.log", "kernels_attnpipe.log",
                "kernels_split64.log", "kernels_tile_decode.log", "kernels_gqa_unstaged.log"):
        p = os.path.join(out, log)
        if os.path.exists(p):
            print("\n%s:" % log)
            with open(p) as fh:
                print("".join(l for l in fh if l.startswith("BENCH")).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
