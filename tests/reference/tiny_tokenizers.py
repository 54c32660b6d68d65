"""Tiny deterministic tokenizers for the reference fixtures.

Three flavours, each trained with the `tokenizers` library on the fixed corpus below and then
wrapped in the transformers tokenizer class the real checkpoints use, so the saved files have
the same structure as Qwen's and Gemma's:

- qwen2: byte-level BPE with the Qwen2/Qwen3 pre-tokenizer regex (llama.cpp pre "qwen2").
- qwen35: the same with the Qwen3.5 regex, which adds \\p{M} (llama.cpp pre "qwen35").
- gemma: SentencePiece-style BPE: spaces become U+2581, unknown characters fall back to the
  <0xXX> byte tokens, <bos> is prepended.

Every flavour has exactly VOCAB_SIZE ids, matching the models' vocab_size.
"""

import json

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

VOCAB_SIZE = 512

QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen puts its special tokens after the learned vocabulary, in this order.
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Gemma puts control tokens first (pad 0, eos 1, bos 2, unk 3, mask 4), then its turn markers,
# then the 256 byte-fallback tokens, then the learned pieces.
GEMMA_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>"]
GEMMA_USER_DEFINED = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>"]
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)

# A fixed corpus written for these fixtures: prose, code, numbers and punctuation, so the
# learned merges look like a real tokenizer's (word pieces, indentation runs, digits alone).
CORPUS = [
    "The lighthouse keeper wrote the same three lines in the log every evening: the wind, the "
    "sea, and the number of ships that passed before the lamp was lit.",
    "In the spring the river rose over the stones near the mill, and the children were told "
    "to keep away from the water until the weather turned warm again.",
    "A good test is small, fast, and honest: it fails when the code is wrong and passes when "
    "the code is right, and it says which of the two happened.",
    "The train left the station at seven minutes past nine, carrying letters, parcels, two "
    "goats, and a piano that nobody in the village could play.",
    "She measured the flour twice, weighed the butter once, and trusted the oven only after "
    "the thermometer agreed with the dial for a full quarter of an hour.",
    "When the library reopened, the reading room smelled of new paint and old paper, and the "
    "clock above the door was finally keeping the right time.",
    "Every model is a compression of the data it was trained on; the question is which "
    "details survive the compression and which ones quietly disappear.",
    "The market opened early on Saturday, with apples, pears, cheese, bread, honey, and a "
    "stall that sold nothing but keys for locks that no longer existed.",
    "He could not remember whether he had locked the gate, so he walked back up the hill in "
    "the rain, found it open, and laughed at how right he had been to worry.",
    "Numbers matter: 3 apples, 14 pears, 159 grapes, 2653 seeds, 58979 steps, and 323846 "
    "grains of sand were counted on 2024-06-30 at 12:45.",
    "Prices went from $4.99 to $5.49, a rise of 10%, while the rate stayed at 0.25 and the "
    "index moved between 1,024 and 65,536 points.",
    "def add(a, b):\n    return a + b\n\n\ndef mean(values):\n    total = 0\n    for v in "
    "values:\n        total += v\n    return total / len(values)\n",
    "int main(void) {\n  int count = 0;\n  for (int i = 0; i < 10; i++) {\n    count += i;\n"
    "  }\n  printf(\"%d\\n\", count);\n  return 0;\n}\n",
    "if (status != OK) {\n  return error(\"could not open the file\");\n}\nwhile (n > 0) "
    "{\n  n = n - 1;\n}\n",
    "for item in items:\n    if item.is_ready():\n        queue.append(item)\n    else:\n"
    "        log.warning(\"skipped %s\", item.name)\n",
    "Questions? Answers! Lists: one, two, three; pairs (a, b) and [c, d]; braces {x: 1}; "
    "quotes 'single' and \"double\"; a dash - and an underscore _ and a slash /.",
    "It's the keeper's lamp, they're sure, and we'll see whether it'd been lit; I'm told "
    "you've seen it too.",
    "The committee met on Tuesday and agreed that the bridge would be repaired before "
    "winter, that the road would be widened next year, and that nobody would mention the "
    "statue again.",
    "Across the valley the bells rang for noon, and the farmers stopped, listened, counted "
    "the strokes, and went back to the long straight rows of beans.",
    "Memory is cheap until it is not; bandwidth is plenty until every layer wants it at once; "
    "latency is fine until someone is waiting for the answer.",
    "Water boils at 100 degrees at sea level, freezes at 0, and is densest at about 4, which "
    "is why lakes freeze from the top down and fish survive the winter.",
    "The cat sat on the warm stones by the door, watched the sparrows in the hedge, and "
    "pretended not to care about any of them.",
]

