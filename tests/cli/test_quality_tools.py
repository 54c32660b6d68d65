"""`tessera perplexity`, `logit-eq`, `ruler` and `ab` on the qwen3_tied fixture converted at f32.

usage: test_quality_tools.py TESSERA_BINARY SOURCE_ROOT RANDOM_MODEL.gguf
The fixture has random weights, but its distributions are peaked (mean entropy ~1.7 of
ln 512 = 6.2 nats), so the KL instruments are valid on it; the build's tiny random model
is near-flat and serves to check the validity gate. Prints "ok   name" / "FAIL name" per case.
"""
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
from cases import case, finish

TESSERA, SOURCE, DEFAULT_MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
TMP = tempfile.mkdtemp(prefix="tsr_quality_")


def tessera(*args):
    p = subprocess.run([TESSERA, *args], capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def ok(code, out, err):
    assert code == 0, f"exit {code}; stderr: {err.strip()}"
    return out




def value(out, label):
    m = re.search(r"^" + re.escape(label) + r"\s+(\S+)", out, re.M)
    assert m, f"no '{label}' line in:\n{out}"
    return float(m.group(1))


MODEL = os.path.join(TMP, "qwen3_tied.f32.gguf")
ok(*tessera("convert", os.path.join(SOURCE, "tests", "reference", "fixtures", "qwen3_tied"),
            MODEL, "--outtype", "f32"))
rng = random.Random(7)
words = ("the old lighthouse keeper walked along the shore every night and watched the ships "
         "sail past the rocks while storms gathered over a grey sea").split()
TEXT = os.path.join(TMP, "text.txt")
with open(TEXT, "w") as f:
    f.write(" ".join(rng.choice(words) for _ in range(700)))
OTHER = os.path.join(TMP, "other.txt")
with open(OTHER, "w") as f:
    f.write(" ".join(rng.choice(words) for _ in range(700)))
PPL = ["perplexity", TEXT, "-m", MODEL, "--ctx", "64"]
BASE = os.path.join(TMP, "base.gguf")


def kl_run(*sets):
    args = [a for s in sets for a in ("--set", s)]
    return ok(*tessera(*PPL, "--kl-divergence", BASE, *args))


@case
def test_perplexity_is_finite_and_above_one_and_writes_a_base():
    out = ok(*tessera(*PPL, "--kl-divergence-base", BASE))
    ppl = value(out, "PPL")
    assert math.isfinite(ppl) and ppl > 1, f"PPL {ppl}"
    windows = int(re.search(r"(\d+) windows of 64", out).group(1))
    assert value(out, "tokens scored") == windows * 31, out  # positions 32..62 of each window
    assert os.path.getsize(BASE) > windows * 31 * 512 * 2, "base smaller than its log-probs"


@case
def test_same_configuration_against_its_base_gives_zero_kl_and_same_top():
    out = kl_run()
    assert value(out, "mean KL") < 1e-6, out
    assert value(out, "max KL") < 1e-5, out
    assert value(out, "same top") == 100.0, out
    assert value(out, "PPL(base)") == value(out, "PPL(cand)"), out


@case
def test_kl_grows_as_kv_bits_shrink_and_q8_0_control_is_near_lossless():
    q8 = kl_run("kv.k=q8_0", "kv.v=q8_0")
    q4 = kl_run("kv.k=q4_0", "kv.v=q4_0")
    k8, k4 = value(q8, "mean KL"), value(q4, "mean KL")
    assert 0 < k8 < k4, f"KL q8_0 {k8}, q4_0 {k4}"
    assert k8 < 0.01, f"q8_0 control KL {k8}"
    assert value(q8, "same top") > value(q4, "same top"), (q8, q4)


@case
def test_base_of_another_ctx_or_text_is_refused():
    code, _, err = tessera("perplexity", TEXT, "-m", MODEL, "--ctx", "32", "--kl-divergence", BASE)
    assert code == 2 and "window size (--ctx) differs" in err, f"exit {code}: {err}"
    code, _, err = tessera("perplexity", OTHER, "-m", MODEL, "--ctx", "64", "--kl-divergence",
                           BASE)
    assert code == 2 and "the text differs" in err, f"exit {code}: {err}"


@case
def test_decode_scores_the_second_half_a_token_at_a_time():
    """--decode: the same tokens scored, decode steps instead of one prefill (the cpu's f32
    products: the same figures within rounding); a base of the other kind is refused."""
    dbase = os.path.join(TMP, "decode_base.gguf")
    out = ok(*tessera(*PPL, "--decode", "--set", "backend={name: cpu, activations: f32}",
                      "--kl-divergence-base", dbase))
    assert "decoded a token at a time" in out, out
    prefill = ok(*tessera(*PPL, "--set", "backend={name: cpu, activations: f32}"))
    assert abs(value(out, "PPL") - value(prefill, "PPL")) < 1e-3 * value(prefill, "PPL"), \
        (out, prefill)
    code, _, err = tessera(*PPL, "--kl-divergence", dbase)
    assert code == 2 and "how the scored tokens were evaluated (--decode)" in err, \
        f"exit {code}: {err}"
    same = ok(*tessera(*PPL, "--decode", "--set", "backend={name: cpu, activations: f32}",
                       "--kl-divergence", dbase))
    assert value(same, "mean KL") < 1e-6, same


@case
def test_near_flat_base_is_refused_unless_allowed():
    flat = os.path.join(TMP, "flat.gguf")
    args = ["perplexity", TEXT, "-m", DEFAULT_MODEL, "--ctx", "64"]
    ok(*tessera(*args, "--kl-divergence-base", flat))
    code, _, err = tessera(*args, "--kl-divergence", flat)
    assert code == 1 and "near-flat" in err, f"exit {code}: {err}"
    out = ok(*tessera(*args, "--kl-divergence", flat, "--allow-flat-base"))
    assert "WARNING: near-flat base" in out, out


@case
def test_logit_eq_of_a_configuration_with_itself_agrees_fully():
    out = ok(*tessera("logit-eq", TEXT, "-m", MODEL, "--ctx", "64"))
    assert value(out, "real_frac") == 0, out
    assert value(out, "mean_tv") == 0, out
    assert value(out, "full_agree") == 1, out


@case
def test_logit_eq_sees_a_q4_0_kv_cache_and_exits_0():
    out = ok(*tessera("logit-eq", TEXT, "-m", MODEL, "--ctx", "64", "--cand-set", "kv.k=q4_0",
                      "--cand-set", "kv.v=q4_0"))
    assert value(out, "real_frac") > 0, out
    assert value(out, "mean_tv") > 0, out
    assert value(out, "full_agree") < 1, out


@case
def test_logit_eq_compares_two_profiles():
    a, b = os.path.join(TMP, "a.yaml"), os.path.join(TMP, "b.yaml")
    for path, k in ((a, "f16"), (b, "q8_0")):
        with open(path, "w") as f:
            f.write(f"model: {MODEL}\ncontext: 128\nplugins: [arch_qwen]\nkv: {{k: {k}, v: f16}}\n")
    out = ok(*tessera("logit-eq", TEXT, "--ref", a, "--cand", b))
    assert "kv k=q8_0" in out and value(out, "mean_tv") > 0, out
    assert re.search(r"windows of 128", out), out  # the profile's context when under 512


@case
def test_bad_flags_exit_2():
    for args in (["perplexity"], ["perplexity", TEXT], ["perplexity", TEXT, "-m", MODEL, "--ctx", "x"],
                 ["perplexity", TEXT, "-m", MODEL, "--bogus", "1"],
                 ["perplexity", TEXT, "-m", MODEL, "--kl-divergence", BASE,
                  "--kl-divergence-base", BASE],
                 ["perplexity", os.path.join(TMP, "missing.txt"), "-m", MODEL],
                 ["logit-eq", TEXT], ["logit-eq", TEXT, "--ref", "x.yaml"],
                 ["logit-eq", TEXT, "-m", MODEL, "--top-k", "0"],
                 ["logit-eq", TEXT, "-m", MODEL, "--ctx", "4096"]):
        code, _, err = tessera(*args)
        assert code == 2, f"{args}: exit {code}: {err}"
        assert err.strip(), f"{args}: no message"


def ruler_json(*extra):
    out = os.path.join(TMP, "ruler.json")
    ok(*tessera("ruler", "--task", "vt", "--ctx", "400", "--n", "3", "-m", MODEL, "--json", out,
                *extra))
    with open(out) as f:
        return json.load(f)


@case
def test_ruler_fills_the_context_and_is_reproducible():
    a = ruler_json("--seed", "5")
    assert a["task"] == "vt" and a["n"] == 3 and len(a["items"]) == 3, a
    for item in a["items"]:
        # the prompt fills the context less the reply budget (64 for vt), to a filler unit
        assert 250 < item["prompt_tokens"] <= 400 - 64, item
        assert len(item["expected"]) == 5 and 0 <= item["score"] <= 1, item
    assert a["accuracy"] == 100 * sum(x["score"] for x in a["items"]) / 3, a
    b = ruler_json("--seed", "5")
    assert [x["reply"] for x in a["items"]] == [x["reply"] for x in b["items"]], "greedy differs"
    c = ruler_json("--seed", "6")
    assert a["items"][0]["expected"] != c["items"][0]["expected"], "seed changed nothing"


@case
def test_ruler_refuses_a_context_too_small_and_bad_flags():
    for args in (["--task", "passkey", "--ctx", "40", "--n", "1", "-m", MODEL],
                 ["--task", "niah", "--ctx", "400", "--n", "1", "-m", MODEL],
                 ["--task", "vt", "--ctx", "400", "-m", MODEL],
                 ["--task", "vt", "--ctx", "400", "--n", "1"]):
        code, _, err = tessera("ruler", *args)
        assert code == 2 and err.strip(), f"{args}: exit {code}: {err}"


@case
def test_ab_of_a_configuration_with_itself_shows_no_difference():
    out_json = os.path.join(TMP, "ab.json")
    out = ok(*tessera("ab", "-m", MODEL, "--text", TEXT, "--ctx", "128", "--chunks", "2",
                      "--decode", "8", "--set", "kv.k=f32", "--set", "kv.v=f32",
                      "--json", out_json))
    with open(out_json) as f:
        r = json.load(f)
    assert r["positions"] == 256 and r["real_frac"] == 0 and r["mean_kl"] == 0, r
    assert all(s["prefill_tokens_per_second"] > 0 and s["decode_tokens_per_second"] > 0
               for s in r["sides"]), r
    assert "prefill tokens/s" in out and "decode tokens/s" in out, out


@case
def test_ab_sees_a_q4_0_kv_cache():
    out_json = os.path.join(TMP, "ab4.json")
    ok(*tessera("ab", "-m", MODEL, "--text", TEXT, "--ctx", "128", "--chunks", "2",
                "--decode", "4", "--b-set", "kv.k=q4_0", "--b-set", "kv.v=q4_0",
                "--json", out_json))
    with open(out_json) as f:
        r = json.load(f)
    assert r["mean_kl"] > 0 and r["full_agree"] < 1, r


@case
def test_ab_on_a_task_runs_the_same_items_on_both_sides():
    out_json = os.path.join(TMP, "abt.json")
    out = ok(*tessera("ab", "-m", MODEL, "--task", "passkey", "--ctx", "300", "--n", "2",
                      "--b-set", "kv.v=q8_0", "--json", out_json))
    with open(out_json) as f:
        r = json.load(f)
    assert r["task"] == "passkey" and r["n"] == 2 and len(r["sides"]) == 2, r
    assert "items scored differently" in out, out
    code, _, err = tessera("ab", "-m", MODEL, "--task", "passkey", "--ctx", "300")
    assert code == 2 and "--n" in err, err


@case
def test_help_exits_0():
    for tool in ("perplexity", "logit-eq", "ruler", "ab"):
        out = ok(*tessera(tool, "--help"))
        assert "usage: tessera " + tool in out, out


finish()
