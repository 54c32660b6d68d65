#!/usr/bin/env python3
"""tessera convert on each Qwen fixture against what llama.cpp's converter wrote for it.

    test_convert.py TESSERA PLUGIN_DIR FIXTURES_DIR EXPECTED_DIR

For every expected/<fixture>.json (make_expected.py) it converts
tests/reference/fixtures/<fixture> (or the synth_* checkpoint synth_fixtures.py writes) twice
and checks:
  --outtype f32: the same keys with the same types and values, the same tensor names, GGUF
      shapes and dtypes, and bit-identical f32 data; the one tolerance is 1 ulp on tensors
      of at most 64 values, because ssm_a = -exp(A_log) is computed correctly rounded here
      while torch's vectorised exp is not always;
  --outtype f16: which tensors stay f32, the f16 bytes and general.file_type; the other
      keys as for f32.
It also converts broken checkpoints (ERRORS) and checks each is refused with a message
naming the problem, and qwen3_5 stripped of its MTP weights (converts to the trunk alone).
Differences from llama.cpp's file that are intended, each printed as a NOTE:
  - general.name and general.size_label are provenance (tessera names the file after its
    folder; llama.cpp title-cases it and adds a size label);
  - keys listed under tessera_extensions in the expectation, with the reason given there.
Standard library only; a few seconds.
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_summary  # noqa: E402
import synth_fixtures  # noqa: E402

PROVENANCE = {"general.name", "general.size_label"}


def f32_bits(v):
    return struct.unpack("<i", struct.pack("<f", v))[0]


def ulp_apart(a, b):
    if len(a) != len(b):
        return None
    worst = 0
    for x, y in zip(a, b):
        bx, by = f32_bits(x), f32_bits(y)
        if (bx < 0) != (by < 0):
            return None if x != y else worst
        worst = max(worst, abs(bx - by))
    return worst


def same_value(kind, want, got):
    if kind == "f32":
        return f32_bits(want) == f32_bits(got)
    if kind == "arr[f32]":
        return len(want) == len(got) and all(f32_bits(x) == f32_bits(y) for x, y in zip(want, got))
    return want == got


def check_kv(exp, ours, fails, notes, f16):
    arch = exp["kv"]["general.architecture"]["value"]
    extensions = exp.get("tessera_extensions", {})
    for key, want in sorted(exp["kv"].items()):
        if key in PROVENANCE:
            continue
        if key == "general.file_type" and f16:  # the keys come from the f32 run
            want = {"type": "u32", "value": exp["f16_file_type"]}
        got = ours.get(key)
        if got is None:
            fails.append("key %s missing (llama.cpp: %s)" % (key, want))
        elif got["type"] != want["type"]:
            fails.append("key %s: type %s, llama.cpp %s" % (key, got["type"], want["type"]))
        elif "sha256" in want:
            if (got.get("n"), got.get("sha256")) != (want["n"], want["sha256"]):
                fails.append("key %s: %s items differ from llama.cpp's %d" %
                             (key, got.get("n", len(got.get("value", ""))), want["n"]))
        elif "value" not in got or not same_value(want["type"], want["value"], got["value"]):
            fails.append("key %s = %r, llama.cpp %r" % (key, got.get("value"), want["value"]))
    for key in sorted(set(ours) - set(exp["kv"])):
        ext = extensions.get(key)
        if ext and ours[key]["type"] == ext["type"] and ours[key].get("value") == ext["value"]:
            notes.append("%s = %r (tessera extension: %s)" % (key, ext["value"], ext["why"]))
        else:
            fails.append("key %s = %r is not in llama.cpp's file" % (key, ours[key]))


def check_data(name, want_sha, want_values, got, fails, notes, what):
    if got["sha256"] == want_sha:
        return
    if want_values is not None and "values" in got:
        ulps = ulp_apart(want_values, got["values"])
        if ulps is not None and ulps <= 1:
            notes.append("%s: %s within 1 ulp of llama.cpp's" % (name, what))
            return
    detail = ""
    if "sum" in got and want_values is None:
        detail = " (sum %.9g)" % got["sum"]
    fails.append("tensor %s: %s differs from llama.cpp's%s" % (name, what, detail))


def check_tensors(exp, ours, fails, notes, f16):
    want_names, got_names = set(exp["tensors"]), set(ours)
    for n in sorted(want_names - got_names):
        fails.append("tensor %s missing" % n)
    for n in sorted(got_names - want_names):
        fails.append("tensor %s is not in llama.cpp's file" % n)
    for n in sorted(want_names & got_names):
        want, got = exp["tensors"][n], ours[n]
        dtype = want["f16"]["dtype"] if f16 else want["dtype"]
        if got["ne"] != want["ne"] or got["dtype"] != dtype:
            fails.append("tensor %s: ne %s %s, llama.cpp %s %s" %
                         (n, got["ne"], got["dtype"], want["ne"], dtype))
            continue
        if f16:
            values = want.get("values") if dtype == "f32" else None
            check_data(n, want["f16"]["sha256"], values, got, fails, notes, "f16-run data")
        else:
            if abs(got["sum"] - want["sum"]) > 1e-3 * (1 + want["abs_sum"]):
                fails.append("tensor %s: sum %.9g, llama.cpp %.9g" % (n, got["sum"], want["sum"]))
                continue
            check_data(n, want["sha256"], want.get("values"), got, fails, notes, "f32 data")


# Broken checkpoints: (label, synth checkpoint, how it is broken, text the error must hold).
ERRORS = [
    ("missing tensor", "synth_qwen2", {"drop": ["model.layers.1.self_attn.k_proj.bias"]},
     "no tensor 'model.layers.1.self_attn.k_proj.bias'"),
    ("shape mismatch", "synth_qwen2", {"config_changes": {"intermediate_size": 96}},
     "model.layers.0.mlp.gate_proj.weight has shape [128, 64]; config.json implies [96, 64]"),
    ("unconverted tensor", "synth_qwen2",
     {"extra_tensors": [("model.layers.0.self_attn.mystery.weight", [4])]},
     "model.layers.0.self_attn.mystery.weight"),
    ("untied without lm_head", "synth_qwen2", {"drop": ["lm_head.weight"]},
     "tie_word_embeddings false, but the checkpoint has no lm_head.weight"),
    ("unconverted rope scaling", "synth_qwen2", {"config_changes": {"rope_parameters": {
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}},
     "rope_type 'dynamic' is not converted"),
    ("experts without a count", "synth_qwen3_moe_fused", {"config_changes": {"num_experts": None}},
     "a router, but config.json states no expert count"),
]


def check_errors(tessera, plugin_dir, fixtures, tmp):
    passed = failed = 0
    for label, name, breakage, want in ERRORS:
        src = os.path.join(tmp, "broken-" + label.replace(" ", "_"))
        synth_fixtures.write(name, src, os.path.join(fixtures, "qwen3_tied"), **breakage)
        rc, msg = convert(tessera, plugin_dir, src, os.path.join(tmp, "broken.gguf"), "f32")
        if rc != 0 and want in msg and "Sanitizer" not in msg:
            passed += 1
            print("ok   refuses %s: %s" % (label, msg.splitlines()[-1][:160]))
        else:
            failed += 1
            print("FAIL %s: exit %d, wanted an error with %r, got: %s" % (label, rc, want, msg))
    return passed, failed


def check_without_mtp(tessera, plugin_dir, fixtures, tmp):
    """qwen3_5 stripped of its mtp.* tensors (as some published copies are) converts to the
    trunk alone although its config still says mtp_num_hidden_layers 1."""
    src = os.path.join(tmp, "qwen3_5-no-mtp")
    synth_fixtures.copy_without(os.path.join(fixtures, "qwen3_5"), src, "mtp.")
    out = os.path.join(tmp, "no-mtp.gguf")
    rc, msg = convert(tessera, plugin_dir, src, out, "f32")
    if rc != 0:
        print("FAIL qwen3_5 without mtp.*: exit %d: %s" % (rc, msg))
        return 0, 1
    got = gguf_summary.summarise(out)
    bad = [t for t in got["tensors"] if t.startswith("blk.4.")]
    kv = got["kv"]
    layers = kv["qwen35.attention.recurrent_layers"]["value"]
    if kv["qwen35.block_count"]["value"] != 4 or "qwen35.nextn_predict_layers" in kv or bad or \
            [int(v) for v in layers] != [1, 1, 1, 0]:
        print("FAIL qwen3_5 without mtp.*: block_count %s, nextn %s, blk.4 tensors %s" %
              (kv["qwen35.block_count"]["value"], kv.get("qwen35.nextn_predict_layers"), bad))
        return 0, 1
    print("ok   qwen3_5 without mtp.*: 4 blocks, no NextN head")
    return 1, 0


def convert(tessera, plugin_dir, src, out, outtype):
    p = subprocess.run([tessera, "convert", src, out, "--outtype", outtype, "--path", plugin_dir,
                        "--quiet"], capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).strip()


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    tessera, plugin_dir, fixtures, expected = sys.argv[1:]
    paths = sorted(glob.glob(os.path.join(expected, "*.json")))
    if not paths:
        sys.exit("no expectations in %s" % expected)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            with open(path) as f:
                exp = json.load(f)
            name = exp["fixture"]
            for outtype in ("f32", "f16"):
                fails, notes = [], []
                out = os.path.join(tmp, "%s-%s.gguf" % (name, outtype))
                src = os.path.join(fixtures, name)
                if exp.get("synthetic"):
                    src = os.path.join(tmp, name)
                    synth_fixtures.write(name, src, os.path.join(fixtures, "qwen3_tied"))
                rc, msg = convert(tessera, plugin_dir, src, out, outtype)
                if rc != 0:
                    fails.append("tessera convert exited %d: %s" % (rc, msg))
                else:
                    ours = gguf_summary.summarise(out)
                    check_kv(exp, ours["kv"], fails, notes, outtype == "f16")
                    check_tensors(exp, ours["tensors"], fails, notes, outtype == "f16")
                label = "%s --outtype %s" % (name, outtype)
                for n in notes:
                    print("NOTE %s: %s" % (label, n))
                if fails:
                    failed += 1
                    print("FAIL %s:" % label)
                    for x in fails[:40]:
                        print("  " + x)
                    if len(fails) > 40:
                        print("  ... %d more" % (len(fails) - 40))
                else:
                    passed += 1
                    print("ok   %s: %d keys, %d tensors as llama.cpp wrote them" %
                          (label, len(exp["kv"]), len(exp["tensors"])))
        for check in (check_errors, check_without_mtp):
            p, f = check(tessera, plugin_dir, fixtures, tmp)
            passed, failed = passed + p, failed + f
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
