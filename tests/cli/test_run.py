"""`tessera run` as a user meets it: determinism, token limits, chat rendering, exit codes.

usage: test_run.py TESSERA_BINARY SOURCE_ROOT RANDOM_MODEL.gguf
       test_run.py TESSERA_BINARY SOURCE_ROOT --real
On the build's tiny random model (random-model.gguf) the text is noise, but greedy decoding
and a fixed seed make it repeatable. --real greedy-completes a Python prompt with the real
Qwen2.5-Coder 0.5B (fetched by tests/reference/real/fetch_models.py).
Prints "ok   name" / "FAIL name" per case, like the C tests.
"""
import os
import re
import subprocess
import sys
import tempfile
from cases import case, finish

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]


def run(*args, stdin=None):
    p = subprocess.run([TESSERA, "run", *args], capture_output=True, timeout=300,
                       input=(stdin or "").encode())
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")




def ok(code, out, err):
    assert code == 0, f"exit {code}; stderr: {err.strip()}"
    return out, err


def generated(err):
    m = re.search(r"generated: (\d+) tokens", err)
    assert m, f"no 'generated:' line in stderr:\n{err}"
    return int(m.group(1))


def real():
    fetch = os.path.join(SOURCE, "tests", "reference", "real", "fetch_models.py")
    subprocess.run([sys.executable, fetch, "--model", "qwen2.5-coder-0.5b"], check=True,
                   stdout=sys.stderr)
    model = subprocess.run([sys.executable, fetch, "--path", "qwen2.5-coder-0.5b"], check=True,
                           capture_output=True, text=True).stdout.strip()
    prompt = 'def is_even(n):\n    """Return True if n is even."""\n'
    code, out, err = run("-m", model, "-p", prompt, "-n", "12", "--temp", "0", "--verbose")
    print(out)
    assert code == 0, f"exit {code}; stderr: {err.strip()}"
    # observed greedy output: "    return n % 2 == 0\n..."
    assert "return n % 2 == 0" in out, f"unexpected completion: {out!r}"
    assert generated(err) <= 12
    print("ok   real_qwen25_coder_greedy_completes_python")
    return 0


if MODEL == "--real":
    sys.exit(real())

TMP = tempfile.mkdtemp(prefix="tsr_run_")
M = ["-m", MODEL]


@case
def test_greedy_twice_gives_identical_output():
    a = ok(*run(*M, "-p", "Hello", "-n", "16", "--temp", "0"))[0]
    b = ok(*run(*M, "-p", "Hello", "-n", "16", "--temp", "0"))[0]
    assert a == b, f"{a!r} != {b!r}"
    assert a.strip(), "no output"


@case
def test_backend_cuda_without_a_gpu_fails_naming_what_is_missing():
    # this machine has no GPU (or no driver, or a build without the backend): the
    # loader's message, exit 2, no crash; where a GPU answers, the run must succeed
    code, out, err = run(*M, "-p", "Hello", "-n", "4", "--temp", "0", "--set", "backend=cuda")
    if code == 0:
        assert out.strip(), "cuda run printed nothing"
        return
    assert code == 2, f"exit {code} (want 2); stderr: {err.strip()}"
    assert "--set backend" in err and "cuda backend" in err, f"unclear message: {err.strip()}"
    assert any(w in err for w in ("no CUDA driver", "not found", "no CUDA GPU", "cannot load",
                                  "older than")), f"no reason given: {err.strip()}"
    env = dict(os.environ, TESSERA_CUDA_BACKEND=os.path.join(TMP, "missing.so"))
    p = subprocess.run([TESSERA, "run", *M, "-p", "Hello", "-n", "4", "--set", "backend=cuda"],
                       capture_output=True, timeout=300, env=env)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2, f"exit {p.returncode} (want 2); stderr: {err.strip()}"
    assert "libtessera-cuda.so not found" in err and "missing.so" in err, err.strip()


@case
def test_n_limits_the_tokens_generated():
    out, err = ok(*run(*M, "-p", "Hello", "-n", "5", "--temp", "0", "--verbose"))
    assert generated(err) == 5, err
    assert "stop: limit" in err


