#!/usr/bin/env python3
"""Run a libFuzzer target for a bounded time over a seed corpus.

  run_fuzz.py FUZZER SEEDS WORKDIR SECONDS

SEEDS is a directory of seed files (tests/fuzz/corpus/NAME/, read as it is),
or a corpus.py whose `write DIR` command generates them (valid and malformed)
into WORKDIR/seeds. New inputs go to WORKDIR/corpus and crash reproducers to
WORKDIR/. Exits with the fuzzer's status, so any crash, leak, sanitizer report
or timeout fails.
"""
import os
import subprocess
import sys

fuzzer, seeds_arg, work, seconds = sys.argv[1:5]
corpus = os.path.join(work, "corpus")
os.makedirs(corpus, exist_ok=True)
if os.path.isdir(seeds_arg):
    seeds = seeds_arg
else:
    seeds = os.path.join(work, "seeds")
    subprocess.run([sys.executable, seeds_arg, "write", seeds], check=True)
# libFuzzer writes what it finds into the first directory only, so the
# committed seeds stay as they are.
# A finding exits 1, not libFuzzer's default 77, which meson would report as a skip.
cmd = [fuzzer, "-max_total_time=" + seconds, "-timeout=10", "-rss_limit_mb=2048",
       "-error_exitcode=1", "-timeout_exitcode=1",
       "-print_final_stats=1", "-artifact_prefix=" + os.path.join(work, ""), corpus, seeds]
print(" ".join(cmd), flush=True)
sys.exit(subprocess.run(cmd).returncode)
