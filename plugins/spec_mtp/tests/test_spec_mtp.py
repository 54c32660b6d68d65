"""spec_mtp through `tessera run` and `tessera profile check` on the embedded default model:
greedy speculation gives exactly the plain greedy text while the engine really drafted and
the target really kept drafts (lookup on a retrieval prompt, draft_model with the model as
its own draft), seeded sampling reproduces, sampled drafts carry their distribution (a
self-draft is kept above temperature 0 too), and every setting that cannot work is refused
at `profile check` naming it.
usage: test_spec_mtp.py TESSERA SOURCE_ROOT BUILD_ROOT"""
import json
import os
import re
import subprocess
import sys
import tempfile

TESSERA, SOURCE, BUILD = sys.argv[1:4]
DEFAULT = os.path.join(BUILD, "core", "cli", "default-model.gguf")
GEMMA = os.path.join(SOURCE, "models", "ref-gemma4-23m.gguf")
ASSISTANT = os.path.join(SOURCE, "models", "ref-gemma4-23m-assistant.gguf")
RANDOM = os.path.join(BUILD, "core", "cli", "random-model.gguf")
TMP = tempfile.mkdtemp(prefix="spec_mtp_")
PASSKEY = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
           "memorize it. The grass is green. The sky is blue. The pass key is 71432. Remember "
           "it. 71432 is the pass key. The grass is green. The sky is blue. What is the pass "
           "key? The pass key is")
failures = 0


def case(fn):
    global failures
    try:
        fn()
        print(f"ok   {fn.__name__}", flush=True)
    except AssertionError as e:
        failures += 1
        print(f"FAIL {fn.__name__}\n  {e}", flush=True)
    return fn


def profile(name, settings):
    path = os.path.join(TMP, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"model: {DEFAULT}\nplugins:\n  - arch_qwen\n  - name: spec_mtp\n"
                f"    settings: {{{settings}}}\nspeculator: {{name: spec_mtp}}\n")
    return path