# Text for sequence 0 of every fixture. It is not in the corpus and holds characters the
# corpus lacks (accents, Cyrillic, CJK, an emoji) so byte-level and byte-fallback paths run.
PROBE_TEXT = (
    "The keeper of the old lighthouse counted 42 ships on Tuesday and 17 on Wednesday; the "
    "log says the wind came from the north-east at 35 knots.\n"
    "def keeper(log):\n    return [line for line in log if line.startswith(\"wind\")]\n"
    "Café déjà vu, naïve façade. Привет, мир. 日本語のテキスト。 Emoji: 🙂 and 🚢.\n"
    "When the river rose over the stones, the children counted the ships again and found "
    "the numbers did not agree with the log, so they wrote a new one and signed it twice."
)


def _bpe_trained(pre_tokenizer, normalizer, vocab_size, initial_alphabet):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=initial_alphabet,
        special_tokens=[],
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return [t for t, _ in vocab], merges


def _qwen_tokenizer(regex, cls):
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    pieces, merges = _bpe_trained(
        pre_tokenizers.Sequence([split, byte_level]),
        normalizers.NFC(),
        VOCAB_SIZE - len(QWEN_SPECIALS),
        pre_tokenizers.ByteLevel.alphabet(),
    )
    if len(pieces) != VOCAB_SIZE - len(QWEN_SPECIALS):
        raise RuntimeError(f"qwen BPE learned {len(pieces)} pieces, corpus too small")
    vocab = {t: i for i, t in enumerate(pieces)}
    # The class registers its eos/pad first; start with <|endoftext|> for both so the ids come
    # out in Qwen's order (<|endoftext|>, <|im_start|>, <|im_end|>), then make <|im_end|> eos.
    tok = cls(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token=QWEN_SPECIALS[0],
        pad_token=QWEN_SPECIALS[0],
    )
    # The class builds its pre-tokenizer from its own copy of the regex; set ours explicitly.
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    specials = [AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS]
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.eos_token = QWEN_SPECIALS[2]
    for i, s in enumerate(QWEN_SPECIALS):
        if tok.convert_tokens_to_ids(s) != VOCAB_SIZE - len(QWEN_SPECIALS) + i:
            raise RuntimeError(f"special token {s} landed on id {tok.convert_tokens_to_ids(s)}")
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def _gemma_tokenizer():
    from transformers import GemmaTokenizer

    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    n_fixed = len(GEMMA_CONTROL) + len(GEMMA_USER_DEFINED) + len(byte_tokens)
    # Train on words (pieces never cross a U+2581 boundary), like SentencePiece's default.
    pieces, merges = _bpe_trained(
        pre_tokenizers.Split("\u2581", behavior="merged_with_next"),
        normalizers.Replace(" ", "\u2581"),
        VOCAB_SIZE - n_fixed,
        [],
    )
    if len(pieces) != VOCAB_SIZE - n_fixed:
        raise RuntimeError(f"gemma BPE learned {len(pieces)} pieces, corpus too small")
    vocab = {t: i for i, t in enumerate(GEMMA_CONTROL + GEMMA_USER_DEFINED + byte_tokens + pieces)}
    tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False)
    turn = [AddedToken(s, special=True, normalized=False) for s in GEMMA_CONTROL[5:]]
    tok.add_special_tokens({"additional_special_tokens": turn})
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in GEMMA_USER_DEFINED])
    tok.chat_template = GEMMA_CHAT_TEMPLATE
    return tok


def build(kind):
    """Returns a transformers tokenizer of the given kind: 'qwen2', 'qwen35' or 'gemma'."""
    from transformers import Qwen2Tokenizer, Qwen3_5Tokenizer

    if kind == "qwen2":
        tok = _qwen_tokenizer(QWEN2_REGEX, Qwen2Tokenizer)
    elif kind == "qwen35":
        tok = _qwen_tokenizer(QWEN35_REGEX, Qwen3_5Tokenizer)
    elif kind == "gemma":
        tok = _gemma_tokenizer()
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    if len(tok) != VOCAB_SIZE:
        raise RuntimeError(f"{kind} tokenizer has {len(tok)} ids, want {VOCAB_SIZE}")
    return tok
