"""`tessera gen-model --like`: real model shapes, streamed, in llama.cpp's q4_K_M mix.

usage: test_gen_model.py TESSERA_BINARY SOURCE_ROOT
Small cuts (--layers/--vocab/--experts) of each shape are generated, read back,
described and run on the CPU; the full shapes are checked as shape-only files
(matrices left as holes: full size, no disk) through `tessera profile check`,
including the Gemma-4-26B-A4B 1M-context memory plan against the evaluation
record's §3. Prints "ok   name" / "FAIL name" per case.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from cases import case, finish

TESSERA, SOURCE = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="tsr_gen_model_")
MiB = 1 << 20


def run(*args, timeout=300):
    p = subprocess.run([TESSERA, *args], capture_output=True, text=True, errors="replace",
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def ok(*args):
    code, out, err = run(*args)
    assert code == 0, f"{' '.join(args)}: exit {code}; stderr: {err.strip()}"
    return out, err




def path(name):
    return os.path.join(TMP, name)


def tensor_types(gguf):
    """name -> (dtype, shape) from `tessera gguf info`"""
    out, _ = ok("gguf", "info", gguf)
    types = {}
    for m in re.finditer(r"^\s+(\S+)\s+(\w+)\s+\[([\d, ]+)\]\s+\d+\s+\d+$", out, re.M):
        types[m.group(1)] = (m.group(2), [int(x) for x in m.group(3).split(",")])
    assert types, f"no tensors listed:\n{out[:2000]}"
    return types, out


def plan_types(*args):
    """name -> dtype from --plan, and the file size it states"""
    out, _ = ok("gen-model", *args, "--plan")
    types = {m.group(1): m.group(2) for m in re.finditer(r"^(\S+)\s+(\w+)\s+\d", out, re.M)
             if not m.group(1).startswith("total")}
    size = int(re.search(r"file size (\d+) bytes", out).group(1))
    return types, size


def profile_check(model, *sets):
    prof = path("check.yaml")
    with open(prof, "w") as f:
        f.write(f"model: {model}\nplugins: [arch_qwen, arch_gemma4]\n")
    return ok("profile", "check", prof, *sets)[0]


def generated(err):
    m = re.search(r"generated: (\d+) tokens", err)
    assert m, f"no 'generated:' line in stderr:\n{err}"
    return int(m.group(1))


def gen_and_run(name, *args):
    """generate a cut, read it back, run 3 tokens; returns the file"""
    f = path(name)
    p = subprocess.Popen([TESSERA, "gen-model", *args, "-o", f], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    p.stdout.close(), p.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, f"gen-model {args}: {err}"
    assert "wrote" in out, out
    size = os.path.getsize(f)
    peak = usage.ru_maxrss * 1024
    # streaming: the generator holds a row block per thread, never a tensor, let alone the file
    assert peak < 64 * MiB, \
        f"gen-model peaked at {peak / MiB:.0f} MiB for a {size / MiB:.0f} MiB file"
    types, info = tensor_types(f)
    _, err = ok("run", "-m", f, "-p", "hi", "-n", "3", "--temp", "0", "--verbose")
    assert generated(err) >= 1, err
    return f, size, peak, types, info


@case
def test_qwen3_8b_cut_generates_runs_and_streams():
    f, size, peak, types, _ = gen_and_run("q8b.gguf", "--like", "qwen3-8b", "--layers", "1",
                                          "--vocab", "1024", "--type", "bf16")
    assert size > 300 * MiB and peak < size / 8, \
        f"{size / MiB:.0f} MiB file, peak {peak / MiB:.1f} MiB"
    print(f"  qwen3-8b cut: {size / MiB:.0f} MiB written, peak RSS {peak / MiB:.1f} MiB")
    assert types["blk.0.attn_q.weight"] == ("bf16", [4096, 4096])
    assert types["blk.0.attn_k.weight"] == ("bf16", [4096, 1024])
    assert types["blk.0.ffn_down.weight"] == ("bf16", [12288, 4096])
    assert types["output.weight"] == ("bf16", [4096, 1024])
    assert types["blk.0.attn_norm.weight"][0] == "f32"


@case
def test_qwen3_30b_a3b_cut_follows_the_q4_K_M_rule():
    f, _, _, types, info = gen_and_run("q30.gguf", "--like", "qwen3-30b-a3b", "--layers", "2",
                                       "--vocab", "1024", "--experts", "4", "--type", "q4_K_M")
    assert re.search(r"general\.file_type\s+u32\s+15\b", info), "file_type is not Q4_K_M (15)"
    assert re.search(r"qwen3moe\.expert_used_count\s+u32\s+4\b", info), "top-k not capped at 4"
    want = {
        "token_embd.weight": "q4_K",             # untied: the default type
        "output.weight": "q6_K",                 # the head
        "blk.0.attn_v.weight": "q4_K",           # use_more_bits(0, 2) is false
        "blk.1.attn_v.weight": "q6_K",           # ... (1, 2) true: i >= 7n/8
        "blk.0.ffn_down_exps.weight": "q4_K",
        "blk.1.ffn_down_exps.weight": "q6_K",
        "blk.1.ffn_gate_exps.weight": "q4_K",
        "blk.0.attn_q.weight": "q4_K",
        "blk.0.ffn_gate_inp.weight": "f32",      # the router is never quantized
        "blk.0.attn_q_norm.weight": "f32",
    }
    got = {k: types[k][0] for k in want}
    assert got == want, f"{got} != {want}"
    assert types["blk.0.ffn_gate_exps.weight"][1] == [2048, 768, 4]
    assert types["blk.0.ffn_down_exps.weight"][1] == [768, 2048, 4]


@case
def test_gemma4_26b_a4b_cut_generates_and_runs():
    _, _, _, types, info = gen_and_run("g26.gguf", "--like", "gemma-4-26b-a4b", "--layers", "2",
                                       "--vocab", "1024", "--experts", "4", "--type", "q8_0")
    # layer 0 slides, the last (1) is full: k_eq_v, no attn_v, 2 KV heads of 512
    assert types["blk.0.attn_v.weight"] == ("q8_0", [2816, 2048])
    assert "blk.1.attn_v.weight" not in types
    assert types["blk.1.attn_k.weight"] == ("q8_0", [2816, 1024])
    assert types["blk.1.attn_q.weight"] == ("q8_0", [2816, 8192])
    assert types["blk.0.ffn_gate_up_exps.weight"] == ("q8_0", [2816, 1408, 4])
    assert types["blk.0.ffn_down_exps.weight"] == ("q8_0", [704, 2816, 4])
    assert types["rope_freqs.weight"] == ("f32", [256])
    assert "output.weight" not in types  # tied
    assert re.search(r"gemma4\.attention\.sliding_window_pattern\s+array\[bool x 2\]\s+true, false",
                     info), "sliding_window_pattern is not [true, false]"
    assert re.search(r"gemma4\.attention\.head_count_kv\s+array\[i32 x 2\]\s+8, 2", info), \
        "head_count_kv is not [8, 2]"


@case
def test_gemma4_31b_cut_generates_and_runs():
    _, _, _, types, _ = gen_and_run("g31.gguf", "--like", "gemma-4-31b", "--layers", "1",
                                    "--vocab", "1024", "--type", "q4_0")
    assert types["blk.0.attn_q.weight"] == ("q4_0", [5376, 16384])  # one layer: the last, full
    assert types["blk.0.ffn_down.weight"] == ("q4_0", [21504, 5376])


@case
def test_full_gemma4_26b_a4b_plan_takes_llama_cpp_fallbacks():
    types, size = plan_types("--like", "gemma-4-26b-a4b", "--type", "q4_K_M")
    want = {
        "token_embd.weight": "q6_K",              # tied: quantized as the head
        "blk.0.ffn_down.weight": "q8_0",          # q6_K, but 2112 is not a multiple of 256
        "blk.3.ffn_down.weight": "q5_0",          # q4_K -> q5_0 likewise
        "blk.0.ffn_down_exps.weight": "q8_0",     # 704-wide rows
        "blk.3.ffn_down_exps.weight": "q5_0",
        "blk.3.ffn_gate_up_exps.weight": "q4_K",
        "blk.6.attn_v.weight": "q6_K",            # 6th of the 25 attn_v tensors: (5 - 3) % 3 == 2
        "blk.7.attn_v.weight": "q4_K",
        "blk.0.ffn_gate_inp.weight": "f32",
    }
    got = {k: types.get(k) for k in want}
    assert got == want, f"{got} != {want}"
    assert "blk.5.attn_v.weight" not in types and "blk.29.attn_v.weight" not in types
    assert 16.0e9 < size < 17.5e9, size  # the record's real Q4_K_M file: ~17.5 GB


@case
def test_full_shapes_describe():
    expect = {
        "qwen3-8b": [r"full\s+layers 0-35 \(36\), heads 32/8 kv, head dim 128/128"],
        "qwen3-30b-a3b": [r"full\s+layers 0-47 \(48\), heads 32/4 kv, head dim 128/128"],
        "gemma-4-26b-a4b": [r"sliding layers [\d,-]+ \(25\), heads 16/8 kv, head dim 256/256, "
                            r"window 1024", r"full\s+layers 5,11,17,23,29 \(5\), heads 16/2 kv, "
                            r"head dim 512/512"],
        "gemma-4-31b": [r"sliding layers [\d,-]+ \(50\), heads 32/16 kv, head dim 256/256, "
                        r"window 1024",
                        r"full\s+layers [\d,]+ \(10\), heads 32/4 kv, head dim 512/512"],
    }
    for like, patterns in expect.items():
        f = path(f"{like}-shape.gguf")
        _, want_size = plan_types("--like", like, "--type", "q4_K_M")
        ok("gen-model", "--like", like, "--type", "q4_K_M", "--shape-only", "-o", f)
        st = os.stat(f)
        assert st.st_size == want_size, f"{like}: {st.st_size} bytes, --plan said {want_size}"
        assert st.st_blocks * 512 < 64 * MiB, \
            f"{like}: a shape-only file took {st.st_blocks * 512} bytes"
        out = profile_check(f)
        for pat in patterns:
            assert re.search(pat, out), f"{like}: /{pat}/ not in:\n{out[-1500:]}"
        os.unlink(f)


def plan_mib(out, label):
    m = re.search(re.escape(label) + r"\s+([\d.]+) MiB", out)
    assert m, f"no '{label}' in:\n{out[-1200:]}"
    return float(m.group(1))


def plan_26b(type_, profile, *sets):
    """`profile check` of conf/PROFILE on a shape-only Gemma-4-26B-A4B file of TYPE: the
    file's path and the output."""
    f = path(f"g26-{type_}-shape.gguf")
    ok("gen-model", "--like", "gemma-4-26b-a4b", "--type", type_, "--shape-only", "-o", f)
    prof = os.path.join(SOURCE, "conf", profile)
    args = ["profile", "check", prof, "--set", f"model={f}", "--set", "backend=cpu"]
    for s in sets:
        args += ["--set", s]
    return f, ok(*args)[0]


