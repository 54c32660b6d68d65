#!/usr/bin/env python3
"""Compare the committed expectations with llama.cpp (llama-cpp-python) on the same GGUFs.

Not needed to regenerate anything; it answers "does an independent GGUF implementation
agree with the transformers-based references?".  It reports:
  - tokenizers: per corpus string, llama.cpp's ids (no BOS; special tokens parsed and not
    parsed) against tokenizer_expected.<family>.json, listing every disagreement;
  - logits: llama.cpp's logits for the golden ids against <model>.golden.gguf (argmax
    agreement, max |difference| over the reference top-64, KL over that set plus a "rest"
    bucket).  llama.cpp
    multiplies quantised weights with 8-bit-quantised activations, so small differences are
    expected: these numbers are a yardstick for the tolerance of a quantised runtime.

Needs `pip install llama-cpp-python` (it builds llama.cpp from source; about 20 minutes on
two cores).  PYTHONPATH may point at a --target install.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fetch_models  # noqa: E402
from make_goldens import TOKENIZER_SOURCES  # noqa: E402


def check_tokenizer(family, show):
  import llama_cpp
  exp = json.loads((HERE / ("tokenizer_expected.%s.json" % family)).read_text(encoding="utf-8"))
  path = fetch_models.model_path(TOKENIZER_SOURCES[family])
  llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
  bad = {"ids": 0, "ids_no_special": 0}
  for c in exp["cases"]:
    raw = c["text"].encode("utf-8")
    got = {"ids": llm.tokenize(raw, add_bos=False, special=True),
           "ids_no_special": llm.tokenize(raw, add_bos=False, special=False)}
    for k in bad:
      if got[k] != c[k]:
        bad[k] += 1
        if show:
          print("  %s %-14s %r\n    reference %s\n    llama.cpp %s" % (family, k, c["text"][:60],
                                                                     c[k], got[k]))
  bos = llm.tokenize(b"x", add_bos=True, special=False)[:-1] != []
  print("%s: %d cases; llama.cpp disagrees on %d (special parsed) and %d (not parsed); "
        "llama.cpp adds BOS: %s (reference file says %s)"
        % (family, len(exp["cases"]), bad["ids"], bad["ids_no_special"], bos,
           exp["tokenizer"]["add_bos_token"]))


def check_logits(name, threads):
  import gguf
  import llama_cpp
  r = gguf.GGUFReader(str(HERE / ("%s.golden.gguf" % name)))
  t = {x.name: np.array(x.data) for x in r.tensors}
  n_seq = int(r.fields["golden.n_sequences"].contents())
  path = fetch_models.model_path(name)
  llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_ubatch=512,
                        logits_all=True, n_threads=threads, verbose=False)
  for i in range(n_seq):
    ids = t["seq.%d.ids" % i].tolist()
    llm.reset()
    llm.eval(ids)
    got = np.array(llm.scores[:len(ids)], dtype=np.float64)
    top_ids = t["seq.%d.top_ids" % i].astype(np.int64)
    ref_top = t["seq.%d.top_logits" % i].astype(np.float64)
    ref_lse = t["seq.%d.lse" % i].astype(np.float64)
    m = got.max(axis=1, keepdims=True)
    got_lse = m[:, 0] + np.log(np.exp(got - m).sum(axis=1))
    got_top = np.take_along_axis(got, top_ids, axis=1)
    kl = kl_top_rest(ref_top - ref_lse[:, None], got_top - got_lse[:, None])
    agree = (got.argmax(axis=1) == top_ids[:, 0]).mean()
    d = np.abs(got_top - ref_top).max(axis=1)
    full = np.abs(got[-1] - t["seq.%d.last_logits" % i]).max()
    print("%s seq %d: %3d tokens, argmax agreement %.3f, max|d| top-64 %.3f (position 0) "
          "%.3f (others), max|d| last row %.3f, KL mean %.1e max %.1e (position %d)"
          % (name, i, len(ids), agree, d[0], d[1:].max(), full, kl.mean(), kl.max(),
             int(kl.argmax())))


def kl_top_rest(ref_logp, got_logp):
  """KL(ref || got) per position over the reference top-k tokens plus one bucket holding
  the rest of the vocabulary: a true KL of a coarsened distribution, so never negative."""
  p, q = np.exp(ref_logp), np.exp(got_logp)
  p_rest = np.clip(1.0 - p.sum(axis=1), 1e-30, None)
  q_rest = np.clip(1.0 - q.sum(axis=1), 1e-30, None)
  return (p * (ref_logp - got_logp)).sum(axis=1) + p_rest * np.log(p_rest / q_rest)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", choices=["logits", "tokenizers"])
  ap.add_argument("--show", action="store_true", help="print every tokenizer disagreement")
  ap.add_argument("--threads", type=int, default=2)
  a = ap.parse_args()
  if a.only in (None, "tokenizers"):
    for fam in sorted(TOKENIZER_SOURCES):
      check_tokenizer(fam, a.show)
  if a.only in (None, "logits"):
    for name in fetch_models.MODELS:
      check_logits(name, a.threads)
  return 0


if __name__ == "__main__":
  sys.exit(main())
