"""A GGUF file summarised as comparable data (Python standard library only).

summarise(path) returns {"kv": {...}, "tensors": {...}}:
  kv[key]      = {"type": "u32" | "f32" | "str" | "bool" | "arr[i32]" | ..., plus
                  "value" (scalars, strings up to 256 bytes, arrays up to 64 items)
                  or "n" and "sha256" (longer ones: the digest of their JSON form)}
  tensors[name] = {"ne": [...], "dtype": "f32" | "f16" | ..., "sha256": of the data bytes,
                   and for f32: "sum", "abs_sum" (math.fsum) and, up to 64 values, "values"}
make_expected.py writes this for llama.cpp's output; test_convert.py computes it for
tessera's and compares.
"""
import array
import hashlib
import json
import math
import struct

SCALARS = {0: ("u8", "<B"), 1: ("i8", "<b"), 2: ("u16", "<H"), 3: ("i16", "<h"),
           4: ("u32", "<I"), 5: ("i32", "<i"), 6: ("f32", "<f"), 7: ("bool", "<?"),
           10: ("u64", "<Q"), 11: ("i64", "<q"), 12: ("f64", "<d")}
STRING, ARRAY = 8, 9
# ggml type id: (name, block size, bytes per block)
DTYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
          6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 10: ("q2_K", 256, 84),
          11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176),
          14: ("q6_K", 256, 210), 30: ("bf16", 1, 2)}
MAX_INLINE = 64


class _Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t == STRING:
            return "str", self.string()
        if t == ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            items = [self.value(et)[1] for _ in range(n)]
            return "arr[%s]" % ("str" if et == STRING else SCALARS[et][0]), items
        name, fmt = SCALARS[t]
        return name, self.take(fmt)


def _kv_entry(type_name, value):
    if isinstance(value, list) and len(value) > MAX_INLINE or \
            isinstance(value, str) and len(value.encode()) > 256:
        blob = json.dumps(value, ensure_ascii=False).encode("utf-8")
        return {"type": type_name, "n": len(value), "sha256": hashlib.sha256(blob).hexdigest()}
    return {"type": type_name, "value": value}


def summarise(path):
    with open(path, "rb") as f:
        r = _Reader(f.read())
    if r.take("<I") != 0x46554747:
        raise ValueError("%s: not a GGUF file" % path)
    version = r.take("<I")
    if version not in (2, 3):
        raise ValueError("%s: GGUF version %d" % (path, version))
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        type_name, value = r.value(r.take("<I"))
        kv[key] = _kv_entry(type_name, value)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    align = kv.get("general.alignment", {}).get("value", 32)
    base = (r.pos + align - 1) // align * align
    tensors = {}
    for name, ne, t, offset in infos:
        dname, block, block_bytes = DTYPES[t]
        count = math.prod(ne)
        raw = r.data[base + offset:base + offset + count // block * block_bytes]
        entry = {"ne": ne, "dtype": dname, "sha256": hashlib.sha256(raw).hexdigest()}
        if dname == "f32":
            vals = array.array("f")
            vals.frombytes(raw)
            entry["sum"] = math.fsum(vals)
            entry["abs_sum"] = math.fsum(abs(v) for v in vals)
            if count <= MAX_INLINE:
                entry["values"] = list(vals)
        tensors[name] = entry
    return {"kv": kv, "tensors": tensors}
