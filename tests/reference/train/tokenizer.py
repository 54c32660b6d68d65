"""The two tokenizers of the reference models, trained on the training split of the corpus.

Both have VOCAB_SIZE ids and are built the way tests/reference/tiny_tokenizers.py builds the
fixtures' (the same regex, special tokens, ids and transformers classes), only on more text:

- qwen3: byte-level BPE (GPT-2 byte map, Qwen2 pre-tokenizer regex, NFC); llama.cpp pre
  "qwen2". Learned pieces take ids 0..VOCAB_SIZE-4, then <|endoftext|> (eos, and the
  separator between documents), <|im_start|>, <|im_end|>. No BOS.
- gemma4: SentencePiece-style BPE: spaces become U+2581, bytes fall back to <0xXX>, <bos> is
  prepended; ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, <|turn> 5, <turn|> 6, four
  user-defined markers 7-10, <0x00>..<0xFF> 11-266, learned pieces after.

tessera converts the first as tokenizer.ggml.model "gpt2" and the second as "gemma4", the two
families the real Qwen3 and Gemma 4 checkpoints use.

Digits are always single tokens, so a 5-digit pass key is 5 tokens in both: the Qwen2 regex
splits digits already; the Gemma trainer isolates them (tokenizers' Digits pre-tokenizer)
during training only, so no learned merge contains a digit and the saved tokenizer (which has
no such pre-tokenizer, like Gemma's) still never joins them.
"""

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tiny_tokenizers as tt  # noqa: E402

VOCAB_SIZE = 4096
# Characters the Gemma tokenizer learns as pieces (the most frequent ones, as SentencePiece's
# character coverage does); rarer ones are spelled with the <0xXX> byte tokens.
GEMMA_ALPHABET = 160


def _train(texts, pre_tokenizer, normalizer, n_pieces, alphabet, limit_alphabet):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=n_pieces, min_frequency=2, show_progress=False,
                                  initial_alphabet=alphabet, special_tokens=[],
                                  limit_alphabet=limit_alphabet)
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if len(vocab) != n_pieces:
        raise RuntimeError(f"BPE learned {len(vocab)} pieces, want {n_pieces}")
    return vocab, merges


def build_qwen(texts):
    from transformers import Qwen2Tokenizer

    split = pre_tokenizers.Split(Regex(tt.QWEN2_REGEX), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    pieces, merges = _train(texts, pre_tokenizers.Sequence([split, byte_level]), normalizers.NFC(),
                            VOCAB_SIZE - len(tt.QWEN_SPECIALS),
                            pre_tokenizers.ByteLevel.alphabet(), 256)
    eot = tt.QWEN_SPECIALS[0]
    tok = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(pieces)}, merges=merges,
                         unk_token=None, bos_token=None, eos_token=eot, pad_token=eot)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    specials = [AddedToken(s, special=True, normalized=False) for s in tt.QWEN_SPECIALS]
    tok.add_special_tokens({"additional_special_tokens": specials})
    for i, s in enumerate(tt.QWEN_SPECIALS):
        if tok.convert_tokens_to_ids(s) != VOCAB_SIZE - len(tt.QWEN_SPECIALS) + i:
            raise RuntimeError(f"special token {s} landed on id {tok.convert_tokens_to_ids(s)}")
    # A base model: it ends a document (and a task's answer) with <|endoftext|>.
    tok.eos_token = eot
    tok.chat_template = tt.QWEN_CHAT_TEMPLATE
    return tok


def _alphabet(texts):
    """The GEMMA_ALPHABET most frequent characters, ties broken by code point.

    The trainer's own limit_alphabet breaks ties in hash-map order, so two runs can learn
    different vocabularies; handing it exactly the characters to keep makes it deterministic.
    """
    from collections import Counter

    counts = Counter()
    for t in texts:
        counts.update(t.replace(" ", "\u2581"))
    return [c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:GEMMA_ALPHABET]]


def build_gemma(texts):
    from transformers import GemmaTokenizer

    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    fixed = tt.GEMMA_CONTROL + tt.GEMMA_USER_DEFINED + byte_tokens
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split("\u2581", behavior="merged_with_next"),
                                   pre_tokenizers.Digits(individual_digits=True)])
    pieces, merges = _train(texts, pre, normalizers.Replace(" ", "\u2581"),
                            VOCAB_SIZE - len(fixed), _alphabet(texts), GEMMA_ALPHABET)
    clash = set(pieces) & set(fixed)
    if clash:
        raise RuntimeError(f"learned pieces repeat fixed tokens: {sorted(clash)[:5]}")
    vocab = {t: i for i, t in enumerate(fixed + pieces)}
    tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False)
    turn = [AddedToken(s, special=True, normalized=False) for s in tt.GEMMA_CONTROL[5:]]
    tok.add_special_tokens({"additional_special_tokens": turn})
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in tt.GEMMA_USER_DEFINED])
    tok.chat_template = tt.GEMMA_CHAT_TEMPLATE
    return tok


def build(kind, texts):
    tok = build_qwen(texts) if kind == "qwen3" else build_gemma(texts)
    if len(tok) != VOCAB_SIZE:
        raise RuntimeError(f"{kind} tokenizer has {len(tok)} ids, want {VOCAB_SIZE}")
    return tok


def prefix_ids(tok):
    """What a prompt starts with: [<bos>] for Gemma, nothing for Qwen."""
    return [tok.bos_token_id] if tok.bos_token_id is not None else []


def encode(tok, text):
    """Token ids of text without special tokens (the backend tokenizer, fast)."""
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def encode_batch(tok, texts):
    return [e.ids for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