@case
def test_26b_a4b_1m_plan_matches_the_record():
    # §3 of the evaluation record (128e-F16): weights 48,150 MiB, KV of the 5 global
    # layers ~20,800 MiB at 1M (5,120 at 256k), 300 MiB for the 25 SWA layers' 1536 cells
    f, out = plan_26b("f16", "gemma4-26b-a4b-1m.yaml")
    weights = plan_mib(out, "weights")
    full = plan_mib(out, "KV full (1048576 cells)")
    sliding = plan_mib(out, "KV sliding (1536 cells)")
    exact_full = 5 * 2 * 512 * 2 * 2 * (1 << 20) / MiB  # layers x kv heads x dim x (K,V) x f16
    assert abs(weights - 48150) < 5, weights
    assert exact_full <= full < exact_full * 1.01 and full < 20800 * 1.02, full
    assert abs(sliding - 300) < 3, sliding
    _, out = plan_26b("f16", "gemma4-26b-a4b-1m.yaml", "context=262144")
    assert abs(plan_mib(out, "KV full (262144 cells)") - 5120) < 10, out[-600:]
    assert abs(plan_mib(out, "KV sliding (1536 cells)") - sliding) < 0.01, "sliding grew"
    os.unlink(f)


@case
def test_26b_a4b_1m_dca_plan():
    # the DCA issue's 1M run: attn_dca on the 5 full layers with q8_0 K / q4_0 V, flash and
    # f16 on the sliding ones; q8_0 is 34 bytes and q4_0 18 bytes per 32 values
    f, out = plan_26b("q4_K_M", "gemma4-26b-a4b-1m-dca.yaml")
    full_kind = out[out.index("full    layers"):]
    assert re.search(r"attention dca \(attn_dca", full_kind), out[-900:]
    assert re.search(r"K q8_0 \(in-register\), V q4_0", full_kind), out[-900:]
    sliding_kind = out[out.index("sliding layers"):out.index("full    layers")]
    assert "attention flash" in sliding_kind and "K f16" in sliding_kind, sliding_kind
    exact_full = 5 * 2 * 512 * (34 + 18) / 32 * (1 << 20) / MiB
    full = plan_mib(out, "KV full (1048576 cells)")
    assert exact_full <= full < exact_full * 1.01, (full, exact_full)
    assert abs(plan_mib(out, "KV sliding (1536 cells)") - 300) < 3, out[-600:]
    os.unlink(f)


