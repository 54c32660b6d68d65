#!/usr/bin/env python3
"""Malformed GGUF corpus: generate the cases and check `tessera gguf info` on them.

  corpus.py write DIR [--valid-only]        write the files (fuzz seeds use this)
  corpus.py check --tessera EXE --dir DIR [--wrapper "valgrind -q --error-exitcode=99"]

Files are generated at test time into the build directory, not committed.
Each malformed case must make `tessera gguf info` exit with 2, print a
message on stderr that names the file and matches the case's expected
pattern, and not die from a signal; each valid case must exit 0.
Python 3 standard library only.
"""
import argparse
import os
import re
import shlex
import struct
import subprocess
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
F32_T, F16_T, Q4_0_T, Q8_0_T, Q4_K_T = 0, 1, 2, 8, 12
TYPE_BYTES = {F32_T: (1, 4), F16_T: (1, 2), Q4_0_T: (32, 18), Q8_0_T: (32, 34),
              Q4_K_T: (256, 144)}
M64 = (1 << 64) - 1


class Builder:
    """Appends GGUF fields and remembers where each one starts."""

    def __init__(self):
        self.b = bytearray()
        self.marks = []  # (offset, label)

    def mark(self, label):
        self.marks.append((len(self.b), label))

    def raw(self, data, label=None):
        if label:
            self.mark(label)
        self.b += data

    def u32(self, v, label=None):
        self.raw(struct.pack("<I", v & 0xFFFFFFFF), label)

    def u64(self, v, label=None):
        self.raw(struct.pack("<Q", v & M64), label)

    def string(self, s, label="string", length=None):
        if isinstance(s, str):
            s = s.encode()
        self.u64(len(s) if length is None else length, label + " length")
        if s:
            self.raw(s, label + " bytes")

    def header(self, n_tensors, n_kv, version=3, magic=b"GGUF"):
        self.raw(magic, "magic")
        self.u32(version, "version")
        self.u64(n_tensors, "tensor count")
        self.u64(n_kv, "kv count")

    def kv(self, key, vtype, value):
        self.string(key, "key")
        self.u32(vtype, "value type")
        self.value(vtype, value)

    def value(self, vtype, value):
        if vtype == STRING:
            self.string(value, "string value")
        elif vtype == ARRAY:
            etype, items = value
            self.u32(etype, "array element type")
            self.u64(len(items), "array length")
            for it in items:
                self.value(etype, it)
        else:
            self.raw(struct.pack(SCALAR_FMT[vtype], value), "value")

    def tensor_info(self, name, dims, ttype, offset):
        self.string(name, "tensor name")
        self.u32(len(dims), "n_dims")
        for d in dims:
            self.u64(d, "dimension")
        self.u32(ttype, "tensor type")
        self.u64(offset, "tensor offset")

    def pad(self, align=32, label="padding"):
        if len(self.b) % align:
            self.raw(bytes(align - len(self.b) % align), label)

    def data(self, n, label="tensor data"):
        self.raw(bytes((i * 37 + 11) & 0xFF for i in range(n)), label)


def nbytes(dims, ttype):
    bs, ts = TYPE_BYTES[ttype]
    n = dims[0] // bs * ts
    for d in dims[1:]:
        n *= d
    return n


def layout(tensors, align=32):
    """Offsets for (name, dims, type) tensors packed in order."""
    out, off = [], 0
    for name, dims, ttype in tensors:
        out.append((name, dims, ttype, off))
        off += nbytes(dims, ttype)
        off += (align - off % align) % align
    return out


BASE_KV = [
    ("general.architecture", STRING, "llama"),
    ("general.alignment", U32, 32),
    ("llama.context_length", U32, 4096),
    ("llama.rope.freq_base", F32, 10000.0),
    ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<unk>", "<s>", "hello"])),
    ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, -1.0, -2.5])),
    ("general.flag", BOOL, 1),
]
BASE_TENSORS = [("token_embd.weight", [8, 3], F32_T), ("blk.0.attn_q.weight", [32, 2], Q8_0_T),
                ("output_norm.weight", [8], F16_T)]


