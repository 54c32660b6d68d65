"""Counts individual test cases from meson's testlog.json.

Each test executable prints "ok   name" or "FAIL name" per case; an
executable that failed without printing a FAIL line (a crash, a timeout, a
script test) counts as one failed case so nothing is lost in the total.
"""
import json
import sys

passed = failed = 0
with open(sys.argv[1]) as f:
    for line in f:
        t = json.loads(line)
        out = t.get("stdout") or ""
        ok = sum(1 for l in out.splitlines() if l.startswith("ok   "))
        bad = sum(1 for l in out.splitlines() if l.startswith("FAIL "))
        if t["result"] != "OK" and bad == 0:
            bad = 1
        if ok + bad == 0:
            ok = 1  # a test that reports no cases counts once, by its exit code
        passed += ok
        failed += bad
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
