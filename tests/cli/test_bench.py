"""`tessera bench` on the build's tiny random model and three converted fixtures (a hybrid
with recurrent layers, an iSWA model, a MoE).

usage: test_bench.py TESSERA_BINARY SOURCE_ROOT RANDOM_MODEL.gguf
Speed itself is not checked here (benchmarks run on the device, docs/PERFORMANCE.md); these
cases check that every requested test runs and is reported, that the ceilings are measured
and named, that the cost model follows depth and expert sharing, and that bad flags are
refused. Prints "ok   name" / "FAIL name" per case.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from cases import case, finish

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
TMP = tempfile.mkdtemp(prefix="tsr_bench_")
FIXTURES = os.path.join(SOURCE, "tests", "reference", "fixtures")


def tessera(*args):
    p = subprocess.run([TESSERA, *args], capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def bench(model, *args):
    out = os.path.join(TMP, "bench.json")
    code, text, err = tessera("bench", "-m", model, "--json", out, "--threads", "2", *args)
    assert code == 0, f"exit {code}; stderr: {err.strip()}"
    with open(out) as f:
        return text, json.load(f)


def fixture(name):
    path = os.path.join(TMP, name + ".gguf")
    if not os.path.exists(path):
        code, _, err = tessera("convert", os.path.join(FIXTURES, name), path, "--outtype", "f16")
        assert code == 0, err
    return path


@case
def test_every_test_and_depth_gets_a_row_and_a_json_entry():
    text, j = bench(MODEL, "-p", "32,64", "-n", "8", "-d", "0,100", "-r", "3")
    names = [t["test"] for t in j["tests"]]
    assert names == ["pp32", "pp64", "tg8", "pp32 @ d100", "pp64 @ d100", "tg8 @ d100"], names
    for t in j["tests"]:
        assert t["tokens_per_second_median"] > 0 and t["fraction_of_ceiling"] > 0, t
        assert t["depth"] == (100 if "@" in t["test"] else 0), t
        row = [line for line in text.splitlines()
               if re.search(r"\| " + re.escape(t["test"]) + r"\s+\|", line)]
        assert len(row) == 1, f"{t['test']}: {row}"
    assert j["repetitions"] == 3


@case
def test_ceilings_are_measured_and_say_how():
    text, j = bench(MODEL, "-p", "16", "-n", "0", "-r", "1")
    assert j["copy_bytes_per_second"] > 1e8 and j["gemm_flops"] > 1e8, j
    # the cpu's ceilings are the hardware's: a streaming read and the cores' FMA peak
    assert "streaming read" in j["copy_measured_with"], j
    assert "multiply-add peak" in j["gemm_measured_with"], j
    assert re.search(r"^ceiling copy: [0-9.]+ GB/s", text, re.M), text
    assert [t["kind"] for t in j["tests"]] == ["pp"]
    # the gemm ceiling is in the products' arithmetic: 8-bit integer dots with the default
    # activations q8 where the machine has them (AVX2 or VNNI), f32 with activations f32
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if re.search(r"\bavx2\b", flags):
        assert "8-bit integer multiply-add peak" in j["gemm_measured_with"], j
        vnni = re.search(r"\bavx512_vnni\b", flags) and re.search(r"\bavx512vl\b", flags)
        assert ("vpdpbusd" in j["gemm_measured_with"]) == bool(vnni), j
    _, jf = bench(MODEL, "-p", "16", "-n", "0", "-r", "1", "--set",
                  "backend={name: cpu, activations: f32}")
    assert jf["gemm_measured_with"].startswith("f32 multiply-add peak"), jf


@case
def test_a_decode_step_reads_more_at_depth_by_the_kv_it_attends():
    _, j = bench(MODEL, "-p", "0", "-n", "4", "-d", "0,200", "-r", "2")
    per_token = [t["bytes_per_second"] / t["tokens_per_second_median"] for t in j["tests"]]
    assert per_token[0] >= j["active_weight_bytes_per_token"], (per_token, j)
    assert per_token[1] > per_token[0], per_token


@case
def test_a_model_with_recurrent_layers_is_refilled_between_repetitions():
    _, j = bench(fixture("qwen3_5"), "-p", "16", "-n", "4", "-d", "24", "-r", "2")
    assert [t["test"] for t in j["tests"]] == ["pp16 @ d24", "tg4 @ d24"], j["tests"]


@case
def test_sliding_layers_and_experts():
    _, j = bench(fixture("gemma4_dense"), "-p", "16", "-n", "4", "-d", "0,40", "-r", "2")
    assert len(j["tests"]) == 4
    _, moe = bench(fixture("qwen3_moe_norm"), "-p", "8", "-n", "2", "-r", "1")
    # a token reads only its share of the experts
    assert moe["active_weight_bytes_per_token"] < 0.9 * moe["model_bytes"], moe


@case
def test_op_times_split_each_test_and_add_up():
    text, j = bench(MODEL, "-p", "32", "-n", "4", "-r", "2", "--op-times")
    for t in j["tests"]:
        o = t["op_times"]
        wall, comp, nodes = (o["wall_seconds_per_token"], o["compute_seconds_per_token"],
                             o["node_seconds_per_token"])
        # nested host clocks: the nodes inside the computes inside the wall time
        assert 0 < nodes <= comp * 1.0001 and comp <= wall * 1.0001, o
        kinds = {k["kind"]: k for k in o["kinds"]}
        n_class = "n>16" if t["kind"] == "pp" else "n=1"
        assert any(k.startswith("mat_mul ") and k.endswith(n_class) for k in kinds), kinds
        assert "flash_attn K f16 V f16" in kinds and "rms_norm" in kinds, kinds
        # a decode step: one compute, and per layer one attention, two ropes (q, k) and two
        # cache writes (K, V)
        if t["kind"] == "tg":
            layers = kinds["flash_attn K f16 V f16"]["calls_per_token"]
            assert layers >= 1 and layers == int(layers), kinds
            assert kinds["rope"]["calls_per_token"] == 2 * layers, kinds
            assert kinds["set_rows"]["calls_per_token"] == 2 * layers, kinds
            assert o["computes_per_token"] == 1, o
        secs = [k["seconds_per_token"] for k in o["kinds"]]
        assert secs == sorted(secs, reverse=True), secs
        assert re.search(r"^op times, " + re.escape(t["test"]) + r" \(2 runs; ms per token\)",
                         text, re.M), text
    # a KV codec shows in the attention kind
    _, j = bench(MODEL, "-p", "0", "-n", "2", "-r", "1", "--op-times", "--set", "kv.k=q8_0")
    assert any(k["kind"] == "flash_attn K q8_0 V f16" for k in j["tests"][0]["op_times"]["kinds"])
    # without the flag: no op_times
    _, j = bench(MODEL, "-p", "8", "-n", "0", "-r", "1")
    assert "op_times" not in j["tests"][0], j


@case
def test_no_warmup_and_the_peak_memory_are_reported():
    text, j = bench(MODEL, "-p", "16", "-n", "2", "-r", "1", "--warmup", "0")
    assert j["warmups"] == 0 and len(j["tests"]) == 2, j
    # the cpu holds no device memory: only the process's resident peak, at least the model
    assert j["memory"]["host_peak_resident_bytes"] >= j["model_bytes"], j["memory"]
    assert "device_used_peak_bytes" not in j["memory"], j["memory"]
    assert re.search(r"^host memory at its peak: [0-9.]+ MiB resident", text, re.M), text
    _, j = bench(MODEL, "-p", "16", "-n", "0", "-r", "1")
    assert j["warmups"] == 1, j


@case
def test_progress_reports_a_long_prefill_call_by_call():
    out = os.path.join(TMP, "progress.json")
    code, _, err = tessera("bench", "-m", MODEL, "--json", out, "--threads", "2", "-p", "100",
                           "-n", "0", "-d", "70", "-r", "1", "--warmup", "0", "--progress", "32")
    assert code == 0, err
    done = [(m.group(1), int(m.group(2)), int(m.group(3))) for m in
            re.finditer(r"^tessera bench: (depth fill|prefill): (\d+) of (\d+) tokens, \d+ t/s, "
                        r"[0-9.]+ min so far, about [0-9.]+ min left$", err, re.M)]
    assert done == [("depth fill", 32, 70), ("depth fill", 64, 70), ("depth fill", 70, 70),
                    ("prefill", 32, 100), ("prefill", 64, 100), ("prefill", 96, 100),
                    ("prefill", 100, 100)], err
    with open(out) as f:
        j = json.load(f)
    assert [t["test"] for t in j["tests"]] == ["pp100 @ d70"]
    # the fill itself is a figure: one fill of 70 tokens from 0, its time and rate
    fills = j["depth_fills"]
    assert fills["count"] == 1 and fills["tokens"] == 70 and fills["seconds"] > 0, fills
    longest = fills["longest"]
    assert longest["from_depth"] == 0 and longest["tokens"] == 70, fills
    assert abs(longest["tokens_per_second"] * longest["seconds"] - 70) < 1e-6, fills
    # without it, or shorter than its calls, nothing is printed
    code, text, err = tessera("bench", "-m", MODEL, "-p", "16", "-n", "0", "-r", "1",
                              "--progress", "32")
    assert code == 0 and "tokens," not in err, err
    assert "depth fills" not in text, text  # depth 0: nothing filled


def depth_fills(model, *args):
    """the (done, of) of each --progress line of a depth fill"""
    out = os.path.join(TMP, "fills.json")
    code, _, err = tessera("bench", "-m", model, "--json", out, "--threads", "2", *args)
    assert code == 0, err
    return [(int(m.group(1)), int(m.group(2))) for m in
            re.finditer(r"^tessera bench: depth fill: (\d+) of (\d+) tokens", err, re.M)]


@case
def test_depths_fill_once_and_repetitions_resume_on_a_sliding_ring():
    # iSWA: the ring keeps window + ubatch positions, so the 4 tested tokens come off again
    # and each of the 3 runs per depth (warm-up included) starts from the same fill; the
    # second depth continues the first's (44 tokens after its last run: 36 more)
    fills = depth_fills(fixture("gemma4_dense"), "-p", "0", "-n", "4", "-d", "40,80", "-r", "2",
                        "--warmup", "1", "--progress", "16")
    assert fills == [(16, 40), (32, 40), (40, 40), (16, 36), (32, 36), (36, 36)], fills
    # recurrent state cannot drop a tail: each run refills its depth from the start
    fills = depth_fills(fixture("qwen3_5"), "-p", "0", "-n", "4", "-d", "20", "-r", "2",
                        "--warmup", "0", "--progress", "16")
    assert fills == [(16, 20), (20, 20)] * 2, fills


@case
def test_a_depth_filled_with_positions_only_says_so():
    text, j = bench(MODEL, "-p", "8", "-n", "2", "-d", "300", "-r", "2", "--depth-fill",
                    "positions")
    assert j["depth_fill"] == "positions", j
    assert j["depth_fills"]["count"] == 1 and j["depth_fills"]["tokens"] == 300, j
    assert "longest" not in j["depth_fills"], j  # no prefill rate from a fill not computed
    assert [t["test"] for t in j["tests"]] == ["pp8 @ d300", "tg2 @ d300"], j["tests"]
    assert "filled without compute" in text, text
    _, j = bench(MODEL, "-p", "8", "-n", "0", "-d", "40", "-r", "1")
    assert j["depth_fill"] == "compute" and "longest" in j["depth_fills"], j
    # recurrent state only a computed fill gives
    code, _, err = tessera("bench", "-m", fixture("qwen3_5"), "-p", "0", "-n", "2", "-d", "20",
                           "-r", "1", "--depth-fill", "positions")
    assert code != 0 and "recurrent" in err, err


@case
def test_parallel_sequences_share_each_step():
    text, j = bench(MODEL, "-p", "16", "-n", "4", "-d", "0,40", "-r", "2", "--parallel", "3")
    names = [t["test"] for t in j["tests"]]
    assert names == ["pp16 x3", "tg4 x3", "pp16 x3 @ d40", "tg4 x3 @ d40"], names
    for t in j["tests"]:
        assert t["sequences"] == 3 and t["tokens_per_second_median"] > 0, t
        assert re.search(r"\| " + re.escape(t["test"]) + r"\s+\|", text), t["test"]
    # a step of three sequences reads the weights once: a token's share is a third of them
    _, one = bench(MODEL, "-p", "0", "-n", "4", "-r", "2")
    def per_token(t):
        return t["bytes_per_second"] / t["tokens_per_second_median"]
    assert per_token(j["tests"][1]) < 0.5 * per_token(one["tests"][0]), (j["tests"], one["tests"])
    assert one["tests"][0]["sequences"] == 1
    # a model with recurrent layers: each copy of the filled sequence takes its state too
    _, rec = bench(fixture("qwen3_5"), "-p", "4", "-n", "2", "-d", "8", "-r", "2", "--parallel", "2")
    assert [t["test"] for t in rec["tests"]] == ["pp4 x2 @ d8", "tg2 x2 @ d8"], rec["tests"]


@case
def test_bad_flags_are_refused_naming_them():
    for args, needle in ((["-p", "0", "-n", "0"], "nothing to measure"), (["-p", "x"], "-p"),
                         (["-r", "0"], "-r"), (["-d", "-5"], "-d"), (["--warmup", "-1"], "--warmup"),
                         (["--bogus", "1"], "--bogus"), (["--progress", "0"], "--progress"),
                         (["--depth-fill", "zeros"], "--depth-fill"),
                         (["--parallel", "0"], "--parallel"), (["--parallel", "65"], "--parallel"),
                         (["-n", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"], "-n")):
        code, _, err = tessera("bench", "-m", MODEL, *args)
        assert code == 2 and needle in err, f"{args}: exit {code}: {err}"
    text = os.path.join(TMP, "prompt.txt")
    with open(text, "w") as f:
        f.write("a few words of text")
    for args, needle in ((["--speculate"], "go together"), (["--prompt-file", text], "go together"),
                         (["--speculate", "--prompt-file", text], "names no speculator"),
                         (["--speculate", "--prompt-file", text, "-n", "0"], "nothing to run"),
                         (["--speculate", "--prompt-file", text, "--parallel", "2"],
                          "not with --parallel")):
        code, _, err = tessera("bench", "-m", MODEL, *args)
        assert code == 2 and needle in err, f"{args}: exit {code}: {err}"
    code, _, err = tessera("bench", "-p", "8")
    assert code == 2 and "-m MODEL.gguf or --profile" in err, err
    code, _, err = tessera("bench", "-m", os.path.join(TMP, "missing.gguf"))
    assert code == 2 and "missing.gguf" in err, err


@case
def test_help_exits_0():
    code, out, _ = tessera("bench", "--help")
    assert code == 0 and "usage: tessera bench" in out, out


finish()
