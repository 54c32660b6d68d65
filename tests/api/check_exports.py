"""libtessera.so exports exactly the calls tessera/tessera.h declares with TSR_API: none
missing (a program linking the header would fail), nothing else (no core internals, no
symbols of the static libraries it carries). usage: check_exports.py LIBTESSERA.so HEADER"""
import re
import subprocess
import sys

lib, header = sys.argv[1:3]
declared = set(re.findall(r"^TSR_API\s+[^(]*?\b(tsr_\w+)\s*\(", open(header).read(), re.M))
out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                     check=True).stdout
exported = {f[-1] for f in (line.split() for line in out.splitlines())
            if len(f) == 3 and f[1] in "TDBR"}
missing, extra = sorted(declared - exported), sorted(exported - declared)
for name in missing:
    print("FAIL declared but not exported:", name)
for name in extra:
    print("FAIL exported but not declared:", name)
print(f"{len(declared)} declared, {len(exported)} exported")
sys.exit(1 if missing or extra or not declared else 0)
