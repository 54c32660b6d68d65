"""Reference tokenizers built from the vocabulary embedded in a GGUF file.

The starting point is what transformers builds when it loads a tokenizer from a GGUF
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`).  For the two tokenizer families we
use, that conversion is not faithful to the original tokenizers, so two corrections are
applied here, both derived only from data in the GGUF itself:

qwen2 (tokenizer.ggml.model "gpt2", pre "qwen2"): transformers registers only
  <|endoftext|>, <|im_start|> and <|im_end|> as added tokens.  The GGUF marks 22 tokens
  (151643..151664) as CONTROL or USER_DEFINED; the original tokenizer.json has all 22 as
  added tokens, so without the fix "<|fim_prefix|>" or "<tool_call>" are split into
  ordinary BPE pieces.  Fix: every CONTROL token becomes a special added token and every
  USER_DEFINED token a non-special added token (both matched on the raw text).

gemma3 (tokenizer.ggml.model "llama", i.e. SentencePiece): transformers builds a Unigram
  model over the GGUF scores.  Gemma's SentencePiece model is BPE (its scores are negated
  merge ranks), and Viterbi over those scores prefers many short pieces: "Hello world"
  becomes Hello|▁w|or|ld instead of Hello|▁world.  Fix: build the BPE model the way
  transformers' GemmaConverter builds it from the original tokenizer.model (merges
  generated from the vocabulary, ordered by piece score), with byte fallback, spaces
  escaped to "▁", no dummy prefix, CONTROL tokens as special and USER_DEFINED tokens
  (newline runs, space runs, tab runs, HTML tags) as non-special added tokens.

`parse_special` selects whether special (CONTROL) tokens written in the text are
recognised.  USER_DEFINED tokens are recognised either way, which is also how
llama.cpp treats them.
"""

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, normalizers
from tokenizers.models import BPE

# GGUF token types (llama.cpp's llama_token_type, same numbers as SentencePiece's).
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


def gguf_tokenizer_fields(path):
  r = gguf.GGUFReader(str(path))
  out = {}
  for k, f in r.fields.items():
    if k.startswith("tokenizer."):
      out[k] = f.contents()
  return out


def _added_tokens(tokens, types):
  """CONTROL -> special, USER_DEFINED -> not special; both matched on the raw text."""
  out = []
  for t, ty in zip(tokens, types):
    if ty == TT_CONTROL or ty == TT_USER_DEFINED:
      out.append(AddedToken(t, special=(ty == TT_CONTROL), normalized=False,
                            lstrip=False, rstrip=False, single_word=False))
  return out


def _qwen2(model_dir, gguf_file, fields):
  from transformers import AutoTokenizer
  hf = AutoTokenizer.from_pretrained(str(model_dir), gguf_file=gguf_file)
  tok = hf.backend_tokenizer
  tok.add_tokens(_added_tokens(fields["tokenizer.ggml.tokens"],
                               fields["tokenizer.ggml.token_type"]))
  # The GGUF's own pre-tokenizer name must be the one this converter implements.
  assert fields["tokenizer.ggml.pre"] == "qwen2", fields["tokenizer.ggml.pre"]
  return tok


def _generate_merges(tokens, scores, types):
  """Merges of a SentencePiece BPE model: every split of a vocabulary piece into two pieces
  that are both in the vocabulary, ranked by the merged piece's score (higher first)."""
  from transformers.tokenization_utils_base import generate_merges
  vocab = {}
  vocab_scores = {}
  for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
    if ty != TT_NORMAL:
      continue
    vocab.setdefault(t, i)
    vocab_scores.setdefault(t, s)
  return generate_merges(vocab, vocab_scores)


def _gemma(model_dir, gguf_file, fields):
  tokens = fields["tokenizer.ggml.tokens"]
  scores = fields["tokenizer.ggml.scores"]
  types = fields["tokenizer.ggml.token_type"]
  assert fields.get("tokenizer.ggml.add_space_prefix", False) is False
  vocab = {}
  for i, t in enumerate(tokens):
    vocab.setdefault(t, i)
  assert len(vocab) == len(tokens), "duplicate pieces in the GGUF vocabulary"
  unk = tokens[fields["tokenizer.ggml.unknown_token_id"]]
  tok = Tokenizer(BPE(vocab, _generate_merges(tokens, scores, types), unk_token=unk,
                      fuse_unk=True, byte_fallback=True, dropout=None))
  tok.normalizer = normalizers.Replace(" ", "▁")
  tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse()])
  tok.add_tokens(_added_tokens(tokens, types))
  return tok


def load(gguf_path):
  """Return (tokenizers.Tokenizer, info) for the tokenizer embedded in gguf_path."""
  from pathlib import Path
  p = Path(gguf_path)
  fields = gguf_tokenizer_fields(p)
  model = fields["tokenizer.ggml.model"]
  if model == "gpt2":
    tok = _qwen2(p.parent, p.name, fields)
    family = "qwen2"
  elif model == "llama":
    tok = _gemma(p.parent, p.name, fields)
    family = "gemma3"
  else:
    raise ValueError("%s: tokenizer model %r is not handled" % (p, model))
  info = {
    "family": family,
    "ggml_model": model,
    "ggml_pre": fields.get("tokenizer.ggml.pre"),
    "vocab_size": len(fields["tokenizer.ggml.tokens"]),
    "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
    "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
    "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", False)),
    "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False)),
  }
  return tok, info


def encode(tok, text, parse_special=True):
  """Ids without BOS/EOS; the caller adds BOS when info["add_bos_token"] says so."""
  tok.encode_special_tokens = not parse_special
  try:
    return tok.encode(text, add_special_tokens=False).ids
  finally:
    tok.encode_special_tokens = False


def decode(tok, ids):
  return tok.decode(ids, skip_special_tokens=False)