@case
def test_seed_makes_sampling_reproducible():
    args = [*M, "-p", "Hello", "-n", "16", "--temp", "1.5", "--top-k", "0", "--top-p", "1",
            "--min-p", "0"]
    a = ok(*run(*args, "--seed", "7"))[0]
    b = ok(*run(*args, "--seed", "7"))[0]
    assert a == b, f"same seed, different text: {a!r} != {b!r}"
    others = {ok(*run(*args, "--seed", str(s)))[0] for s in (8, 9, 10)}
    assert others != {a}, "the seed changes nothing"


@case
def test_random_seed_is_printed_with_verbose():
    out, err = ok(*run(*M, "-p", "x", "-n", "1", "--seed", "-1", "--verbose"))
    assert re.search(r"seed \d+ \(random\)", err), err


@case
def test_timing_goes_to_stderr():
    out, err = ok(*run(*M, "-p", "Hello", "-n", "3", "--temp", "0"))
    assert re.search(r"prompt eval: \d+ tokens in [\d.]+ ms \([\d.]+ tok/s\)", err), err
    assert re.search(r"\neval: \d+ tokens", err), err
    assert "tok/s" not in out


@case
def test_prompt_from_file_matches_prompt_flag():
    path = os.path.join(TMP, "prompt.txt")
    with open(path, "w") as f:
        f.write("Hello")
    a = ok(*run(*M, "-f", path, "-n", "8", "--temp", "0"))[0]
    b = ok(*run(*M, "-p", "Hello", "-n", "8", "--temp", "0"))[0]
    assert a == b


@case
def test_bad_flags_exit_2_with_a_message():
    cases = [
        (["-p", "x"], "-m MODEL.gguf or --profile"),
        ([*M], "no prompt"),
        ([*M, "-p", "x", "--temp", "hot"], "--temp: 'hot'"),
        ([*M, "-p", "x", "-n", "-5"], "-n: '-5'"),
        ([*M, "-p", "x", "--frobnicate", "1"], "unknown option '--frobnicate'"),
        ([*M, "-p", "x", "--top-p", "0"], "top_p"),
        ([*M, "-p", "x", "--system", "s"], "--system needs --chat"),
        ([*M, "-p", "x", "-n"], "-n needs a value"),
        ([*M, "-f", os.path.join(TMP, "missing.txt")], "missing.txt"),
        (["-m", os.path.join(TMP, "missing.gguf"), "-p", "x"], "missing.gguf"),
    ]
    for args, needle in cases:
        code, out, err = run(*args)
        assert code == 2, f"{args}: exit {code}, wanted 2; stderr: {err.strip()}"
        assert needle in err, f"{args}: '{needle}' not in: {err.strip()}"


@case
def test_require_engaged_passes_for_the_arch_and_fails_for_an_absent_plugin():
    ok(*run(*M, "-p", "x", "-n", "2", "--require-engaged", "arch_qwen"))
    code, out, err = run(*M, "-p", "x", "-n", "2", "--require-engaged", "attn_dca")
    assert code == 2, f"exit {code}; {err}"
    assert "attn_dca" in err and "is loaded" in err, err


@case
def test_chat_without_a_gguf_template_uses_the_arch_plugins():
    # the random model's GGUF has no tokenizer.chat_template: arch_qwen knows Qwen's ChatML
    code, out, err = run(*M, "--chat", "-n", "2", "--verbose", stdin="hi\n")
    ok(code, out, err)
    assert "chat template: chatml (arch plugin arch_qwen)" in err, err
    assert "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" in err, err


@case
def test_unknown_chat_template_name_is_a_usage_error():
    code, out, err = run(*M, "--chat", "--chat-template", "nope", stdin="hi\n")
    assert code == 2, f"exit {code}; {err}"
    assert "nope" in err and "chatml" in err, err


def converted_chatml_model():
    path = os.path.join(TMP, "qwen3_tied.gguf")
    fixture = os.path.join(SOURCE, "tests", "reference", "fixtures", "qwen3_tied")
    p = subprocess.run([TESSERA, "convert", fixture, path, "--outtype", "f32", "--quiet"],
                       capture_output=True, text=True)
    assert p.returncode == 0, f"convert: {p.stderr}"
    return path


