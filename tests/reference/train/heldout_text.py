#!/usr/bin/env python3
"""The held-out text the quality tables score (docs/QUALITY.md): the documents of the
Debian package python3.11-doc that the training script keeps aside (corpus.held_out),
cleaned as for training, joined in path order, the first BYTES bytes (default 111,554:
the first 30,000 tokens of the ref-qwen3-21m tokenizer's val split).

    heldout_text.py OUT.txt [--bytes N] [--work DIR] [--train]

--train: the documents training keeps instead, as a text apart from the held-out one
(kv_turbo's InnerQ calibrates on it).
"""
import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=111554)
    ap.add_argument("--work", default="/tmp/tessera-heldout")
    ap.add_argument("--train", action="store_true")
    a = ap.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    src = corpus.extract(corpus.download(a.work), a.work)
    text = "".join(t for r, t in corpus.documents(src) if corpus.held_out(r) != a.train)
    data = text.encode("utf-8")[:a.bytes].decode("utf-8", errors="ignore").encode("utf-8")
    Path(a.out).write_bytes(data)
    print(f"{a.out}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
