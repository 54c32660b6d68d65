#!/usr/bin/env python3
"""Golden outputs for the real models: logits from transformers, expected token ids.

For every model in fetch_models.MODELS this writes <name>.golden.gguf: transformers loads
the same GGUF (dequantising its weights to float32) and runs fixed texts on the CPU in
float32.  For each tokenizer family it writes tokenizer_expected.<family>.json from
tokenizer_corpus.json.  README.md describes both formats.

  make_goldens.py                 regenerate everything in this directory
  make_goldens.py --only logits   (or tokenizers) regenerate one kind
  make_goldens.py --check         regenerate into a temporary directory and compare byte
                                  for byte with the committed files (exit 1 on a difference)
"""

import argparse
import filecmp
import json
import os
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fetch_models  # noqa: E402
import ref_tokenizer  # noqa: E402

TOP_K = 64
HIDDEN_POSITIONS = 16     # positions of sequence 0 whose per-layer hidden states are kept
MAX_TOKENS = 128
TORCH_THREADS = 2         # fixed: a different split of the work may change low-order bits

# Which model's GGUF provides each tokenizer family's expectations.  Both Qwen GGUFs embed
# the same tokens, types and merges (checked in tokenizer_expectations).
TOKENIZER_SOURCES = {"qwen2": "qwen2.5-coder-0.5b", "gemma3": "gemma3-270m"}

PROSE = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying "
         "a lantern and a worn notebook. He wrote down the colour of the sky, the direction of "
         "the wind and the names of the ships that passed, because his father had done the same "
         "for forty years, and because nobody else would remember them.")
PYTHON = ("def merge_sorted(a, b):\n"
          "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
          "    out, i, j = [], 0, 0\n"
          "    while i < len(a) and j < len(b):\n"
          "        if a[i] <= b[j]:\n"
          "            out.append(a[i]); i += 1\n"
          "        else:\n"
          "            out.append(b[j]); j += 1\n"
          "    return out + a[i:] + b[j:]\n")
MULTILINGUAL = ("English: good morning. Français : bonjour à tous. Deutsch: Guten Morgen, Straße. "
                "Русский: доброе утро. Ελληνικά: καλημέρα. 中文：早上好。日本語：おはようございます。"
                "한국어: 좋은 아침. العربية: صباح الخير. हिन्दी: सुप्रभात। 😀👍🏽")
CHAT = {
  "qwen2": ("<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n"
            "<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number."
            "<|im_end|>\n<|im_start|>assistant\n"),
  "gemma3": ("<start_of_turn>user\nWrite a Python function that returns the n-th Fibonacci "
             "number.<end_of_turn>\n<start_of_turn>model\n"),
}


def golden_texts(family):
  return [("prose", PROSE), ("python", PYTHON), ("multilingual", MULTILINGUAL),
          ("chat", CHAT[family])]


def verified_model(name):
  p = fetch_models.model_path(name)
  sha = fetch_models.sha256_file(p)
  want = fetch_models.MODELS[name]["sha256"]
  if sha != want:
    raise fetch_models.FetchError("%s: %s has sha256 %s, expected %s; rerun fetch_models.py"
                                  % (name, p, sha, want))
  return p, sha


def _lse(x):
  """log-sum-exp per row, accumulated in float64."""
  x = x.astype(np.float64)
  m = x.max(axis=1, keepdims=True)
  return (m[:, 0] + np.log(np.exp(x - m).sum(axis=1))).astype(np.float32)


def _top_k(logits, k):
  # Stable sort on the negated logits: ties keep the lower token id first.
  order = np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int32)
  return order, np.take_along_axis(logits, order, axis=1)


def _run_model(model, ids, want_hidden):
  """Logits (n, vocab) as float32 numpy; hidden states (L+2, m, H) when asked."""
  import torch
  captured = []
  hooks = []
  if want_hidden:
    def grab(_mod, _inp, out):
      t = out[0] if isinstance(out, (tuple, list)) else out
      captured.append(t[0, :HIDDEN_POSITIONS].detach().to(torch.float32).clone())
    inner = model.model
    hooks.append(inner.embed_tokens.register_forward_hook(grab))
    for layer in inner.layers:
      hooks.append(layer.register_forward_hook(grab))
    hooks.append(inner.norm.register_forward_hook(grab))
  try:
    with torch.no_grad():
      out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
  finally:
    for h in hooks:
      h.remove()
  logits = out.logits[0].to(torch.float32).numpy()
  hidden = torch.stack(captured).numpy() if want_hidden else None
  if want_hidden:
    assert hidden.shape[0] == len(model.model.layers) + 2, hidden.shape
  return logits, hidden