@case
def test_random_codes_keep_the_layout_and_run():
    # the 26B's q4_K_M mix, fallbacks included: the same tensors, types, shapes and offsets
    cut = ("--like", "gemma-4-26b-a4b", "--layers", "1", "--vocab", "1024", "--experts", "4",
           "--type", "q4_K_M")
    f, _, _, _, info = gen_and_run("g26_codes.gguf", *cut, "--random-codes")
    ref = path("g26_quant.gguf")
    ok("gen-model", *cut, "-o", ref)
    _, ref_info = tensor_types(ref)
    table = lambda text: [l for l in text.splitlines() if re.match(r"^\s+\S+\s+\w+\s+\[", l)]
    assert table(info) == table(ref_info) and table(info), "layouts differ"
    with open(f, "rb") as a, open(ref, "rb") as b:
        assert a.read() != b.read(), "--random-codes wrote the quantized file"
    os.unlink(f), os.unlink(ref)


@case
def test_bad_options_are_refused():
    code, _, err = run("gen-model", "--like", "llama-70b", "-o", path("x.gguf"))
    assert code == 2 and "qwen3-8b" in err, err
    code, _, err = run("gen-model", "--arch", "qwen3", "--like", "gemma-4-31b",
                       "-o", path("x.gguf"))
    assert code == 2 and "gemma4" in err, err
    code, _, err = run("gen-model", "--like", "qwen3-8b", "--experts", "4", "-o", path("x.gguf"))
    assert code == 2 and "no experts" in err, err
    # a plain K type cannot hold the 26B's 704-wide expert rows; q4_K_M falls back instead
    code, _, err = run("gen-model", "--like", "gemma-4-26b-a4b", "--type", "q4_K", "--plan")
    assert code == 2 and "block size" in err, err
    code, _, err = run("gen-model", "--arch", "gemma4", "-o", path("x.gguf"))
    assert code == 2 and "--like" in err, err
    code, _, err = run("gen-model", "--preset", "tiny", "--arch", "qwen3", "--type", "bf16",
                       "--random-codes", "-o", path("x.gguf"))
    assert code == 2 and "--random-codes" in err, err
    assert not os.path.exists(path("x.gguf"))


shutil.rmtree(TMP, ignore_errors=True)  # the cuts are hundreds of MB
finish("gen-model")