def build(kvs=BASE_KV, tensors=None, align=32, version=3, n_kv=None, n_tensors=None,
          data_extra=0, truncate_data=0):
    """A file from pairs and laid-out tensors; counts may lie on purpose."""
    laid = tensors if tensors is not None else layout(BASE_TENSORS, align)
    g = Builder()
    g.header(len(laid) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv,
             version)
    for k in kvs:
        g.kv(*k)
    for t in laid:
        g.tensor_info(*t)
    g.pad(align)
    end = 0
    for name, dims, ttype, off in laid:
        try:
            end = max(end, off + nbytes(dims, ttype))
        except (KeyError, ZeroDivisionError, IndexError):
            pass
    end = min(end, 1 << 12)  # huge claimed sizes: the file stays small
    g.data(max(0, end + data_extra - truncate_data))
    return g


def valid_cases():
    cases = {"valid_base": bytes(build().b)}
    cases["valid_empty"] = bytes(build(kvs=[], tensors=[]).b)
    cases["valid_v2"] = bytes(build(version=2).b)
    kvs = [k for k in BASE_KV if k[0] != "general.alignment"] + [("general.alignment", U32, 256)]
    cases["valid_align256"] = bytes(build(kvs=kvs, tensors=layout(BASE_TENSORS, 256), align=256).b)
    cases["valid_empty_strings"] = bytes(build(
        kvs=[("general.name", STRING, ""), ("t.empty", ARRAY, (STRING, ["", ""])),
             ("t.none", ARRAY, (U8, []))]).b)
    every = [("s.%d" % t, t, v) for t, v in [(U8, 255), (I8, -128), (U16, 65535), (I16, -32768),
                                             (U32, 0xFFFFFFFF), (I32, -1), (F32, 1.5),
                                             (BOOL, 0), (U64, M64), (I64, -(1 << 63)),
                                             (F64, -0.25)]]
    every += [("a.%d" % t, ARRAY, (t, [v, v])) for _, t, v in every]
    cases["valid_every_type"] = bytes(build(kvs=every).b)
    q4k = layout([("q4k", [256, 2], Q4_K_T), ("q40", [64], Q4_0_T)])
    cases["valid_quant_types"] = bytes(build(tensors=q4k).b)
    return cases


def truncation_cases():
    """The base file cut at every field boundary and one byte into each field."""
    g = build()
    full = bytes(g.b)
    exact = {0: "truncated: magic", 2: "truncated: magic", 4: "truncated: version",
             6: "truncated: version", 8: "truncated: tensor count",
             12: "truncated: tensor count", 16: "truncated: kv count", 20: "truncated: kv count"}
    short = "truncated|exceeds|can hold|bytes are left|extends past end of file"
    out = {}
    cuts = set()
    starts = {off for off, _ in g.marks}
    for off, label in g.marks:
        for cut in (off, off + 1):
            if cut >= len(full) or cut in cuts or (cut == off + 1 and cut in starts):
                continue
            cuts.add(cut)
            lab = re.sub(r"[^a-z0-9]+", "_", label)
            out["trunc_%04d_%s" % (cut, lab)] = (full[:cut], exact.get(cut, short))
    # Inside the last tensor's data: the data, not the header, is short.
    out["trunc_last_tensor_data"] = (full[:len(full) - 5], "extends past end of file")
    return out


