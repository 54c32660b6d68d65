#!/usr/bin/env python3
"""tcq_codebooks.h from the codebook files (codebooks/*.txt), at build time.

    codebook_header.py TURBO2_TCQ.txt TURBO3_TCQ.txt OUT.h

Each file: comment lines (#, its provenance), then `kv_tcq-codebook 1 NAME N` and N
values, one a line, each f16-exact (every backend reads the values as f16).
"""
import struct
import sys


def read(path, name, n):
    lines = [l.strip() for l in open(path) if l.strip() and not l.startswith("#")]
    if not lines or lines[0] != "kv_tcq-codebook 1 %s %d" % (name, n):
        sys.exit("%s: the first line that is not a comment must be "
                 "'kv_tcq-codebook 1 %s %d'" % (path, name, n))
    if len(lines) != n + 1:
        sys.exit("%s: %d values, not %d" % (path, len(lines) - 1, n))
    vals = []
    for i, l in enumerate(lines[1:]):
        try:
            v = float(l)
        except ValueError:
            sys.exit("%s: value %d is not a number: %r" % (path, i, l))
        if struct.unpack("<e", struct.pack("<e", v))[0] != v:
            sys.exit("%s: value %d (%r) is not f16-exact" % (path, i, l))
        vals.append(v)
    return vals


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    books = [("TCQ2_CODEBOOK", read(sys.argv[1], "turbo2_tcq", 256)),
             ("TCQ3_CODEBOOK", read(sys.argv[2], "turbo3_tcq", 512))]
    out = ["/* Made from plugins/kv_tcq/codebooks/ by tools/codebook_header.py at build time. */",
           "#ifndef KV_TCQ_CODEBOOKS_H", "#define KV_TCQ_CODEBOOKS_H"]
    for macro, vals in books:
        out.append("#define %s \\" % macro)
        rows = [", ".join("%.9ef" % v for v in vals[i : i + 4]) for i in range(0, len(vals), 4)]
        out.append(", \\\n".join("    " + r for r in rows))
    out.append("#endif")
    open(sys.argv[3], "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
