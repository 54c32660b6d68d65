"""End to end on the embedded default model (the trained models/ref-qwen3-21m) and
conf/default.yaml: run, ruler, perplexity with its KL gate, logit-eq and ab, at sizes that
take seconds on two cores. The model was trained on the Python documentation and on pass-key
tasks, so these assert what a trained model does, not only that the commands exit 0.

usage: test_default_model.py TESSERA_BINARY SOURCE_ROOT
Prints "ok   name" / "FAIL name" per case.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from cases import case, finish

TESSERA, SOURCE = sys.argv[1], sys.argv[2]
PROFILE = os.path.abspath(os.path.join(SOURCE, "conf", "default.yaml"))
TMP = tempfile.mkdtemp(prefix="tsr_default_model_")
# a paragraph in the style of the training corpus, not taken from it
TEXT = os.path.join(TMP, "text.txt")
with open(TEXT, "w") as f:
    f.write("The list type supports the usual sequence operations. A list comprehension "
            "builds a new list from an iterable: each element is computed by an expression, "
            "optionally filtered by a condition. Dictionaries map keys to values; a key must "
            "be hashable, and the order of insertion is kept. The function returns None when "
            "the argument is not found, and raises ValueError when it is out of range. " * 6)


def tessera(*args, timeout=240):
    p = subprocess.run([TESSERA, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def ok(code, out, err):
    assert code == 0, f"exit {code}; stderr: {err.strip()[-800:]}"
    return out, err


def number(text, label):
    m = re.search(r"^" + re.escape(label) + r"\s+(-?[0-9.e+-]+)", text, re.M)
    assert m, f"no '{label}' line in:\n{text}"
    return float(m.group(1))


@case
def test_run_is_greedy_deterministic_and_reads_like_its_corpus():
    args = ("run", "--profile", PROFILE, "-p", "A list comprehension", "-n", "24", "--temp", "0")
    out1, _ = ok(*tessera(*args))
    out2, _ = ok(*tessera(*args))
    assert out1 == out2, f"two greedy runs differ:\n{out1!r}\n{out2!r}"
    words = re.findall(r"[A-Za-z]+", out1)
    assert len(words) >= 8, f"not text: {out1!r}"


@case
def test_ruler_finds_pass_keys_at_the_trained_length():
    js = os.path.join(TMP, "ruler.json")
    out, err = ok(*tessera("ruler", "--profile", PROFILE, "--task", "passkey", "--ctx", "1024",
                           "--n", "4", "--no-chat", "--json", js))
    assert "accuracy 100.0% (4.0 of 4)" in out + err, out + err
    with open(js) as f:
        assert len(json.load(f)["items"]) == 4


@case
def test_perplexity_q8_0_kv_control_is_near_lossless_and_q4_0_costs_more():
    base = os.path.join(TMP, "base.gguf")
    # the KV codecs with the cpu's f32 activations: the default's 8-bit activations recode
    # every product's input, so a KV change also moves their codes (a floor of its own)
    ppl = ("perplexity", TEXT, "--profile", PROFILE, "--ctx", "256", "--chunks", "2")
    f32 = ("--set", "backend={name: cpu, activations: f32}")
    out, err = ok(*tessera(*ppl, *f32, "--kl-divergence-base", base))
    # peaked distributions: the KL figures mean something (the gate's premise)
    assert number(out + err, "mean entropy") < 2.0, out + err
    kl = {}
    for codec in ("q8_0", "q4_0"):
        out, err = ok(*tessera(*ppl, *f32, "--kl-divergence", base, "--set", f"kv.k={codec}",
                               "--set", f"kv.v={codec}"))
        kl[codec] = number(out + err, "mean KL")
    assert 0 < kl["q8_0"] < 5e-3 and kl["q8_0"] * 10 < kl["q4_0"], kl
    # the default's 8-bit activations against f32 (measured: 2.8e-3, same top 95.7%)
    out, err = ok(*tessera(*ppl, "--kl-divergence", base))
    kl["activations q8"] = number(out + err, "mean KL")
    assert 0 < kl["activations q8"] < 1e-2 and kl["activations q8"] < kl["q4_0"] / 10, kl


@case
def test_logit_eq_and_ab_of_two_kv_tiers():
    q8 = os.path.join(TMP, "q8.yaml")
    with open(q8, "w") as f:
        f.write(f"extends: {PROFILE}\nkv:\n  k: q8_0\n  v: q8_0\n")
    out, err = ok(*tessera("logit-eq", TEXT, "--ref", PROFILE, "--cand", q8, "--ctx", "256",
                           "--chunks", "1"))
    assert 0 <= number(out + err, "real_frac") <= 0.05, out + err
    out, err = ok(*tessera("ab", "--profile", PROFILE, "--profile", q8, "--task", "passkey",
                           "--ctx", "768", "--n", "2", "--no-chat"))
    assert out.count("100.0%") >= 2, out + err


finish("default-model")
