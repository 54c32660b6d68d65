"""The Python package over libtessera on the embedded default model."""
import gc
import math
import os
import shutil
import subprocess
import sys
import threading

import pytest

from tessera import Engine, TesseraError, library_version

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine():
    with Engine(server__parallel=2, context=2048) as e:
        yield e


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_version_and_what_the_engine_is(engine):
    assert library_version().count(".") == 2
    assert engine.arch == "qwen3" and engine.n_vocab > 1000
    assert engine.n_ctx == 2048 and engine.n_seq == 2
    assert engine.setting("context") == ("2048", "--set context")
    text = engine.describe()
    assert "# resolved profile" in text and "model: " in text and "memory" in text


def test_greedy_text_equals_tessera_run(engine):
    cli = os.environ["TESSERA_CLI"]
    p = subprocess.run([cli, "run", "-m", engine.model_path, "-p", PROMPT, "-n", "16",
                        "--temp", "0"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    ours = engine.generate(PROMPT, 16, temperature=0)
    assert p.stdout == ours + "\n"
    assert engine.last_stop == "limit" and engine.stats()["generated"] == 16
    assert engine.generate(PROMPT, 16, temperature=0) == ours  # and again, reusing the prompt
    assert engine.stats()["prompt_reused"] == len(engine.tokenize(PROMPT, parse_special=True)) - 1


def test_stream_yields_the_generated_text(engine):
    pieces = list(engine.stream(PROMPT, 24, temperature=0))
    assert len(pieces) > 1 and "".join(pieces) == engine.generate(PROMPT, 24, temperature=0)


def test_leaving_a_stream_cancels_it(engine):
    it = engine.stream("Once upon a time", -1, temperature=0)
    first = [next(it) for _ in range(3)]
    it.close()
    assert engine.last_stop == "cancelled" and len(first) == 3
    assert engine.stats()["generated"] < engine.n_ctx / 2
    assert engine.generate("Hello", 4, temperature=0)  # the engine goes on


def test_cancel_from_another_thread(engine):
    it = engine.stream("Hello there", -1, temperature=0, keep=-1)
    next(it)
    t = threading.Thread(target=engine.cancel)
    t.start()
    t.join()
    rest = list(it)
    assert engine.last_stop == "cancelled", (engine.last_stop, len(rest))


def test_chat_and_templates(engine):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"}]
    text = engine.format_chat(msgs)
    assert "<|im_start|>user\nHi <|im_end|><|im_end|>" in text
    end = engine.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(end) == 1 and engine.tokenize_chat(msgs).count(end[0]) == 2
    assert engine.chat(msgs, 8, temperature=0) == engine.chat(msgs, 8, temperature=0)
    assert engine.chat_template("gemma")[0] == "gemma"
    assert "<start_of_turn>" in engine.format_chat(msgs[1:])
    assert engine.chat_template()[0] == "chatml"


def test_tokens_round_trip(engine):
    text = "naïve café ☕ — tokens"
    assert engine.detokenize(engine.tokenize(text, add_special=False)) == text


def test_hostile_text(engine):
    # NULs inside, a long text: tokens hold them; a lone surrogate cannot be UTF-8 at all
    for text in ("a\x00b\x00", "x" * 200_000 + "\x00é"):
        assert engine.detokenize(engine.tokenize(text, add_special=False)) == text
    with pytest.raises(UnicodeEncodeError):
        engine.tokenize("\ud800")
    # a prompt past the context fails naming it, and the sequence is left as it was
    engine.seq_rm(0)
    with pytest.raises(TesseraError, match="context"):
        engine.generate(list(range(100, 100 + engine.n_ctx + 5)), 2)
    assert engine.seq_len(0) == 0
    # special tokens in plain text are text unless asked for
    end = engine.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert end[0] not in engine.tokenize("<|im_end|>", add_special=False)


def test_seeded_sampling_reproduces(engine):
    a = engine.generate(PROMPT, 12, temperature=0.9, seed=1234)
    assert a == engine.generate(PROMPT, 12, temperature=0.9, seed=1234)


def test_logprobs_match_eval(engine):
    tokens = engine.tokenize("A quick brown fox", parse_special=True)
    engine.seq_rm(0)
    engine.seq_rm(1)
    lp = engine.logprobs(tokens, seq=0)
    assert len(lp) == len(tokens) - 1 and all(x <= 0 for x in lp)
    logits = engine.eval(tokens[:2], seq=1)
    m = max(logits)
    want = logits[tokens[2]] - m - math.log(sum(math.exp(x - m) for x in logits))
    assert abs(lp[1] - want) < 1e-4
    engine.seq_cp(1, 0)
    assert engine.seq_len(0) == 2
    engine.seq_keep(1)
    assert engine.seq_len(0) == 0


def test_counters(engine):
    engine.reset_counters()
    engine.generate("Hi", 2, temperature=0)
    assert engine.counters()[("arch_qwen", "forward_graphs")] >= 1


def test_bad_input_raises_clear_exceptions(engine):
    with pytest.raises(TesseraError, match="nonexistent.yaml") as e:
        Engine(profile="/nonexistent.yaml")
    assert e.value.status in ("i/o error", "invalid argument")
    with pytest.raises(TesseraError, match="contxt"):
        Engine(contxt=4)
    with pytest.raises(TesseraError, match="model.gguf"):
        Engine(model="/nonexistent/model.gguf")
    with pytest.raises(TypeError):
        engine.tokenize(5)
    with pytest.raises(TypeError):
        engine.generate([1, "x"])
    with pytest.raises(TesseraError, match="sequence 5"):
        engine.generate("x", 2, seq=5)
    with pytest.raises(TesseraError, match="robot"):
        engine.chat([{"role": "robot", "content": "x"}])
    with pytest.raises(TypeError):
        engine.chat([{"role": "user"}])
    with pytest.raises(TesseraError, match="top_p"):
        engine.generate("x", 2, top_p=0)
    with pytest.raises(TesseraError, match="temprature"):
        engine._sampler({"temprature": 1})
    with pytest.raises(TesseraError, match="outside the vocabulary|vocabulary"):
        engine.detokenize([engine.n_vocab + 3])
    with pytest.raises(TesseraError, match="empty"):
        engine.generate([], 2)


def test_a_closed_engine_refuses_calls():
    with Engine(context=256) as e:
        assert e.generate("Hi", 2, temperature=0) is not None
    with pytest.raises(TesseraError, match="closed"):
        e.generate("Hi", 2)
    e.close()  # twice is harmless


def test_many_engines_do_not_leak():
    for _ in range(3):
        Engine(context=256).close()
    gc.collect()
    before = rss_kib()
    for _ in range(25):
        with Engine(context=256) as e:
            e.generate("Hi", 2, temperature=0)
    gc.collect()
    grown = rss_kib() - before
    assert grown < 16 * 1024, f"RSS grew {grown} KiB over 25 engines"


def test_pip_installs_the_package(tmp_path):
    # from a copy: setuptools writes build/ and egg-info beside the sources
    src = str(tmp_path / "python")
    shutil.copytree(os.path.dirname(HERE), src, ignore=shutil.ignore_patterns("tests", "build",
                                                                              "*.egg-info"))
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", str(tmp_path / "site"), src],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    code = "import tessera, sys; print(tessera.__file__); print(tessera.library_version())"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    q = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path), timeout=120)
    assert q.returncode == 0, q.stderr
    assert str(tmp_path / "site") in q.stdout