def malformed_cases():
    c = {}  # name -> (bytes, expected regex)

    def add(name, g, want):
        c[name] = (bytes(g.b if isinstance(g, Builder) else g), want)

    # 1. magic and version
    for name, magic in [("magic_ggml", b"GGML"), ("magic_lower", b"gguf"),
                        ("magic_zero", b"\0\0\0\0")]:
        g = Builder()
        g.header(0, 0, magic=magic)
        add(name, g, "bad magic")
    for v, want in [(0, "version 0"), (1, "version 1 is not supported"),
                    (0x03000000, "byte-swapped"), (0x02000000, "byte-swapped"),
                    (0x01000000, "byte-swapped"), (4, "version 4 is not supported"),
                    (0xFFFFFFFF, "version 4294967295")]:
        add("version_%08x" % v, build(version=v), want)

    # 2. counts negative or near 2^63
    for n in [1 << 63, M64, (1 << 63) - 1, 1 << 40]:
        add("n_kv_%x" % n, build(n_kv=n), "kv pairs.*more than")
        add("n_tensors_%x" % n, build(n_tensors=n), "tensors .*more than")
    add("n_kv_one_too_many", build(n_kv=len(BASE_KV) + 1),
        "truncated|exceeds|invalid value type|empty key|bytes are left|not 0 or 1")

    # 3. lengths: 0, past the end, 2^64-1
    def one_kv_raw(fn):
        g = Builder()
        g.header(0, 1)
        fn(g)
        g.raw(bytes(64))  # enough bytes left that the count check passes
        return g
    add("key_len_zero", one_kv_raw(lambda g: (g.string("", "key"), g.u32(U32), g.u32(1))),
        "empty key")
    for n in [M64, 1 << 63, 1000]:
        add("key_len_%x" % n, one_kv_raw(lambda g: (g.u64(n), g.raw(b"abc"))),
            "key of kv #0 .*length %d exceeds" % n)
        add("str_len_%x" % n, one_kv_raw(lambda g: (g.string("k"), g.u32(STRING), g.u64(n),
                                                    g.raw(b"abc"))),
            "string value of key 'k'.*length %d exceeds" % n)
        add("arr_str_len_%x" % n, one_kv_raw(lambda g: (g.string("k"), g.u32(ARRAY),
                                                        g.u32(STRING), g.u64(1), g.u64(n))),
            "array string of key 'k'.*length %d exceeds" % n)
        add("arr_count_%x" % n, one_kv_raw(lambda g: (g.string("k"), g.u32(ARRAY), g.u32(U16),
                                                      g.u64(n), g.raw(b"\1\0"))),
            "key 'k'.*array of %d u16 elements" % n)
        add("arr_str_count_%x" % n, one_kv_raw(lambda g: (g.string("k"), g.u32(ARRAY),
                                                          g.u32(STRING), g.u64(n), g.u64(0))),
            "key 'k'.*array of %d string elements" % n)
        g = Builder()
        g.header(1, 0)
        g.u64(n)
        g.raw(b"w.weight" + bytes(64))
        add("tensor_name_len_%x" % n, g, "tensor name of tensor #0.*length %d exceeds" % n)

    # 4. value types
    for t in [13, 0xFFFF, 0xFFFFFFFF]:
        add("value_type_%x" % t, one_kv_raw(lambda g: (g.string("k"), g.u32(t), g.u32(0))),
            "key 'k': invalid value type %d" % t)
    add("nested_array", one_kv_raw(lambda g: (g.string("k"), g.u32(ARRAY), g.u32(ARRAY),
                                              g.u64(1), g.u32(U8), g.u64(1), g.raw(b"\0"))),
        "key 'k'.*nested arrays")
    add("array_elem_type_99", one_kv_raw(lambda g: (g.string("k"), g.u32(ARRAY), g.u32(99),
                                                    g.u64(1), g.u32(0))),
        "key 'k'.*invalid array element type 99")
    add("bool_value_2", one_kv_raw(lambda g: (g.string("b"), g.u32(BOOL), g.raw(b"\2"))),
        "key 'b': bool value .* is 2, not 0 or 1")
    add("bool_array_elem_255", one_kv_raw(lambda g: (g.string("b"), g.u32(ARRAY), g.u32(BOOL),
                                                     g.u64(2), g.raw(b"\1\xff"))),
        "key 'b': bool element 1 .* is 255")
    kvs_wo = [k for k in BASE_KV if k[0] != "general.alignment"]
    for name, t, v in [("u64", U64, 32), ("i32", I32, 32), ("u16", U16, 32), ("f32", F32, 32.0),
                       ("string", STRING, "32"), ("array", ARRAY, (U32, [32]))]:
        add("alignment_type_" + name, build(kvs=kvs_wo + [("general.alignment", t, v)]),
            "'general.alignment' .*is %s; it must be u32" % ("array" if t == ARRAY else name))

    # 5. empty and duplicate keys and names; long names
    add("key_duplicate", build(kvs=BASE_KV + [("llama.context_length", U32, 8)]),
        "duplicate key 'llama.context_length' at bytes [0-9]+ and [0-9]+")
    add("key_empty_in_file", build(kvs=BASE_KV + [("", U32, 8)]), "kv #7 at byte [0-9]+: empty key")
    add("key_with_nul", build(kvs=BASE_KV + [("a\0b", U32, 8)]), "key 'a\\\\x00b' contains a NUL")
    t3 = layout(BASE_TENSORS)

    def with_name(i, name):
        return [(name if j == i else t[0],) + t[1:] for j, t in enumerate(t3)]
    add("tensor_name_duplicate", build(tensors=with_name(2, "token_embd.weight")),
        "duplicate tensor name 'token_embd.weight' \\(tensors #0 and #2\\)")
    add("tensor_name_empty", build(tensors=with_name(1, "")),
        "tensor #1 at byte [0-9]+: empty tensor name")
    add("tensor_name_64", build(tensors=with_name(1, "n" * 64)), "is 64 bytes; names must be")
    add("tensor_name_200", build(tensors=with_name(1, "n" * 200)), "is 200 bytes; names must be")
    add("tensor_name_nul", build(tensors=with_name(1, "a\0b")), "contains a NUL byte")

    # 6. dims and types
    def one_tensor(dims, ttype=F32_T, off=0, extra=256):
        return build(kvs=[], tensors=[("w", dims, ttype, off)], data_extra=extra)
    add("n_dims_0", one_tensor([]), "tensor 'w': n_dims is 0")
    add("n_dims_5", one_tensor([1, 1, 1, 1, 1]), "tensor 'w': n_dims is 5")
    g = Builder()
    g.header(1, 0)
    g.string("w")
    g.u32(0xFFFFFFFF)
    g.u64(1)
    g.raw(bytes(64))
    add("n_dims_huge", g, "tensor 'w': n_dims is 4294967295")
    add("dim_zero_first", one_tensor([0, 4]), "tensor 'w': dimension 0 at byte [0-9]+ is 0")
    add("dim_zero_last", one_tensor([4, 2, 0]), "tensor 'w': dimension 2 at byte [0-9]+ is 0")
    add("dim_negative", one_tensor([4, M64 - 2]), "dimension 1 .*negative as int64")
    add("dim_2_63", one_tensor([1 << 63]), "dimension 0 .*negative as int64")
    add("dims_product_overflow", one_tensor([1 << 40, 1 << 20, 1 << 4]),
        "tensor 'w': element count overflows")
    add("dims_bytes_overflow", one_tensor([1 << 32, 1 << 30]), "tensor 'w': byte size overflows")
    for t in [4, 5, 31, 40, 99, 0xFFFFFFFF]:
        add("tensor_type_%x" % t, one_tensor([4], t), "tensor 'w': unknown tensor type id %d" % t)
    add("ne0_not_block_q4_0", one_tensor([48, 2], Q4_0_T),
        "tensor 'w': ne\\[0\\] = 48 is not a multiple of q4_0's block size 32")
    add("ne0_not_block_q4_K", one_tensor([128], Q4_K_T), "q4_K's block size 256")

    # 7. alignment values, offsets, sizes
    for a in [0, 3, 48, 1 << 31, 1 << 21]:
        add("alignment_%x" % a, build(kvs=kvs_wo + [("general.alignment", U32, a)]),
            "'general.alignment' .*is %d; it must be a power of two" % a)
    add("offset_misaligned", build(tensors=[(n, d, t, o + (8 if i == 1 else 0))
                                            for i, (n, d, t, o) in enumerate(t3)], data_extra=64),
        "tensor 'blk.0.attn_q.weight': data offset [0-9]+ is not a multiple of the alignment 32")
    add("offset_overlap", build(tensors=[t3[0], ("b", [8], F32_T, 160), ("c", [16], F32_T, 128)]),
        "tensor 'b' data \\[[0-9]+, [0-9]+\\) overlaps tensor 'c' data")
    add("offset_same", build(tensors=[t3[0], ("b", [8], F32_T, 0)]), "overlaps tensor")
    add("data_past_eof", build(truncate_data=32),
        "tensor '[a-z_.0-9]+': data \\[[0-9]+, [0-9]+\\) extends past end of file \\([0-9]+ bytes\\)")
    add("offset_past_eof", build(tensors=t3[:2] + [("far", [8], F32_T, 1 << 20)]),
        "tensor 'far': data .* extends past end of file")
    add("offset_wraps", build(tensors=t3[:2] + [("wrap", [8], F32_T, (M64 - 31) & ~31)]),
        "tensor 'wrap': data offset [0-9]+ \\+ 32 bytes overflows")
    # Start fits in 64 bits, start + size is exactly 2^64.
    probe = build(tensors=t3[:2] + [("wrap", [8], F32_T, 0)])
    data_off = min(off for off, label in probe.marks if label == "tensor data")
    add("size_wraps", build(tensors=t3[:2] + [("wrap", [8], F32_T, (1 << 64) - 32 - data_off)]),
        "tensor 'wrap': data offset [0-9]+ \\+ 32 bytes overflows")
    return c


