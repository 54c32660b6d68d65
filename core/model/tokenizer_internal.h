/*
** What the tokenizer's files share: the loaded tables, the per-call scratch,
** and the entry points of the merge engine (tokenizer_bpe.c) and of the
** gpt2 pre-tokenizer (tokenizer_pretok.c). Nothing here is used outside them.
*/
#ifndef TSR_TOKENIZER_INTERNAL_H
#define TSR_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

enum tsr__tok_kind {
  TSR__TOK_GPT2, /* byte-level BPE with ranked merges */
  TSR__TOK_SPM,  /* SentencePiece BPE over scores, byte fallback */
  /* gemma4: SentencePiece-style text (spaces as U+2581, byte fallback) merged by the
  ** ranked merges of tokenizer.ggml.merges, as Gemma 4's tokenizer.json BPE model does */
  TSR__TOK_GEMMA4,
};

/* A byte trie over the added tokens' texts: children form a sibling list. */
struct tsr__trie_node {
  int32_t child;   /* first child, -1 if none */
  int32_t sibling; /* next child of the same parent, -1 if none */
  int32_t id;      /* token ending here, -1 if none */
  uint8_t byte;
};

struct tsr_tokenizer {
  enum tsr__tok_kind kind;
  char *model_name, *pre_name;
  int32_t n_vocab;

  /* Stored texts, NUL-terminated, and what each token decodes to. */
  char *text;
  uint32_t *text_off, *text_len;
  char *piece;
  uint32_t *piece_off, *piece_len;
  uint8_t *type; /* enum tsr_token_type */
  uint8_t *eog;  /* 1 for end-of-generation tokens */

  /* text -> id, open addressing; slots hold id + 1, 0 is empty. */
  uint32_t *map;
  uint64_t map_mask;

  /* gpt2: the token of each byte's mapped character; spm and gemma4: the
  ** <0xXX> token of each byte. gpt2 and gemma4: merges keyed by
  ** (left id, right id) -> (rank, result id). */
  int32_t byte_tok[256];
  uint64_t *merge_key; /* (left << 32 | right) + 1, 0 is empty */
  uint32_t *merge_rank;
  int32_t *merge_out;
  uint64_t merge_mask;
  void *re; /* pcre2_code_8 of the pre-tokenizer */
  bool nfc;

  /* spm: merge priority of each normal piece (0 = highest score) and its
  ** length in characters (capped at 255); byte_tok holds <0xXX> tokens. */
  uint32_t *score_rank;
  uint8_t *cp_len;

  /* Added tokens, and the bytes any of them can start with. */
  struct tsr__trie_node *trie;
  size_t n_trie;
  uint8_t trie_first[256];

  int32_t bos, eos, unk, pad, eot, eom;
  bool add_bos, add_eos;
  char *chat_template;
};

/* A growable id list. */
struct tsr__ids {
  int32_t *v;
  size_t n, cap;
};
tsr_status tsr__ids_push(struct tsr__ids *ids, int32_t id);

/* Scratch reused across the words of one encode call. */
struct tsr__tok_sym {
  int32_t id, prev, next; /* id -1: absorbed into its left neighbour */
};
struct tsr__tok_cand {
  uint64_t key; /* lower merges first; ties go to the leftmost */
  int32_t left, left_id, right_id, out;
};
struct tsr__tok_work {
  struct tsr__tok_sym *sym;
  size_t sym_cap;
  struct tsr__tok_cand *heap;
  size_t heap_n, heap_cap;
  char *buf; /* normalized text */
  size_t buf_cap;
  void *match; /* pcre2_match_data_8 */
};
void tsr__tok_work_free(struct tsr__tok_work *w);
tsr_status tsr__tok_work_reserve(struct tsr__tok_work *w, size_t n_sym);
tsr_status tsr__tok_buf_reserve(struct tsr__tok_work *w, size_t n);

/* The id whose text is a followed by b, or -1. */
int32_t tsr__tok_find2(const struct tsr_tokenizer *tok, const char *a, size_t alen, const char *b,
                       size_t blen);

/* tokenizer_bpe.c: GPT-2's byte -> code point table. */
uint32_t tsr__byte_to_cp(uint8_t b);
/* The inverse, or -1 for code points that stand for no byte. */
int tsr__cp_to_byte(uint32_t cp);

/* tokenizer_bpe.c: encode one normalized segment. The gpt2 one takes one
** pre-token (raw bytes); the spm one the whole segment (spaces already U+2581),
** merged by score (spm) or by merge rank (gemma4). */
tsr_status tsr__bpe_encode_word(const struct tsr_tokenizer *tok, struct tsr__tok_work *w,
                                const unsigned char *s, size_t len, struct tsr__ids *out);
tsr_status tsr__spm_encode(const struct tsr_tokenizer *tok, struct tsr__tok_work *w,
                           const unsigned char *s, size_t len, struct tsr__ids *out);
/* tokenizer_bpe.c: merges and spm priorities, built at load. */
tsr_status tsr__bpe_load_merges(struct tsr_tokenizer *tok, const struct tsr_gguf *g);
tsr_status tsr__spm_load(struct tsr_tokenizer *tok, const struct tsr_gguf *g);
tsr_status tsr__gemma4_load(struct tsr_tokenizer *tok, const struct tsr_gguf *g);

/* tokenizer_pretok.c: compile the regex named by tokenizer.ggml.pre, and
** encode one raw segment (NFC, split, then BPE per pre-token). */
tsr_status tsr__pretok_compile(struct tsr_tokenizer *tok, const char *path);
void tsr__pretok_free(struct tsr_tokenizer *tok);
void tsr__pretok_work_free(struct tsr__tok_work *w); /* the regex match data */
tsr_status tsr__gpt2_encode(const struct tsr_tokenizer *tok, struct tsr__tok_work *w, const char *s,
                            size_t len, struct tsr__ids *out);

/* Length of a valid UTF-8 character at s (1..4), or 0 if the bytes there are
** not one (overlong forms, surrogates and values past U+10FFFF included). */
size_t tsr__utf8_char_len(const unsigned char *s, size_t avail);

#endif
