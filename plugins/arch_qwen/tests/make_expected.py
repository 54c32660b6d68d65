#!/usr/bin/env python3
"""Writes tests/expected/<fixture>.json: what llama.cpp's converter makes of each Qwen fixture.

    python3 plugins/arch_qwen/tests/make_expected.py LLAMA_CPP_DIR [--only qwen3_5 ...]

LLAMA_CPP_DIR is a llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/); the
expectations in the repository came from the one vendored in the llama-cpp-python 0.3.36
source package (README.md says how to get it). Needs torch, transformers and numpy, as
llama.cpp's converter does. Nothing of llama.cpp is copied: its converter runs, and only a
summary of its output (gguf_summary.py) is stored.

The synth_* checkpoints are not stored: synth_fixtures.py writes them, here and in the test.
Each fixture is converted twice, with --outtype f32 (keys, tensor shapes and f32 data) and
--outtype f16 (which tensors llama.cpp keeps in f32, and the f16 bytes).

The fixtures' tokenizers are trained by tests/reference, so llama.cpp's table of pre-tokenizer
hashes cannot know them; the run names the pre-tokenizer their flavour stands for
("qwen2" for qwen3/qwen3_moe, "qwen35" for qwen3_5*), as llama.cpp does for the released
checkpoints, by replacing the hash lookup and nothing else.
"""
import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
import gguf_summary  # noqa: E402
import synth_fixtures  # noqa: E402

FIXTURES = {"qwen3_tied": "qwen2", "qwen3_untied": "qwen2", "qwen3_moe_norm": "qwen2",
            "qwen3_moe_nonorm": "qwen2", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35"}
FIXTURES.update({name: "qwen2" for name in synth_fixtures.SYNTH})


def run_llama_cpp(lc, pre, args):
    """Child mode: llama.cpp's converter with the pre-tokenizer name given."""
    sys.path[:0] = [lc, os.path.join(lc, "gguf-py")]
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = [os.path.join(lc, "convert_hf_to_gguf.py")] + args
    runpy.run_path(sys.argv[0], run_name="__main__")


def convert(lc, fixture_dir, pre, outtype, out):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", lc, pre, fixture_dir,
           "--outtype", outtype, "--outfile", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("llama.cpp failed on %s (%s):\n%s" % (fixture_dir, outtype, p.stderr[-4000:]))


def tessera_extensions(fixture_dir):
    """Keys tessera writes that llama.cpp does not, with the reason (convert_qwen.c)."""
    with open(os.path.join(fixture_dir, "config.json")) as f:
        cfg = json.load(f)
    ext = {}
    if cfg.get("model_type") == "qwen3_moe" and cfg.get("norm_topk_prob") is False:
        ext["qwen3moe.expert_weights_norm"] = {
            "type": "bool", "value": False,
            "why": "llama.cpp hard-codes renormalised top-k for qwen3moe and writes no key, so "
                   "a norm_topk_prob=false model would run wrong; tessera states it with "
                   "llama.cpp's own key (which llama.cpp's qwen3moe loader ignores)"}
    return ext


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_llama_cpp(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llama_cpp", help="llama.cpp source tree")
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "reference", "fixtures"))
    ap.add_argument("--out", default=os.path.join(HERE, "expected"))
    ap.add_argument("--label", default="llama.cpp vendored in llama-cpp-python 0.3.36, "
                    "gguf-py 0.19.0", help="what produced the expectations, for the record")
    ap.add_argument("--only", nargs="*", default=sorted(FIXTURES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.only:
        fixture_dir = os.path.join(a.fixtures, name)
        pre = FIXTURES[name]
        with tempfile.TemporaryDirectory() as tmp:
            if name in synth_fixtures.SYNTH:
                fixture_dir = os.path.join(tmp, name)
                synth_fixtures.write(name, fixture_dir, os.path.join(a.fixtures, "qwen3_tied"))
            f32, f16 = os.path.join(tmp, "f32.gguf"), os.path.join(tmp, "f16.gguf")
            convert(a.llama_cpp, fixture_dir, pre, "f32", f32)
            convert(a.llama_cpp, fixture_dir, pre, "f16", f16)
            s32, s16 = gguf_summary.summarise(f32), gguf_summary.summarise(f16)
            extensions = tessera_extensions(fixture_dir)
        if sorted(s32["tensors"]) != sorted(s16["tensors"]):
            sys.exit("%s: f32 and f16 runs wrote different tensors" % name)
        diff = [k for k in set(s32["kv"]) | set(s16["kv"])
                if k != "general.file_type" and s32["kv"].get(k) != s16["kv"].get(k)]
        if diff:
            sys.exit("%s: f32 and f16 runs wrote different keys: %s" % (name, diff))
        for t, e in s32["tensors"].items():
            e["f16"] = {"dtype": s16["tensors"][t]["dtype"], "sha256": s16["tensors"][t]["sha256"]}
        doc = {
            "fixture": name,
            "reference": a.label + ": convert_hf_to_gguf.py --outtype f32 (tensor 'f16' "
                         "fields: --outtype f16), pre-tokenizer '%s' named (make_expected.py)"
                         % pre,
            "kv": s32["kv"],
            "f16_file_type": s16["kv"]["general.file_type"]["value"],
            "tensors": s32["tensors"],
            "synthetic": name in synth_fixtures.SYNTH,
            "tessera_extensions": extensions,
        }
        path = os.path.join(a.out, name + ".json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True, ensure_ascii=False)
            f.write("\n")
        print("wrote %s: %d keys, %d tensors" % (path, len(doc["kv"]), len(doc["tensors"])))


if __name__ == "__main__":
    main()
