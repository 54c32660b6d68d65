#!/usr/bin/env python3
"""Run a libFuzzer target for a bounded time over a seed corpus.

  run_fuzz.py FUZZER CORPUS_PY WORKDIR SECONDS

Seeds are every file corpus.py generates (valid and malformed); new inputs
go to WORKDIR/corpus and crash reproducers to WORKDIR/. Exits with the
fuzzer's status, so any crash, leak, sanitizer report or timeout fails.
"""
import os
import subprocess
import sys

fuzzer, corpus_py, work, seconds = sys.argv[1:5]
seeds = os.path.join(work, "seeds")
corpus = os.path.join(work, "corpus")
os.makedirs(corpus, exist_ok=True)
subprocess.run([sys.executable, corpus_py, "write", seeds], check=True)
cmd = [fuzzer, "-max_total_time=" + seconds, "-timeout=10", "-rss_limit_mb=2048",
       "-print_final_stats=1", "-artifact_prefix=" + os.path.join(work, ""), corpus, seeds]
print(" ".join(cmd), flush=True)
sys.exit(subprocess.run(cmd).returncode)
