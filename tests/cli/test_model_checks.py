"""A GGUF whose hyperparameters and tensors disagree is refused at load, naming both.

usage: test_model_checks.py TESSERA_BINARY SOURCE_ROOT RANDOM_MODEL.gguf

Each case takes a valid model (the build's tiny random qwen3, the committed gemma4
reference model), changes one thing with gguf_edit.py and runs `tessera run` on it:
a key that disagrees with the tensor shapes, a per-layer tensor missing from one
layer, a non-finite or non-positive float hyperparameter must fail with exit 2 and a
message naming the key or tensor, what was expected and what was found; a tensor the
model never reads must be warned of in one line and the run must go on, its text the
same as the unmodified file's. Prints "ok   name" / "FAIL name" per case.
"""
import os
import shutil
import subprocess
import sys
import tempfile

from cases import case, finish
from gguf_edit import ARRAY, F32, F32_T, I32, U32, GGUF

TESSERA, SOURCE, QWEN = sys.argv[1], sys.argv[2], sys.argv[3]
GEMMA = os.path.join(SOURCE, "models", "ref-gemma4-23m.gguf")
TMP = tempfile.mkdtemp(prefix="tsr_model_checks_")


def run(model):
    p = subprocess.run([TESSERA, "run", "-m", model, "-p", "Hello", "-n", "4", "--temp", "0"],
                       capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def edited(src, name, edit):
    g = GGUF.read(src)
    edit(g)
    path = os.path.join(TMP, name + ".gguf")
    g.write(path)
    return path


def refused(src, name, edit, *needles):
    path = edited(src, name, edit)
    code, out, err = run(path)
    assert code == 2, f"{name}: exit {code} (expected 2, a refusal); stderr: {err.strip()}"
    assert not out, f"{name}: generated {out!r} from a refused model"
    for needle in needles:
        assert needle in err, f"{name}: {needle!r} not in stderr:\n{err.strip()}"
    assert path in err, f"{name}: the message does not name the file:\n{err.strip()}"


def warnings(err):
    return [line for line in err.splitlines() if "warning" in line]


def baseline(model):
    code, out, err = run(model)
    assert code == 0, f"{model}: exit {code}; stderr: {err.strip()}"
    assert not warnings(err), f"{model}: a valid model warned:\n{err.strip()}"
    return out


QWEN_TEXT = None
GEMMA_TEXT = None


@case
def test_the_unmodified_models_run_without_warnings():
    global QWEN_TEXT, GEMMA_TEXT
    QWEN_TEXT = baseline(QWEN)
    GEMMA_TEXT = baseline(GEMMA)
    assert QWEN_TEXT and GEMMA_TEXT


@case
def test_q_norm_missing_from_one_layer_is_refused():
    refused(QWEN, "no_q_norm_1", lambda g: g.drop_tensor("blk.1.attn_q_norm.weight"),
            "blk.1.attn_q_norm.weight is missing (layer 0 has it)")
    # the other way round: a stray norm where the first layer has none
    refused(QWEN, "no_q_norm_0", lambda g: g.drop_tensor("blk.0.attn_q_norm.weight"),
            "blk.1.attn_q_norm.weight is present but layer 0 lacks it")


@case
def test_unknown_tensors_are_warned_of_and_the_model_runs():
    def add(g):
        g.add_tensor("extra.weight", [64], F32_T, bytes(64 * 4))
        g.add_tensor("blk.0.attn_extra.weight", [64], F32_T, bytes(64 * 4))
    path = edited(QWEN, "extra", add)
    code, out, err = run(path)
    assert code == 0, f"exit {code}; stderr: {err.strip()}"
    lines = warnings(err)
    assert len(lines) == 1, f"expected one warning line:\n{err.strip()}"
    assert "2 of its 27 tensors are read by no qwen3 graph" in lines[0], lines[0]
    assert "extra.weight" in lines[0] and "blk.0.attn_extra.weight" in lines[0], lines[0]
    assert out == QWEN_TEXT, f"{out!r} != {QWEN_TEXT!r}"


@case
def test_the_unused_tensor_list_is_capped():
    def add(g):
        for i in range(12):
            g.add_tensor(f"extra.{i}.weight", [64], F32_T, bytes(64 * 4))
    code, out, err = run(edited(QWEN, "extras", add))
    assert code == 0, f"exit {code}; stderr: {err.strip()}"
    lines = warnings(err)
    assert len(lines) == 1 and "12 of its 37 tensors" in lines[0], err
    assert "extra.7.weight, ..." in lines[0] and "extra.8.weight" not in lines[0], lines[0]


@case
def test_embedding_length_disagreeing_with_the_embedding_is_refused():
    refused(QWEN, "embd", lambda g: g.set("qwen3.embedding_length", U32, 96),
            "qwen3.embedding_length is 96 but token_embd.weight has 64 columns (shape [64, ")


@case
def test_feed_forward_length_disagreeing_with_the_ffn_is_refused():
    def edit(g):
        g.set("qwen3.feed_forward_length", U32, g.get_u32("qwen3.feed_forward_length") + 32)
    refused(QWEN, "ff", edit, "qwen3.feed_forward_length is ", " but blk.0.ffn_gate.weight has ",
            " rows")
    # gemma4: per-layer lengths, one of them wrong
    refused(GEMMA, "gemma_ff", lambda g: g.set("gemma4.feed_forward_length", ARRAY,
                                               (I32, [1152] * 7 + [1024])),
            "gemma4.feed_forward_length[7] is 1024 but blk.7.ffn_gate.weight has 1152 rows")


@case
def test_head_count_disagreeing_with_the_projections_is_refused():
    refused(QWEN, "heads", lambda g: g.set("qwen3.attention.head_count_kv", U32, 1),
            "qwen3.attention.head_count_kv x key_length", "but blk.0.attn_k.weight has ")


@case
def test_an_lm_head_of_another_vocabulary_is_refused():
    def edit(g):
        g.drop_tensor("output.weight")
        g.add_tensor("output.weight", [64, 258], F32_T, bytes(64 * 258 * 4))
    refused(QWEN, "vocab", edit, "is 259 but output.weight has 258 rows")


@case
def test_rope_freq_base_inf_is_refused():
    refused(QWEN, "freq_inf", lambda g: g.set("qwen3.rope.freq_base", F32, float("inf")),
            "qwen3.rope.freq_base is inf: must be a finite positive number")


@case
def test_nan_epsilon_is_refused():
    refused(QWEN, "eps_nan",
            lambda g: g.set("qwen3.attention.layer_norm_rms_epsilon", F32, float("nan")),
            "qwen3.attention.layer_norm_rms_epsilon is nan: must be a finite positive number")


@case
def test_a_non_positive_softcap_is_refused():
    refused(GEMMA, "softcap", lambda g: g.set("gemma4.final_logit_softcapping", F32, 0.0),
            "gemma4.final_logit_softcapping is 0: must be a finite positive number")


@case
def test_a_non_finite_float_the_arch_does_not_read_is_refused():
    refused(QWEN, "attn_factor",
            lambda g: g.set("qwen3.rope.scaling.attn_factor", F32, float("-inf")),
            "qwen3.rope.scaling.attn_factor is -inf: must be a finite number")


@case
def test_a_value_projection_missing_from_one_layer_of_a_kind_is_refused():
    # sliding layers 0, 2, 4, 6 all have attn_v; the full layers are another kind
    refused(GEMMA, "no_v", lambda g: g.drop_tensor("blk.4.attn_v.weight"),
            "blk.4.attn_v.weight is missing (layers 0, 2, 6 have it)")


shutil.rmtree(TMP, ignore_errors=True)
finish("model check")
