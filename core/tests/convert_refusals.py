#!/usr/bin/env python3
"""`tessera convert` refuses the inputs whose output `tessera run` could not use.

Each case copies a committed fixture (tests/reference/fixtures), breaks one thing a reader
of the written GGUF relies on, converts it, and checks that convert
  - exits 2 (the CLI's code for a malformed or unsupported checkpoint),
  - says so naming the file and the key (each case lists the text its message must hold),
  - leaves the output path as it was: a file already there keeps its bytes, and nothing
    else (no temporary, no partial GGUF) is left beside it.
One case per kind of defect; every one of them converted with exit 0 before these checks.
A clean copy of each fixture used converts (exit 0, replacing the old file), so a case fails
for its defect and not for the copying.

usage: convert_refusals.py TESSERA FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

OLD = b"a file that was here before the conversion\n"


def tok(fn):
    return ("tokenizer.json", fn)


def tok_cfg(fn):
    return ("tokenizer_config.json", fn)


def cfg(fn):
    return ("config.json", fn)


def text_cfg(fn):
    """config.json's text_config (the multimodal fixtures keep the text model there)."""
    return ("config.json", lambda c: fn(c["text_config"]))


def setitem(key, value):
    def f(d):
        d[key] = value
    return f


def delitem(key):
    def f(d):
        del d[key]
    return f


def in_model(fn):
    return lambda t: fn(t["model"])


def rename_token(old, new):
    def f(t):
        t["model"]["vocab"][new] = t["model"]["vocab"].pop(old)
    return f


def duplicate_key(text):
    """JSON text with the vocab entry "ing" renamed to "he", which it already holds: the
    object then lists one key twice (Python's json cannot build that, so text is edited)."""
    assert '"ing": 300' in text
    return text.replace('"ing": 300', '"he": 300', 1)


def merge_of_two_tokens_without_join(t):
    vocab = t["model"]["vocab"]
    singles = sorted(s for s in vocab if len(s) == 1 and s.isalpha())
    for a in singles:
        for b in singles:
            if a + b not in vocab:
                t["model"]["merges"].append([a, b])
                return
    raise AssertionError("no pair without a join")


def text_config_rope(key, value):
    return text_cfg(lambda c: c["rope_parameters"].__setitem__(key, value))


def layer_type(i, kind):
    return text_cfg(lambda c: c["layer_types"].__setitem__(i, kind))