def run(*args):
    p = subprocess.run([TESSERA, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def counters(err):
    m = re.search(r"spec_mtp\s+tokens_drafted=(\d+), tokens_accepted=(\d+)", err)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def plain(prompt, n, *extra):
    code, out, err = run("run", "-m", DEFAULT, "-p", prompt, "-n", str(n), *extra)
    assert code == 0, err
    return out


@case
def test_lookup_drafts_from_the_prompt_and_changes_nothing():
    code, out, err = run("run", "--profile", profile("lookup", "engine: lookup"), "-p", PASSKEY,
                         "-n", "24", "--temp", "0", "--verbose")
    assert code == 0, err
    assert out == plain(PASSKEY, 24, "--temp", "0"), (out, err)
    drafted, kept = counters(err)
    assert drafted > 0 and kept > 0, err
    assert "71432" in out


@case
def test_a_draft_model_equal_to_the_target_is_always_kept():
    path = profile("self", f"engine: draft_model, model: {DEFAULT}, p_min: 0")
    for prompt, least in (("The capital of France is", 32), (PASSKEY, 1)):  # the key ends soon
        code, out, err = run("run", "--profile", path, "-p", prompt, "-n", "64", "--temp", "0",
                             "--verbose")
        assert code == 0, err
        assert out == plain(prompt, 64, "--temp", "0"), (prompt, out)
        drafted, kept = counters(err)
        assert drafted >= least and kept >= 0.9 * drafted, err
    err = run("run", "--profile", path, "-p", "The capital of France is", "-n", "64", "--temp",
              "0")[2]
    steps = int(re.search(r"eval: (\d+) speculative steps for 64", err).group(1))
    assert steps < 32, steps  # several tokens a step: the adaptive length grew


@case
def test_fixed_length_and_p_min_hold_back_drafts():
    fixed = profile("fixed", f"engine: draft_model, model: {DEFAULT}, adaptive: false, n_max: 2, "
                             "p_min: 0")
    code, out, err = run("run", "--profile", fixed, "-p", "Hello", "-n", "33", "--temp", "0",
                         "--verbose")
    assert code == 0, err
    drafted, _ = counters(err)
    assert drafted == 22 and "11 speculative steps for 33" in err, err  # 2 drafts + 1 a step
    sure = profile("sure", f"engine: draft_model, model: {DEFAULT}, p_min: 1")
    code, out, err = run("run", "--profile", sure, "-p", "Hello", "-n", "16", "--temp", "0",
                         "--verbose")
    assert code == 0 and counters(err)[0] == 0, err  # nothing is that certain
    assert out == plain("Hello", 16, "--temp", "0")


@case
def test_sampling_with_a_seed_reproduces():
    path = profile("sampled", f"engine: draft_model, model: {DEFAULT}")
    args = ("run", "--profile", path, "-p", "Once upon a time", "-n", "40", "--temp", "0.8",
            "--seed", "11", "--verbose")
    a, b = run(*args), run(*args)
    assert a[0] == 0 and a[1] == b[1], (a[2], b[2])
    assert counters(a[2])[0] > 0, a[2]


@case
def test_sampled_drafts_come_with_their_distribution():
    # above temperature 0 the draft is drawn from the draft model's own sampling
    # distribution, which the host's speculative sampling weighs: a self-draft is kept
    path = profile("self_sampled", f"engine: draft_model, model: {DEFAULT}, p_min: 0")
    for temp in ("0.8", "1.3"):
        args = ("run", "--profile", path, "-p", "Once upon a time", "-n", "48", "--temp", temp,
                "--seed", "5", "--verbose")
        code, out, err = run(*args)
        assert code == 0, err
        drafted, kept = counters(err)
        assert drafted >= 24 and kept >= 0.9 * drafted, (temp, err)
        assert run(*args)[1] == out  # drawn from the sequence's own seed: reproducible


QWEN35_MTP = os.path.join(SOURCE, "models", "ref-qwen35-9m-mtp.gguf")


SQLITE = ("The sqlite3 module provides an interface to the SQLite database. To use the "
          "module, you must first create a Connection object that represents the database.")


def trained_drafts_kept(model, plugins, engine, prompt, floors, kv=""):
    """Greedy speculation with a trained head or drafter gives the plain greedy text of the
    same profile, and keeps at least floors[p_min] of its drafts at each p_min."""
    head = f"model: {model}\n{kv}plugins:\n" + "".join(f"  - {p}\n" for p in plugins)
    tag = re.sub(r"\W+", "_", f"{os.path.basename(model)}_{kv}")
    plain = os.path.join(TMP, f"plain_{tag}.yaml")
    with open(plain, "w") as f:
        f.write(head)
    code, want, err = run("run", "--profile", plain, "-p", prompt, "-n", "96", "--temp", "0")
    assert code == 0, err
    for p_min, least in floors:
        path = os.path.join(TMP, f"spec_{tag}_{p_min}.yaml")
        with open(path, "w") as f:
            f.write(f"{head}  - name: spec_mtp\n    settings: {{{engine}, p_min: {p_min}}}\n"
                    f"speculator: {{name: spec_mtp}}\n")
        code, out, err = run("run", "--profile", path, "-p", prompt, "-n", "96", "--temp", "0",
                             "--verbose")
        assert code == 0, err
        assert out == want, (kv, p_min, out[:200], want[:200])
        drafted, kept = counters(err)
        print(f"     {os.path.basename(model)} {kv.strip()} p_min {p_min}: kept {kept} of "
              f"{drafted}", flush=True)
        assert drafted >= 20 and kept >= least * drafted, (kv, p_min, drafted, kept)


@case
def test_nextn_with_the_trained_head_keeps_drafts_and_changes_nothing():
    """models/ref-qwen35-9m-mtp.gguf's head, trained with its trunk: its drafts through the
    head's own cache are kept often (a broken cache or chain would keep almost none: the
    fixtures' random heads keep 0 of 300), and the text is the plain greedy one."""
    trained_drafts_kept(QWEN35_MTP, ["arch_qwen"], "engine: nextn", SQLITE,
                        (("0", 0.2), ("0.5", 0.5)))


@case
def test_assistant_with_the_trained_drafter_keeps_drafts_and_changes_nothing():
    """models/ref-gemma4-23m-assistant.gguf, trained on ref-gemma4-23m's own predictions, reads
    the target's K/V and hidden rows: its drafts are kept often (a drafter reading the wrong
    layer, window or hidden row keeps few), and the text is the plain greedy one; with turbo4
    K/V too, the drafter reading the rotated rows through the codec's transforms. The prompt
    is longer than the target's 128-token sliding window."""
    prompt = SQLITE + (
        " Here the data will be stored in the example.db file. Once you have a Connection, "
        "you can create a Cursor object and call its execute() method to perform SQL commands. "
        "The data you have saved is persistent and is available in subsequent sessions. "
        "Usually your SQL operations will need to use values from Python variables. You "
        "should not assemble your query using Python's string operations because doing so is "
        "insecure; it makes your program vulnerable to an SQL injection attack.")
    engine = f"engine: assistant, model: {ASSISTANT}"
    trained_drafts_kept(GEMMA, ["arch_gemma4"], engine, prompt, (("0", 0.1),))
    trained_drafts_kept(GEMMA, ["arch_gemma4", "kv_turbo"], engine, prompt, (("0", 0.1),),
                        kv="kv: {k: turbo4, v: turbo4}\n")


@case
def test_bench_times_speculation_and_counts_its_steps():
    text = os.path.join(TMP, "bench_prompt.txt")
    with open(text, "w") as f:
        f.write(PASSKEY * 3)
    out = os.path.join(TMP, "bench.json")
    code, table, err = run("bench", "--profile", profile("bench", "engine: lookup"), "-p", "0",
                           "-n", "24", "-d", "64", "-r", "2", "--warmup", "0", "--speculate",
                           "--prompt-file", text, "--json", out)
    assert code == 0, err
    assert "tg24 spec @ d64" in table and "speculation, tg24 spec @ d64:" in table, table
    assert "kept by draft position: 1:" in table, table
    with open(out) as f:
        tests = json.load(f)["tests"]
    assert [t["kind"] for t in tests] == ["tg", "tg_spec"], tests
    sp = tests[1]["speculation"]
    assert sp["steps"] > 0 and 0 < sp["accepted"] <= sp["drafted"], sp
    assert sp["tokens_per_step"] == (sp["accepted"] + sp["steps"]) / sp["steps"], sp
    assert sum(p["kept"] for p in sp["kept_by_position"]) == sp["accepted"], sp
    assert sp["speedup_over_plain_tg"] > 0 and sp["verify_seconds"] > 0, sp
    # hostile text: NUL bytes, invalid UTF-8, special-token names, a lone surrogate's bytes
    odd = os.path.join(TMP, "odd_prompt.txt")
    with open(odd, "wb") as f:
        f.write((b"a\x00b \xff\xfe\xc3( <|im_start|><|endoftext|> \xed\xa0\x80 " * 40))
    code, table, err = run("bench", "--profile", profile("bench", "engine: lookup"), "-p", "0",
                           "-n", "8", "-d", "32", "-r", "1", "--warmup", "0", "--speculate",
                           "--prompt-file", odd)
    assert code == 0 and "tg8 spec @ d32" in table, err
    # the text must be there and cover the depths
    for prompt_file, depth, needle in ((text, "5000", "the depths need 5000"),
                                       (os.path.join(TMP, "none.txt"), "8", "none.txt")):
        code, _, err = run("bench", "--profile", profile("bench", "engine: lookup"), "-p", "0",
                           "-n", "4", "-d", depth, "--speculate", "--prompt-file", prompt_file)
        assert code == 2 and needle in err, err


@case
def test_refusals_at_profile_check():
    cases = [
        ("nextn_without_head", "engine: nextn", "has none (qwen3.nextn_predict_layers is absent)"),
        ("nextn_with_model", f"engine: nextn, model: {DEFAULT}", "uses no model"),
        ("assistant_no_model", "engine: assistant", "engine assistant needs a model"),
        ("assistant_not_a_drafter", f"engine: assistant, model: {DEFAULT}", "is not a drafter"),
        ("assistant_vocab", f"engine: assistant, model: {ASSISTANT}", "vocabular"),
        ("with_model", f"engine: lookup, model: {DEFAULT}", "uses no model"),
        ("no_model", "engine: draft_model", "needs a model"),
        ("missing", "engine: draft_model, model: /nonexistent/draft.gguf", "draft.gguf"),
        ("gemma_vocab", f"engine: draft_model, model: {GEMMA}", "vocabulary"),
        ("random_vocab", f"engine: draft_model, model: {RANDOM}", "vocabulary"),
        ("n_min", "engine: lookup, n_min: 5, n_max: 3", "n_min 5"),
        ("ngram", "engine: lookup, ngram_min: 4, ngram_max: 2", "ngram_min 4"),
        ("bad_engine", "engine: medusa", "medusa"),
        ("bad_n", "engine: lookup, n_max: 9", "n_max"),
    ]
    for name, settings, want in cases:
        code, out, err = run("profile", "check", profile(name, settings))
        assert code == 2 and want in err, f"{name}: exit {code}: {err.strip()[-300:]}"


sys.exit(1 if failures else 0)