def make_logits_golden(name, outdir, log):
  import torch
  import transformers
  from transformers import AutoModelForCausalLM
  torch.manual_seed(0)
  torch.set_num_threads(TORCH_THREADS)
  path, sha = verified_model(name)
  t0 = time.time()
  tok, info = ref_tokenizer.load(path)
  family = info["family"]
  seqs = []
  for label, text in golden_texts(family):
    ids = ref_tokenizer.encode(tok, text, parse_special=True)
    if info["add_bos_token"]:
      ids = [info["bos_token_id"]] + ids
    if len(ids) > MAX_TOKENS:
      raise ValueError("%s: text %r has %d tokens, more than %d" % (name, label, len(ids),
                                                                   MAX_TOKENS))
    seqs.append((label, text, ids))
  model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32, attn_implementation="eager")
  model.eval()
  t1 = time.time()
  log("%s: loaded in %.1f s (%s, %d layers)" % (name, t1 - t0, type(model).__name__,
                                                 len(model.model.layers)))

  import gguf
  out = Path(outdir) / ("%s.golden.gguf" % name)
  w = gguf.GGUFWriter(str(out), "golden")
  w.add_string("golden.model", name)
  w.add_string("golden.model_file", fetch_models.MODELS[name]["file"])
  w.add_string("golden.model_sha256", sha)
  w.add_string("golden.transformers_version", transformers.__version__)
  w.add_string("golden.torch_version", torch.__version__)
  w.add_string("golden.gguf_py_version", version("gguf"))
  w.add_uint32("golden.torch_threads", TORCH_THREADS)
  w.add_string("golden.tokenizer_family", family)
  w.add_bool("golden.add_bos", info["add_bos_token"])
  w.add_uint32("golden.vocab_size", int(model.config.vocab_size))
  w.add_uint32("golden.top_k", TOP_K)
  w.add_uint32("golden.hidden_positions", HIDDEN_POSITIONS)
  w.add_uint32("golden.n_sequences", len(seqs))
  for i, (label, text, ids) in enumerate(seqs):
    t = time.time()
    logits, hidden = _run_model(model, ids, want_hidden=(i == 0))
    vocab = logits.shape[1]
    assert logits.shape == (len(ids), vocab) and np.isfinite(logits).all()
    top_ids, top_logits = _top_k(logits, TOP_K)
    w.add_string("golden.seq.%d.label" % i, label)
    w.add_string("golden.seq.%d.text" % i, text)
    w.add_tensor("seq.%d.ids" % i, np.asarray(ids, dtype=np.int32))
    w.add_tensor("seq.%d.top_ids" % i, top_ids)
    w.add_tensor("seq.%d.top_logits" % i, np.ascontiguousarray(top_logits, dtype=np.float32))
    w.add_tensor("seq.%d.lse" % i, _lse(logits))
    w.add_tensor("seq.%d.last_logits" % i, np.ascontiguousarray(logits[-1], dtype=np.float32))
    if hidden is not None:
      w.add_tensor("seq.%d.hidden" % i, np.ascontiguousarray(hidden, dtype=np.float32))
    argmax = top_ids[:, 0]
    log("%s: seq %d %-12s %3d tokens, %.1f s, logit range [%.2f, %.2f], %d distinct argmax"
        % (name, i, label, len(ids), time.time() - t, float(logits.min()), float(logits.max()),
           len(set(argmax.tolist()))))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  del model
  log("%s: wrote %s (%d bytes) in %.1f s" % (name, out, out.stat().st_size, time.time() - t0))
  return out


def _same_tokenizer_data(a, b):
  keys = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
          "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
          "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token"]
  fa = ref_tokenizer.gguf_tokenizer_fields(a)
  fb = ref_tokenizer.gguf_tokenizer_fields(b)
  return [k for k in keys if fa.get(k) != fb.get(k)]