# (what is broken, fixture, [(file, edit)], texts the message must hold)
CASES = [
    # tokenizer.json
    ("empty vocabulary", "qwen3_tied",
     [tok(lambda t: (t["model"].update(vocab={}, merges=[]), t.update(added_tokens=[])))],
     ["tokenizer.json", "model.vocab is empty"]),
    ("a token listed twice", "qwen3_tied", [("tokenizer.json", duplicate_key)],
     ["tokenizer.json", "model.vocab lists 'he' twice"]),
    ("a gap in the token ids", "qwen3_tied", [tok(in_model(lambda m: m["vocab"].pop("ing")))],
     ["tokenizer.json", "1 id below 511", "the first 300"]),
    ("a merge naming an unknown token", "qwen3_tied",
     [tok(in_model(lambda m: m["merges"].append(["zzz", "qqq"])))],
     ["tokenizer.json: model.merges[253]", "'zzz' is not in the vocabulary"]),
    ("a merge whose join is not a token", "qwen3_tied", [tok(merge_of_two_tokens_without_join)],
     ["tokenizer.json: model.merges[253]", "their join is not in the vocabulary"]),
    ("a merge that is not two parts", "qwen3_tied",
     [tok(in_model(lambda m: m["merges"].append("abc")))],
     ["tokenizer.json: model.merges[253] is 'abc'", "expected two parts"]),
    ("no merges", "qwen3_tied", [tok(in_model(setitem("merges", [])))],
     ["tokenizer.json: model.merges is empty"]),
    ("an added token on another token's id", "qwen3_tied",
     [tok(lambda t: t["added_tokens"][0].__setitem__("id", 5))],
     ["tokenizer.json: added_tokens[0] gives id 5 to '<|endoftext|>'", "model.vocab gives it"]),
    ("two added tokens on one id", "qwen3_tied",
     [tok(lambda t: t["added_tokens"][1].__setitem__("id", 509))],
     ["tokenizer.json: added_tokens[1] gives id 509", "an earlier entry to '<|endoftext|>'"]),
    ("added_tokens not a list", "qwen3_tied", [tok(setitem("added_tokens", {"<x>": 1}))],
     ["tokenizer.json: added_tokens should be an array, found an object"]),
    ("a byte-level token missing", "qwen3_tied", [tok(rename_token("\u0100", "\u0100\u0100"))],
     ["tokenizer.json", "lacks '\u0100', the byte-level token of byte 0x00"]),
    ("a SentencePiece-style vocabulary for a byte-level model", "qwen3_tied",
     [tok(in_model(setitem("byte_fallback", True)))],
     ["tokenizer.json: model.byte_fallback is true"]),
    ("a byte-level vocabulary for Gemma 4", "gemma4_dense",
     [tok(in_model(setitem("byte_fallback", False)))],
     ["tokenizer.json: model.byte_fallback is false"]),
    ("a tokenizer_config.json entry of another type", "qwen3_tied",
     [tok_cfg(setitem("eos_token", 5))],
     ["tokenizer_config.json: eos_token should be a string", "found the number 5"]),
    # special token ids in config.json
    ("a special token id past the vocabulary", "qwen3_tied", [cfg(setitem("eos_token_id", 600))],
     ["config.json: eos_token_id should be a token id from 0 to 511", "found the number 600"]),
    ("a listed special token id past the vocabulary", "gemma4_dense",
     [text_cfg(setitem("eos_token_id", [1, 700]))],
     ["config.json: text_config.eos_token_id[1] should be a token id from 0 to 511"]),
    # config.json: types and ranges
    ("rope_parameters not an object", "qwen3_tied", [cfg(setitem("rope_parameters", 5))],
     ["config.json: rope_parameters should be an object", "found the number 5"]),
    ("a config value of another JSON type", "qwen3_tied",
     [cfg(setitem("max_position_embeddings", {}))],
     ["config.json: max_position_embeddings should be an integer", "found an object"]),
    ("no rope_theta", "qwen3_tied", [cfg(lambda c: c["rope_parameters"].pop("rope_theta"))],
     ["config.json has no rope_theta", "qwen3.rope.freq_base"]),
    ("no rms_norm_eps", "qwen3_tied", [cfg(delitem("rms_norm_eps"))],
     ["config.json has no rms_norm_eps", "qwen3.attention.layer_norm_rms_epsilon"]),
    ("rms_norm_eps not positive", "qwen3_tied", [cfg(setitem("rms_norm_eps", -1e-6))],
     ["config.json: rms_norm_eps should be a finite number above 0", "found the number -1e-06"]),
    ("rope_theta not positive", "qwen3_tied",
     [cfg(lambda c: c["rope_parameters"].__setitem__("rope_theta", 0))],
     ["config.json: rope_parameters.rope_theta should be a finite number above 0"]),
    ("a number past a 32-bit float's range", "qwen3_tied",
     [cfg(lambda c: c["rope_parameters"].__setitem__("rope_theta", 1e300))],
     ["qwen3.rope.freq_base would be inf", "does not fit a 32-bit float"]),
    ("partial_rotary_factor above 1", "qwen3_5", [text_config_rope("partial_rotary_factor", 2)],
     ["config.json: text_config.rope_parameters.partial_rotary_factor should be a number above 0 "
      "and at most 1"]),
    ("mrope_section of more than four sections", "qwen3_5",
     [text_config_rope("mrope_section", [11, 11, 10, 0, 4])],
     ["config.json: text_config.rope_parameters.mrope_section has 5 sections"]),
    ("a scaled sliding-layer rope Gemma 4 would drop", "gemma4_dense",
     [text_cfg(lambda c: c["rope_parameters"].__setitem__(
         "sliding_attention", {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}))],
     ["config.json: rope_parameters.sliding_attention.rope_type is 'linear'"]),
    # config.json: layers
    ("layer_types not one per layer", "qwen3_tied",
     [cfg(lambda c: c["layer_types"].pop())],
     ["config.json: layer_types has 3 entries, but num_hidden_layers is 4"]),
    ("an unknown layer type", "qwen3_5", [layer_type(3, "sliding_attention")],
     ["config.json: text_config.layer_types[3] is 'sliding_attention'"]),
    ("layer_types against full_attention_interval", "qwen3_5",
     [text_cfg(setitem("full_attention_interval", 2))],
     ["config.json: text_config.layer_types[1] is linear_attention",
      "full_attention_interval 2 makes layer 1 full_attention"]),
    ("no sliding window where layers slide", "gemma4_dense",
     [text_cfg(setitem("sliding_window", 0))],
     ["config.json: sliding_window is 0", "sliding_attention layers"]),
    # config.json: experts, and tensors against the config
    ("more experts per token than experts", "qwen3_moe_norm",
     [cfg(setitem("num_experts_per_tok", 20))],
     ["config.json: num_experts_per_tok is 20; expected 1 to num_experts (8)"]),
    ("experts without experts per token", "qwen3_moe_norm", [cfg(delitem("num_experts_per_tok"))],
     ["config.json: 8 experts", "no num_experts_per_tok"]),
    ("top_k_experts above num_experts", "gemma4_moe", [text_cfg(setitem("top_k_experts", 16))],
     ["config.json: top_k_experts is 16; expected 1 to num_experts (8)"]),
    ("experts in the config of a dense checkpoint", "qwen3_tied",
     [cfg(lambda c: c.update(num_experts=8, num_experts_per_tok=2))],
     ["config.json gives 8 experts, but block 0 has no router"]),
    ("moe_intermediate_size against the expert tensors", "qwen3_moe_norm",
     [cfg(setitem("moe_intermediate_size", 32))],
     ["model.layers.0.mlp.experts.0.gate_proj.weight has an expert FFN width of 64",
      "moe_intermediate_size is 32"]),
]


