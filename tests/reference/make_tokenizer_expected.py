#!/usr/bin/env python3
"""Expected token ids of the Gemma 4 fixtures' tokenizer, from Hugging Face `tokenizers`.

The four gemma4 fixtures (dense, moe, e2b, assistant) ship byte-identical tokenizer.json
and tokenizer_config.json files; this script checks that and writes one expected-ids file
for all of them, tests/reference/fixtures/gemma4_dense/tokenizer_expected.json, in the
format of tests/reference/real/tokenizer_expected.*.json (read by core/tests/test_tokenizer.c
--corpus): a header, then one case per line with

  text            the input string
  ids             encode(text) without BOS, special tokens written in the text recognised
  ids_no_special  the same with special tokens treated as text (encode_special_tokens)
  decoded         decode(ids) with special tokens kept

The texts are the shared corpus tests/reference/real/tokenizer_corpus.json followed by a
few strings that use Gemma 4's own markers (turn, channel and tool-call tokens), which the
shared corpus does not contain. The output is deterministic: sorted keys, one case per
line, no timestamps.

usage: make_tokenizer_expected.py [--check]   (--check: compare with the committed file)
"""
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
GEMMA4 = ["gemma4_dense", "gemma4_moe", "gemma4_e2b", "gemma4_assistant"]
OUT = FIXTURES / "gemma4_dense" / "tokenizer_expected.json"

EXTRA = [
    "<bos><|turn>user\nHello!<turn|>\n<|turn>model\n",
    "<|turn>system\nYou are helpful.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n"
    "<|turn>model\n<|channel>thought\nadd them<channel|>4<turn|>\n",
    "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
    "text<|channel>inside<channel|>more text",
    " <|turn> <turn|> ",
    "<eos><pad><unk><mask><bos>",
    "<|turn<turn|>|><|channel<|channel>>",
    "\u2581already\u2581escaped \u2581 spaces",
    "<0x41> is text, not a byte token",
    "the return value would keep until which item",
]


def encode(tok, text, parse_special):
  tok.encode_special_tokens = not parse_special
  try:
    return tok.encode(text, add_special_tokens=False).ids
  finally:
    tok.encode_special_tokens = False


def main(argv):
  check_only = argv[1:] == ["--check"]
  if argv[1:] and not check_only:
    print(__doc__.strip().splitlines()[-1], file=sys.stderr)
    return 2
  for name in ("tokenizer.json", "tokenizer_config.json"):
    blobs = {f: (FIXTURES / f / name).read_bytes() for f in GEMMA4}
    if len(set(blobs.values())) != 1:
      raise SystemExit("the gemma4 fixtures' %s files differ; write one expected file each" % name)
  tok = Tokenizer.from_file(str(FIXTURES / "gemma4_dense" / "tokenizer.json"))
  config = json.loads((FIXTURES / "gemma4_dense" / "tokenizer_config.json").read_text())
  corpus = json.loads((HERE / "real" / "tokenizer_corpus.json").read_text(encoding="utf-8"))
  cases = []
  for text in corpus + EXTRA:
    ids = encode(tok, text, True)
    cases.append({"text": text, "ids": ids, "ids_no_special": encode(tok, text, False),
                  "decoded": tok.decode(ids, skip_special_tokens=False)})
  # add_special_tokens=True must be BOS + the ids: the post-processor's template.
  with_bos = tok.encode("hello", add_special_tokens=True).ids
  bos = tok.token_to_id(config["bos_token"])
  if with_bos != [bos] + encode(tok, "hello", True):
    raise SystemExit("unexpected post-processor: %r" % with_bos)
  import tokenizers
  head = {"family": "gemma4", "ggml_model": "gemma4", "fixtures": GEMMA4,
          "source_file": "tests/reference/fixtures/gemma4_dense/tokenizer.json",
          "vocab_size": tok.get_vocab_size(with_added_tokens=True), "bos_token_id": bos,
          "eos_token_id": tok.token_to_id(config["eos_token"]), "add_bos_token": True,
          "add_eos_token": False, "tokenizers_version": tokenizers.__version__,
          "n_cases": len(cases), "n_corpus": len(corpus)}
  lines = ['{"tokenizer": ' + json.dumps(head, sort_keys=True, ensure_ascii=False) + ",",
           ' "cases": [']
  lines += ["  " + json.dumps(c, sort_keys=True, ensure_ascii=False) +
            ("," if i + 1 < len(cases) else "") for i, c in enumerate(cases)]
  lines += [" ]}"]
  text = "\n".join(lines) + "\n"
  if check_only:
    same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
    print("%s: %s" % (OUT, "up to date" if same else "DIFFERS"))
    return 0 if same else 1
  OUT.write_text(text, encoding="utf-8")
  n_rt = sum(1 for c in cases if c["decoded"] == c["text"])
  n_sp = sum(1 for c in cases if c["ids"] != c["ids_no_special"])
  print("%d cases (%d corpus), %d decode back to their text, %d differ when special tokens "
        "are not parsed; wrote %s" % (len(cases), len(corpus), n_rt, n_sp, OUT))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