@case
def test_chat_renders_the_models_template_and_keeps_the_conversation():
    model = converted_chatml_model()
    code, out, err = run("-m", model, "--chat", "--system", "S", "-p", "hi", "-n", "3",
                         "--temp", "0", "--verbose", stdin="again\n")
    ok(code, out, err)
    assert "chat template: chatml (tokenizer.chat_template)" in err, err
    assert "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" \
           "<|im_start|>assistant\n" in err, err
    # the second turn holds the first reply and evaluates only what is new
    assert "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n" in err, err
    held = [int(m) for m in re.findall(r"(\d+) already held", err)]
    assert len(held) == 2 and held[0] == 0 and held[1] > 0, err


@case
def test_chat_template_flag_overrides_the_models():
    model = converted_chatml_model()
    code, out, err = run("-m", model, "--chat", "--chat-template", "gemma", "--system", "S",
                         "-p", "hi", "-n", "2", "--temp", "0", "--verbose")
    ok(code, out, err)
    assert "chat template: gemma (--chat-template)" in err, err
    assert "<start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\n" in err, err
    code, out, err = run("-m", model, "--chat", "--chat-template", "jinja", "-p", "hi")
    assert code == 2 and "'jinja'" in err, f"exit {code}: {err}"


@case
def test_plain_prompt_on_a_chat_model_is_not_templated():
    model = converted_chatml_model()
    code, out, err = run("-m", model, "-p", "hi", "-n", "2", "--temp", "0", "--verbose")
    ok(code, out, err)
    assert "rendered prompt" not in err and "<|im_start|>" not in err, err


def converted_fixture(name):
    path = os.path.join(TMP, name + ".gguf")
    if not os.path.exists(path):
        fixture = os.path.join(SOURCE, "tests", "reference", "fixtures", name)
        p = subprocess.run([TESSERA, "convert", fixture, path, "--outtype", "f32", "--quiet"],
                           capture_output=True, text=True)
        assert p.returncode == 0, f"convert: {p.stderr}"
    return path


@case
def test_convert_token_embedding_type_keeps_the_embedding_apart():
    fixture = os.path.join(SOURCE, "tests", "reference", "fixtures", "qwen3_tied")
    path = os.path.join(TMP, "embd_f16.gguf")
    p = subprocess.run([TESSERA, "convert", fixture, path, "--outtype", "q8_0",
                        "--token-embedding-type", "f16"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    by_type = re.search(r"by type:(.*)", p.stderr)
    assert by_type and re.search(r"\bf16 1\b", by_type.group(1)) and "q8_0" in by_type.group(1), \
        p.stderr
    ok(*run("-m", path, "-p", "Hello", "-n", "4", "--temp", "0"))
    p = subprocess.run([TESSERA, "convert", fixture, path, "--token-embedding-type", "q3_K"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--token-embedding-type 'q3_K'" in p.stderr, p.stderr


@case
def test_full_context_shifts_and_generation_goes_on():
    model = converted_fixture("qwen3_tied")
    code, out, err = run("-m", model, "-p", "Hello world", "--set", "context=32", "-n", "80",
                         "--temp", "0", "--verbose")
    ok(code, out, err)
    assert generated(err) == 80, err
    notes = re.findall(r"context full at 32 tokens: shifted, kept the first 4, dropped the next "
                       r"(\d+)", err)
    assert len(notes) >= 2, err
    code, out, err = run("-m", model, "-p", "Hello world", "--set", "context=32", "-n", "40",
                         "--temp", "0", "--verbose", "--keep", "10")
    ok(code, out, err)
    assert generated(err) == 40 and "kept the first 10, dropped the next 11" in err, err
    code, out, err = run("-m", model, "-p", "Hello world", "--keep", "-3")
    assert code == 2 and "--keep" in err, f"exit {code}: {err}"


@case
def test_model_that_cannot_shift_stops_or_fails_as_before():
    model = converted_fixture("qwen3_5")
    args = ("-m", model, "-p", "Hello world", "--set", "context=32", "--temp", "0", "--verbose")
    code, out, err = run(*args, "-n", "-1")
    ok(code, out, err)
    assert "(stopped: context full" in err and "linear (recurrent)" in err, err
    assert "shifted" not in err, err
    code, out, err = run(*args, "-n", "80")
    assert code == 1, f"exit {code}: {err}"
    assert "context full" in err and "linear (recurrent)" in err, err


finish()