def copy_fixture(src, dst):
    """Copies a fixture's small files and links its weights (never edited here)."""
    os.makedirs(dst)
    for name in os.listdir(src):
        s = os.path.join(src, name)
        if name.endswith(".safetensors"):
            os.symlink(os.path.abspath(s), os.path.join(dst, name))
        elif os.path.isfile(s):
            shutil.copy(s, os.path.join(dst, name))


def edit(folder, name, fn):
    path = os.path.join(folder, name)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if fn is duplicate_key:
        text = fn(json.dumps(json.loads(text), ensure_ascii=False))
    else:
        doc = json.loads(text)
        fn(doc)
        text = json.dumps(doc, ensure_ascii=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def convert(tessera, src, out_dir):
    """Converts src into out_dir/out.gguf, where a file is already waiting."""
    out = os.path.join(out_dir, "out.gguf")
    os.makedirs(out_dir)
    with open(out, "wb") as f:
        f.write(OLD)
    p = subprocess.run([tessera, "convert", src, out, "--outtype", "f32", "--quiet"],
                       capture_output=True, text=True)
    with open(out, "rb") as f:
        after = f.read()
    return p.returncode, (p.stdout + p.stderr).strip(), after, sorted(os.listdir(out_dir))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tessera, fixtures = sys.argv[1:]
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="tsr-convert-refusals-") as tmp:
        for i, fixture in enumerate(sorted({c[1] for c in CASES})):
            src = os.path.join(tmp, "clean-" + fixture)
            copy_fixture(os.path.join(fixtures, fixture), src)
            rc, msg, after, left = convert(tessera, src, os.path.join(tmp, "clean-out-%d" % i))
            if rc == 0 and after != OLD and left == ["out.gguf"]:
                passed += 1
                print("ok   %s, copied, converts" % fixture)
            else:
                failed += 1
                print("FAIL %s, copied: exit %d, %s: %s" % (fixture, rc, left, msg[-400:]))
        for i, (what, fixture, edits, needles) in enumerate(CASES):
            src = os.path.join(tmp, "case-%02d" % i)
            copy_fixture(os.path.join(fixtures, fixture), src)
            for name, fn in edits:
                edit(src, name, fn)
            rc, msg, after, left = convert(tessera, src, os.path.join(tmp, "out-%02d" % i))
            problems = []
            if rc != 2:
                problems.append("exit %d, expected 2" % rc)
            problems += ["no %r in the message" % n for n in needles if n not in msg]
            if "Sanitizer" in msg:
                problems.append("a sanitizer report")
            if after != OLD:
                problems.append("the file at the output path changed")
            if left != ["out.gguf"]:
                problems.append("left beside the output: %s" % left)
            if problems:
                failed += 1
                print("FAIL %s (%s): %s\n     message: %s" % (what, fixture, "; ".join(problems),
                                                            msg))
            else:
                passed += 1
                print("ok   refuses %s: %s" % (what, msg.splitlines()[-1][-200:]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
