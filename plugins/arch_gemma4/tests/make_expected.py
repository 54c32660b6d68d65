#!/usr/bin/env python3
"""Writes tests/expected/<fixture>.json: what llama.cpp's converter makes of each
gemma4 reference fixture, as data the C test compares `tessera convert` against.

    python3 make_expected.py --llama-cpp DIR [--fixtures DIR] [--out DIR]

DIR is a llama.cpp source tree (convert_hf_to_gguf.py and gguf-py/); the
expectations in the repository came from the tree vendored in the PyPI sdist
llama-cpp-python 0.3.36 (`pip download llama-cpp-python==0.3.36 --no-deps
--no-binary :all:`, vendor/llama.cpp), run with transformers 5.17 and torch.
Nothing of llama.cpp is kept: only the keys, tensor names, shapes, types and
checksums its output holds.

Per fixture, from `convert_hf_to_gguf.py --outtype f32`:
  keys     every metadata key: GGUF type (tessera's names: u32, i32, f32, bool,
           string, array) and value (arrays: element type and all elements)
  tensors  name -> ne (GGUF order), dtype, fnv1a64 of the f32 bytes as
           stored, and the first values (for messages)
and from `--outtype q8_0`: the dtype llama.cpp stores each tensor in (its
rule for what stays f32 and what falls back to f16).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FIXTURES = ["gemma4_dense", "gemma4_moe", "gemma4_e2b", "gemma4_assistant"]
TYPE_NAMES = {"UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16", "UINT32": "u32",
              "INT32": "i32", "FLOAT32": "f32", "BOOL": "bool", "STRING": "string",
              "ARRAY": "array", "UINT64": "u64", "INT64": "i64", "FLOAT64": "f64"}


def fnv1a64(data: bytes) -> str:
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def plain(v):
    """A reader value as JSON: f32 widened exactly, ints as ints, bytes as text."""
    import numpy as np
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8")
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.integer, int)):
        return int(v)
    return v


def convert(llama_cpp, fixture_dir, outtype, out_path):
    cmd = [sys.executable, os.path.join(llama_cpp, "convert_hf_to_gguf.py"), fixture_dir,
           "--outtype", outtype, "--outfile", out_path]
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_cpp, "gguf-py"))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-4000:]}")


def describe(gguf, path):
    r = gguf.GGUFReader(path)
    keys = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue  # header fields the reader presents as keys
        t = TYPE_NAMES[gguf.GGUFValueType(f.types[0]).name]
        entry = {"type": t, "value": plain(f.contents())}
        if t == "array":
            entry["elem"] = TYPE_NAMES[gguf.GGUFValueType(f.types[1]).name]
        keys[name] = entry
    tensors = {}
    for t in r.tensors:
        data = t.data.tobytes()
        tensors[t.name] = {"ne": [int(x) for x in t.shape], "dtype": t.tensor_type.name.lower()}
        if t.tensor_type.name == "F32":
            tensors[t.name]["fnv1a64"] = fnv1a64(data)
            tensors[t.name]["head"] = [float(x) for x in t.data.reshape(-1)[:4]]
    return keys, tensors


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--fixtures", default=os.path.join(root, "tests", "reference", "fixtures"))
    ap.add_argument("--out", default=os.path.join(here, "expected"))
    ap.add_argument("--source", default="llama.cpp vendored in llama-cpp-python 0.3.36")
    ap.add_argument("--only", nargs="*", default=FIXTURES)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.llama_cpp, "gguf-py"))
    import gguf
    commit = subprocess.run(["git", "-C", a.llama_cpp, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fx in a.only:
            fdir = os.path.join(a.fixtures, fx)
            f32 = os.path.join(tmp, fx + ".f32.gguf")
            q8 = os.path.join(tmp, fx + ".q8_0.gguf")
            convert(a.llama_cpp, fdir, "f32", f32)
            convert(a.llama_cpp, fdir, "q8_0", q8)
            keys, tensors = describe(gguf, f32)
            _, q8_tensors = describe(gguf, q8)
            doc = {
                "fixture": fx,
                "producer": {"tool": "convert_hf_to_gguf.py", "source": a.source,
                             "llama_cpp_commit": commit},
                "keys": keys,
                "tensors": tensors,
                "q8_0_dtypes": {n: t["dtype"] for n, t in q8_tensors.items()},
            }
            out = os.path.join(a.out, fx + ".json")
            with open(out, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True, ensure_ascii=False)
                f.write("\n")
            print(f"{out}: {len(keys)} keys, {len(tensors)} tensors")


if __name__ == "__main__":
    main()
