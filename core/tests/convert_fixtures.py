#!/usr/bin/env python3
"""`tessera convert` end to end on the committed reference fixtures.

Needs the arch plugins (arch_qwen, arch_gemma4) built in the same tree: the
binary finds them on its build-tree plugin path. Checks, for every fixture:
convert at f32 succeeds and `tessera gguf info` reads the result with the
core's keys; then for one Qwen and one Gemma fixture the quantized outtypes
(file types, fallback notes), and the failures a user must see: a checkpoint
tensor no rule reads, an unknown model_type, a truncated safetensors file.

usage: convert_fixtures.py TESSERA FIXTURES_DIR
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

TESSERA, FIXTURES = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("  FAIL:", what)


def run(*args):
    p = subprocess.run([TESSERA, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def info(path):
    rc, out, err = run("gguf", "info", path)
    check(rc == 0, f"gguf info {path}: rc {rc} {err.strip()}")
    keys = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\S+)\s+(\S+)\s+(.*)$", line)
        if m:
            keys[m.group(1)] = m.group(3).strip()
    return keys


def convert_ok(src, out, outtype):
    rc, _, err = run("convert", src, out, "--outtype", outtype)
    check(rc == 0, f"convert {os.path.basename(src)} --outtype {outtype}: rc {rc}: {err.strip()[-400:]}")
    return rc == 0, err


def add_tensor(st_path, name):
    """Appends a small F32 tensor to a safetensors file (rewriting its header)."""
    with open(st_path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    header[name] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(st_path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data + struct.pack("<2f", 1.0, 2.0))


def main():
    tmp = tempfile.mkdtemp(prefix="tsr-convert-fixtures-")
    try:
        names = sorted(d for d in os.listdir(FIXTURES)
                       if os.path.isfile(os.path.join(FIXTURES, d, "config.json")))
        check(len(names) >= 10, f"expected the 10 fixtures, found {names}")
        for name in names:
            src = os.path.join(FIXTURES, name)
            out = os.path.join(tmp, name + ".gguf")
            print(name)
            ok, _ = convert_ok(src, out, "f32")
            if not ok:
                continue
            k = info(out)
            check(k.get("general.name") == '"%s"' % name, f"{name}: general.name {k.get('general.name')}")
            check(k.get("general.file_type") == "0", f"{name}: general.file_type {k.get('general.file_type')}")
            check("general.architecture" in k, f"{name}: no general.architecture")
            check("tokenizer.ggml.tokens" in k and "tokenizer.ggml.merges" in k,
                  f"{name}: no tokenizer")

        for name, outtype, ftype in [("qwen3_tied", "q8_0", 7), ("qwen3_tied", "q4_K", 14),
                                     ("gemma4_dense", "q6_K", 18), ("gemma4_dense", "bf16", 32)]:
            out = os.path.join(tmp, f"{name}-{outtype}.gguf")
            ok, err = convert_ok(os.path.join(FIXTURES, name), out, outtype)
            if not ok:
                continue
            k = info(out)
            check(k.get("general.file_type") == str(ftype), f"{name} {outtype}: file_type {k.get('general.file_type')}")
            check(k.get("general.quantization_version") == "2", f"{name} {outtype}: quantization_version")
            if outtype.endswith("_K"):  # hidden 64: every k-quant row falls back, and says so
                notes = [l for l in err.splitlines() if l.startswith("note: ")]
                check(notes and all("stored as q8_0" in l for l in notes), f"{name} {outtype}: notes {notes[:2]}")
                check(re.search(r"\d+ tensors? stored in another type", err), f"{name} {outtype}: summary")

        # usage errors
        rc, _, err = run("convert", os.path.join(FIXTURES, "qwen3_tied"), os.path.join(tmp, "x.gguf"),
                         "--outtype", "q3_K")
        check(rc == 2 and "q3_K" in err and "q4_K" in err, f"bad --outtype: rc {rc} {err.strip()}")
        rc, _, err = run("convert", os.path.join(FIXTURES, "qwen3_tied"))
        check(rc == 2 and "usage" in err, f"one argument: rc {rc}")
        rc, _, err = run("convert", os.path.join(tmp, "no-such-dir"), os.path.join(tmp, "x.gguf"))
        check(rc == 2 and "no-such-dir" in err, f"missing folder: rc {rc} {err.strip()}")

        # a tensor no rule reads fails the conversion, naming it
        bad = os.path.join(tmp, "extra")
        shutil.copytree(os.path.join(FIXTURES, "qwen3_tied"), bad)
        add_tensor(os.path.join(bad, "model.safetensors"), "model.layers.0.mlp.extra_proj.weight")
        rc, _, err = run("convert", bad, os.path.join(tmp, "extra.gguf"))
        check(rc == 2 and "model.layers.0.mlp.extra_proj.weight" in err, f"unread tensor: rc {rc} {err.strip()}")
        check(not os.path.exists(os.path.join(tmp, "extra.gguf")), "unread tensor: output written")

        # an unknown model_type names itself and the known ones
        unk = os.path.join(tmp, "unknown")
        shutil.copytree(os.path.join(FIXTURES, "qwen3_tied"), unk)
        cfg = json.load(open(os.path.join(unk, "config.json")))
        cfg["model_type"] = "llama_not_here"
        json.dump(cfg, open(os.path.join(unk, "config.json"), "w"))
        rc, _, err = run("convert", unk, os.path.join(tmp, "unknown.gguf"))
        check(rc == 2 and "'llama_not_here'" in err and "qwen3" in err and "gemma4" in err,
              f"unknown model_type: rc {rc} {err.strip()}")

        # a truncated checkpoint is a clear error, not a crash
        trunc = os.path.join(tmp, "trunc")
        shutil.copytree(os.path.join(FIXTURES, "qwen3_tied"), trunc)
        st = os.path.join(trunc, "model.safetensors")
        os.truncate(st, os.path.getsize(st) - 1000)
        rc, _, err = run("convert", trunc, os.path.join(tmp, "trunc.gguf"))
        check(rc == 2 and "model.safetensors" in err and "truncated" in err, f"truncated: rc {rc} {err.strip()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
