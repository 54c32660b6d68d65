"""Writes a C file holding a text file as srv_chat_page[] (and its length), so the
server carries its chat page without reading files at run time.
usage: embed_page.py INPUT.html OUTPUT.c"""
import sys

data = open(sys.argv[1], "rb").read()
lines = []
for i in range(0, len(data), 16):
    lines.append("  " + "".join(f"0x{b:02x}," for b in data[i:i + 16]))
with open(sys.argv[2], "w") as out:
    out.write(f"/* generated from {sys.argv[1].rsplit('/', 1)[-1]} by embed_page.py */\n")
    out.write("#include <stddef.h>\n\n")
    out.write("const char srv_chat_page[] = {\n" + "\n".join(lines) + "\n  0};\n")
    out.write(f"const size_t srv_chat_page_len = {len(data)};\n")