def all_cases():
    """name -> (bytes, expected stderr regex, or None for a valid file)."""
    out = {k: (v, None) for k, v in valid_cases().items()}
    for name, (data, want) in list(truncation_cases().items()) + list(malformed_cases().items()):
        assert name not in out, name
        out[name] = (data, want)
    return out


def write(directory, valid_only=False):
    os.makedirs(directory, exist_ok=True)
    cases = all_cases()
    for name, (data, want) in cases.items():
        if valid_only and want is not None:
            continue
        with open(os.path.join(directory, name + ".gguf"), "wb") as f:
            f.write(data)
    return cases


def check(tessera, directory, wrapper):
    cases = write(directory)
    total = sum(len(d) for d, _ in cases.values())
    print("%d cases (%d valid), %d bytes, in %s" % (
        len(cases), sum(w is None for _, w in cases.values()), total, directory))
    failures = 0
    for name, (data, want) in sorted(cases.items()):
        path = os.path.join(directory, name + ".gguf")
        cmd = shlex.split(wrapper) + [tessera, "gguf", "info", path]
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=60)
        err = p.stderr.strip()
        problems = []
        if p.returncode < 0:
            problems.append("killed by signal %d" % -p.returncode)
        elif want is None:
            if p.returncode != 0:
                problems.append("exit %d, expected 0" % p.returncode)
            if "tensors:" not in p.stdout:
                problems.append("no tensor listing on stdout")
        else:
            if p.returncode != 2:
                problems.append("exit %d, expected 2" % p.returncode)
            if not err:
                problems.append("empty stderr")
            elif not re.search(want, err):
                problems.append("stderr does not match /%s/" % want)
            if path not in err:
                problems.append("message does not name the file")
            if re.search(r"AddressSanitizer|runtime error|Invalid read|Invalid write", err):
                problems.append("sanitizer or valgrind report")
        print("%s %-40s %s" % ("FAIL" if problems else "ok  ", name,
                               err.splitlines()[-1] if err else "(valid)"))
        for pr in problems:
            print("     %s" % pr)
            failures += 1
        if problems and err:
            print("     stderr: %s" % err[:2000])
    print("%d cases, %d problems" % (len(cases), failures))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--valid-only", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("--tessera", required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--wrapper", default="")
    a = ap.parse_args()
    if a.cmd == "write":
        write(a.dir, a.valid_only)
        return 0
    return check(a.tessera, a.dir, a.wrapper)


if __name__ == "__main__":
    sys.exit(main())
