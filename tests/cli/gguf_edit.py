"""Rewrite a valid GGUF with one thing changed (Python standard library only).

    g = GGUF.read(path)
    g.set("qwen3.rope.freq_base", F32, float("inf"))   # add or replace a key
    g.drop_tensor("blk.1.attn_q_norm.weight")
    g.add_tensor("extra.weight", [64], F32_T, bytes(256))
    g.write(out_path)

Keys and tensors keep their order; untouched keys are written back byte for
byte, tensor data is copied, offsets and padding are recomputed with the
file's general.alignment. Enough for tests that need a file which is valid
GGUF but an inconsistent model.
"""
import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
F32_T = 0
# ggml type id: (block size, bytes per block)
TYPE_BYTES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
              8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
              14: (256, 210), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
              30: (1, 2)}


def _nbytes(dims, ttype):
    block, size = TYPE_BYTES[ttype]
    n = dims[0] // block * size
    for d in dims[1:]:
        n *= d
    return n


def _pack_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(_pack_value(etype, v)
                                                               for v in items)
    return struct.pack(SCALAR_FMT[vtype], value)


class _Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s.decode()

    def skip_value(self, vtype):
        if vtype == STRING:
            n = self.take("<Q")
            self.pos += n
        elif vtype == ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            if etype in SCALAR_FMT:
                size = struct.calcsize(SCALAR_FMT[etype]) * n
                self.pos += size
            else:
                for _ in range(n):
                    self.skip_value(etype)
        else:
            self.pos += struct.calcsize(SCALAR_FMT[vtype])


class GGUF:
    def __init__(self):
        self.version = 3
        self.kvs = []      # (key, raw bytes: type id + value)
        self.tensors = []  # [name, dims, type id, data bytes]

    @classmethod
    def read(cls, path):
        with open(path, "rb") as f:
            data = f.read()
        r = _Reader(data)
        if data[:4] != b"GGUF":
            raise ValueError("%s: not a GGUF file" % path)
        r.pos = 4
        g = cls()
        g.version = r.take("<I")
        n_tensors, n_kv = r.take("<Q"), r.take("<Q")
        for _ in range(n_kv):
            key = r.string()
            start = r.pos
            vtype = r.take("<I")
            r.skip_value(vtype)
            g.kvs.append((key, data[start:r.pos]))
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.take("<I")
            dims = [r.take("<Q") for _ in range(n_dims)]
            ttype, offset = r.take("<I"), r.take("<Q")
            infos.append((name, dims, ttype, offset))
        align = g.alignment()
        base = (r.pos + align - 1) // align * align
        for name, dims, ttype, offset in infos:
            start = base + offset
            g.tensors.append([name, dims, ttype, data[start:start + _nbytes(dims, ttype)]])
        return g

    def alignment(self):
        for key, raw in self.kvs:
            if key == "general.alignment":
                return struct.unpack_from("<I", raw, 4)[0]
        return 32

    def set(self, key, vtype, value):
        raw = struct.pack("<I", vtype) + _pack_value(vtype, value)
        for i, (k, _) in enumerate(self.kvs):
            if k == key:
                self.kvs[i] = (key, raw)
                return
        self.kvs.append((key, raw))

    def get_raw(self, key):
        for k, raw in self.kvs:
            if k == key:
                return raw
        raise KeyError(key)

    def get_u32(self, key):
        raw = self.get_raw(key)
        if struct.unpack_from("<I", raw, 0)[0] != U32:
            raise TypeError("%s is not u32" % key)
        return struct.unpack_from("<I", raw, 4)[0]

    def tensor(self, name):
        for t in self.tensors:
            if t[0] == name:
                return t
        raise KeyError(name)

    def drop_tensor(self, name):
        self.tensors.remove(self.tensor(name))

    def add_tensor(self, name, dims, ttype, data):
        if len(data) != _nbytes(dims, ttype):
            raise ValueError("%s: %d bytes for %s" % (name, len(data), dims))
        self.tensors.append([name, list(dims), ttype, data])

    def write(self, path):
        align = self.alignment()
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs))
        for key, raw in self.kvs:
            out += _pack_string(key) + raw
        offset = 0
        for name, dims, ttype, data in self.tensors:
            out += _pack_string(name) + struct.pack("<I", len(dims))
            out += b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", ttype, offset)
            offset += (len(data) + align - 1) // align * align
        out += bytes(-len(out) % align)
        for _, _, _, data in self.tensors:
            out += data + bytes(-len(data) % align)
        with open(path, "wb") as f:
            f.write(out)