def make_tokenizer_expectations(family, outdir, log):
  t0 = time.time()
  src = TOKENIZER_SOURCES[family]
  path, sha = verified_model(src)
  if family == "qwen2":
    other, _ = verified_model("qwen2.5-coder-1.5b")
    diff = _same_tokenizer_data(path, other)
    if diff:
      raise ValueError("the two Qwen GGUFs embed different tokenizers: %s" % diff)
  tok, info = ref_tokenizer.load(path)
  corpus = json.loads((HERE / "tokenizer_corpus.json").read_text(encoding="utf-8"))
  cases = []
  for text in corpus:
    ids = ref_tokenizer.encode(tok, text, parse_special=True)
    cases.append({"text": text, "ids": ids,
                  "ids_no_special": ref_tokenizer.encode(tok, text, parse_special=False),
                  "decoded": ref_tokenizer.decode(tok, ids)})
  import tokenizers
  import transformers
  head = dict(info)
  head.update({"source_model": src, "source_file": fetch_models.MODELS[src]["file"],
               "source_sha256": sha, "tokenizers_version": tokenizers.__version__,
               "transformers_version": transformers.__version__, "n_cases": len(cases)})
  out = Path(outdir) / ("tokenizer_expected.%s.json" % family)
  # One case per line keeps diffs readable; sorted keys keep the bytes deterministic.
  lines = ['{"tokenizer": ' + json.dumps(head, sort_keys=True, ensure_ascii=False) + ",",
           ' "cases": [']
  lines += ["  " + json.dumps(c, sort_keys=True, ensure_ascii=False) + ("," if i + 1 < len(cases)
                                                                         else "")
            for i, c in enumerate(cases)]
  lines += [" ]}"]
  out.write_text("\n".join(lines) + "\n", encoding="utf-8")
  n_rt = sum(1 for c in cases if c["decoded"] == c["text"])
  n_sp = sum(1 for c in cases if c["ids"] != c["ids_no_special"])
  log("%s: %d cases, %d decode back to their text, %d differ when special tokens are not "
      "parsed; wrote %s (%d bytes) in %.1f s"
      % (family, len(cases), n_rt, n_sp, out, out.stat().st_size, time.time() - t0))
  return out


def _compare_gguf(a, b, log):
  import gguf
  ra, rb = gguf.GGUFReader(str(a)), gguf.GGUFReader(str(b))
  ta = {t.name: np.array(t.data) for t in ra.tensors}
  tb = {t.name: np.array(t.data) for t in rb.tensors}
  for k in sorted(set(ta) | set(tb)):
    if k not in ta or k not in tb or ta[k].shape != tb[k].shape:
      log("  %s: present or shaped differently" % k)
    elif not np.array_equal(ta[k], tb[k]):
      d = np.abs(ta[k].astype(np.float64) - tb[k].astype(np.float64)).max()
      log("  %s: max abs difference %.3g" % (k, d))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", choices=["logits", "tokenizers"])
  ap.add_argument("--model", action="append", choices=sorted(fetch_models.MODELS),
                  help="only this model's logits (repeatable)")
  ap.add_argument("--check", action="store_true",
                  help="regenerate into a temporary directory and compare with the committed files")
  ap.add_argument("--outdir", default=str(HERE))
  a = ap.parse_args(argv)
  log = lambda s: print(s, flush=True)  # noqa: E731
  outdir = Path(tempfile.mkdtemp(prefix="tessera-golden-")) if a.check else Path(a.outdir)
  made = []
  try:
    if a.only in (None, "tokenizers"):
      for fam in sorted(TOKENIZER_SOURCES):
        made.append(make_tokenizer_expectations(fam, outdir, log))
    if a.only in (None, "logits"):
      for name in a.model or list(fetch_models.MODELS):
        made.append(make_logits_golden(name, outdir, log))
  except fetch_models.FetchError as e:
    print("error: %s" % e, file=sys.stderr)
    return 1
  if not a.check:
    return 0
  bad = 0
  for p in made:
    ref = HERE / p.name
    if not ref.exists():
      log("check: %s is not committed" % ref.name)
      bad += 1
    elif filecmp.cmp(p, ref, shallow=False):
      log("check: %s identical (%d bytes)" % (ref.name, ref.stat().st_size))
    else:
      log("check: %s DIFFERS" % ref.name)
      if p.suffix == ".gguf":
        _compare_gguf(ref, p, log)
      bad += 1
  for p in made:
    os.unlink(p)
  os.rmdir(outdir)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
