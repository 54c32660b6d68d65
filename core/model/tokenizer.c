/*
** Tokenizer: loading from GGUF, added-token matching, the encode driver,
** decoding and the streaming UTF-8 helper. The merge engine lives in
** tokenizer_bpe.c, the gpt2 pre-tokenizer in tokenizer_pretok.c.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "model/tokenizer_internal.h"

/* ---- small helpers -------------------------------------------------------- */

tsr_status tsr__ids_push(struct tsr__ids *ids, int32_t id) {
  if (ids->n == ids->cap) {
    size_t cap = ids->cap ? ids->cap * 2 : 64;
    int32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu ids", cap);
    ids->v = v;
    ids->cap = cap;
  }
  ids->v[ids->n++] = id;
  return TSR_OK;
}

void tsr__tok_work_free(struct tsr__tok_work *w) {
  tsr__pretok_work_free(w);
  free(w->sym);
  free(w->heap);
  free(w->buf);
  memset(w, 0, sizeof *w);
}

tsr_status tsr__tok_work_reserve(struct tsr__tok_work *w, size_t n_sym) {
  if (n_sym <= w->sym_cap) return TSR_OK;
  size_t cap = w->sym_cap ? w->sym_cap : 256;
  while (cap < n_sym) cap *= 2;
  if (cap > (size_t)INT32_MAX) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: word too long");
  struct tsr__tok_sym *s = realloc(w->sym, cap * sizeof *s);
  if (!s) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu symbols", cap);
  w->sym = s;
  w->sym_cap = cap;
  return TSR_OK;
}

tsr_status tsr__tok_buf_reserve(struct tsr__tok_work *w, size_t n) {
  if (n <= w->buf_cap) return TSR_OK;
  size_t cap = w->buf_cap ? w->buf_cap : 1024;
  while (cap < n) cap *= 2;
  char *b = realloc(w->buf, cap);
  if (!b) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu bytes", cap);
  w->buf = b;
  w->buf_cap = cap;
  return TSR_OK;
}

size_t tsr__utf8_char_len(const unsigned char *s, size_t avail) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0)
      lo = 0xA0; /* overlong */
    else if (c == 0xED)
      hi = 0x9F; /* surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0)
      lo = 0x90; /* overlong */
    else if (c == 0xF4)
      hi = 0x8F; /* past U+10FFFF */
  } else
    return 0;
  if (avail < n || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  return n;
}

/* ---- text -> id ------------------------------------------------------------ */

#define FNV_INIT 0xcbf29ce484222325ull
static uint64_t fnv(uint64_t h, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

int32_t tsr__tok_find2(const struct tsr_tokenizer *tok, const char *a, size_t alen, const char *b,
                       size_t blen) {
  uint64_t h = fnv(fnv(FNV_INIT, a, alen), b, blen);
  for (uint64_t i = h & tok->map_mask;; i = (i + 1) & tok->map_mask) {
    uint32_t slot = tok->map[i];
    if (!slot) return -1;
    int32_t id = (int32_t)(slot - 1);
    const char *t = tok->text + tok->text_off[id];
    if (tok->text_len[id] == alen + blen && memcmp(t, a, alen) == 0 &&
        memcmp(t + alen, b, blen) == 0)
      return id;
  }
}

int32_t tsr_tokenizer_find(const struct tsr_tokenizer *tok, const char *text, size_t len) {
  return tsr__tok_find2(tok, text, len, "", 0);
}

static tsr_status build_map(struct tsr_tokenizer *tok) {
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)tok->n_vocab) cap *= 2;
  tok->map = calloc(cap, sizeof *tok->map);
  if (!tok->map)
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for the vocabulary map");
  tok->map_mask = cap - 1;
  /* A later duplicate replaces an earlier one, as in the reference's vocab dict. */
  for (int32_t id = 0; id < tok->n_vocab; id++) {
    const char *t = tok->text + tok->text_off[id];
    uint64_t i = fnv(FNV_INIT, t, tok->text_len[id]) & tok->map_mask;
    for (;; i = (i + 1) & tok->map_mask) {
      uint32_t slot = tok->map[i];
      if (!slot) break;
      int32_t o = (int32_t)(slot - 1);
      if (tok->text_len[o] == tok->text_len[id] &&
          memcmp(tok->text + tok->text_off[o], t, tok->text_len[id]) == 0)
        break;
    }
    tok->map[i] = (uint32_t)id + 1;
  }
  return TSR_OK;
}

/* ---- loading --------------------------------------------------------------- */

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static tsr_status load_tokens(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  const struct tsr_gguf_kv *kv;
  tsr_status st = tsr_gguf_get_arr(g, "tokenizer.ggml.tokens", TSR_GGUF_STRING, &kv);
  if (st) return st;
  if (kv->n == 0 || kv->n >= (uint64_t)INT32_MAX)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                         tsr_gguf_path(g), (unsigned long long)kv->n);
  size_t n = (size_t)kv->n, total = 0;
  for (size_t i = 0; i < n; i++) total += (size_t)kv->strs[i].len + 1;
  if (total > UINT32_MAX)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: tokenizer.ggml.tokens holds %zu bytes of text",
                         tsr_gguf_path(g), total);
  tok->n_vocab = (int32_t)n;
  tok->text = malloc(total);
  tok->text_off = malloc(n * sizeof *tok->text_off);
  tok->text_len = malloc(n * sizeof *tok->text_len);
  tok->type = malloc(n);
  tok->eog = calloc(n, 1);
  if (!tok->text || !tok->text_off || !tok->text_len || !tok->type || !tok->eog)
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", n);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = (size_t)kv->strs[i].len;
    memcpy(tok->text + off, kv->strs[i].ptr, len);
    tok->text[off + len] = '\0';
    tok->text_off[i] = (uint32_t)off;
    tok->text_len[i] = (uint32_t)len;
    off += len + 1;
  }

  if (tsr_gguf_find_key(g, "tokenizer.ggml.token_type") < 0) {
    memset(tok->type, TSR_TOKEN_NORMAL, n);
    return TSR_OK;
  }
  if ((st = tsr_gguf_get_arr(g, "tokenizer.ggml.token_type", TSR_GGUF_TYPE_COUNT, &kv))) return st;
  if (kv->n != n)
    return tsr_error_set(
        TSR_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries, tokenizer.ggml.tokens %zu",
        tsr_gguf_path(g), (unsigned long long)kv->n, n);
  for (size_t i = 0; i < n; i++) {
    int64_t t;
    if ((st = tsr_gguf_arr_i64(g, kv, i, &t))) return st;
    if (t < TSR_TOKEN_UNDEFINED || t > TSR_TOKEN_BYTE)
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: tokenizer.ggml.token_type[%zu] = %lld is not a type",
                           tsr_gguf_path(g), i, (long long)t);
    tok->type[i] = (uint8_t)t;
  }
  return TSR_OK;
}

/* An optional id: absent or -1 means none; anything else must be a token. */
static tsr_status load_id(const struct tsr_gguf *g, const char *key, int32_t n, int32_t *out) {
  *out = -1;
  if (tsr_gguf_find_key(g, key) < 0) return TSR_OK;
  int64_t v;
  tsr_status st = tsr_gguf_get_i64(g, key, &v);
  if (st) return st;
  if (v == -1) return TSR_OK;
  if (v < 0 || v >= n)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s = %lld is out of range (vocabulary of %d tokens)",
                         tsr_gguf_path(g), key, (long long)v, n);
  *out = (int32_t)v;
  return TSR_OK;
}

static tsr_status load_bool(const struct tsr_gguf *g, const char *key, bool dflt, bool *out) {
  *out = dflt;
  if (tsr_gguf_find_key(g, key) < 0) return TSR_OK;
  int v;
  tsr_status st = tsr_gguf_get_bool(g, key, &v);
  if (st) return st;
  *out = v != 0;
  return TSR_OK;
}

static int hex_digit(unsigned char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : -1;
}

/* The byte a "<0xXX>" token stands for, or -1. */
static int byte_token(const unsigned char *t, size_t len) {
  if (len != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
  int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* What each token decodes to. */
static tsr_status build_pieces(struct tsr_tokenizer *tok) {
  size_t n = (size_t)tok->n_vocab;
  size_t total = (size_t)tok->text_off[n - 1] + tok->text_len[n - 1] + 1;
  tok->piece = malloc(total); /* no piece is longer than its text */
  tok->piece_off = malloc(n * sizeof *tok->piece_off);
  tok->piece_len = malloc(n * sizeof *tok->piece_len);
  if (!tok->piece || !tok->piece_off || !tok->piece_len)
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for the pieces");
  size_t off = 0;
  for (size_t id = 0; id < n; id++) {
    const unsigned char *t = (const unsigned char *)tok->text + tok->text_off[id];
    size_t len = tok->text_len[id], o = off;
    unsigned char *p = (unsigned char *)tok->piece;
    int type = tok->type[id], hex;
    if (tok->kind == TSR__TOK_GPT2 && (type == TSR_TOKEN_NORMAL || type == TSR_TOKEN_UNDEFINED)) {
      /* GPT-2's byte mapping, undone; a text outside it is kept as written. */
      size_t i = 0;
      while (i < len) {
        size_t cl = tsr__utf8_char_len(t + i, len - i);
        uint32_t cp = 0;
        if (cl == 1)
          cp = t[i];
        else if (cl == 2)
          cp = ((t[i] & 0x1Fu) << 6) | (t[i + 1] & 0x3Fu);
        int b = cl == 1 || cl == 2 ? tsr__cp_to_byte(cp) : -1;
        if (b < 0) break;
        p[o++] = (unsigned char)b;
        i += cl;
      }
      if (i < len) {
        memcpy(p + off, t, len);
        o = off + len;
      }
    } else if (tok->kind != TSR__TOK_GPT2 && type == TSR_TOKEN_BYTE &&
               (hex = byte_token(t, len)) >= 0) {
      p[o++] = (unsigned char)hex;
    } else if (tok->kind != TSR__TOK_GPT2) {
      for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && t[i] == 0xE2 && t[i + 1] == 0x96 && t[i + 2] == 0x81) {
          p[o++] = ' ';
          i += 2;
        } else
          p[o++] = t[i];
      }
    } else {
      memcpy(p + off, t, len);
      o = off + len;
    }
    tok->piece_off[id] = (uint32_t)off;
    tok->piece_len[id] = (uint32_t)(o - off);
    off = o;
  }
  return TSR_OK;
}

static tsr_status build_trie(struct tsr_tokenizer *tok) {
  size_t cap = 1024;
  tok->trie = malloc(cap * sizeof *tok->trie);
  if (!tok->trie) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for the trie");
  tok->trie[0] = (struct tsr__trie_node){-1, -1, -1, 0};
  tok->n_trie = 1;
  for (int32_t id = 0; id < tok->n_vocab; id++) {
    int t = tok->type[id];
    if (t != TSR_TOKEN_CONTROL && t != TSR_TOKEN_UNKNOWN && t != TSR_TOKEN_USER_DEFINED) continue;
    const unsigned char *s = (const unsigned char *)tok->text + tok->text_off[id];
    size_t len = tok->text_len[id];
    if (!len) continue;
    tok->trie_first[s[0]] = 1;
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
      int32_t c = tok->trie[node].child;
      while (c >= 0 && tok->trie[c].byte != s[i]) c = tok->trie[c].sibling;
      if (c < 0) {
        if (tok->n_trie == cap) {
          cap *= 2;
          struct tsr__trie_node *nt = realloc(tok->trie, cap * sizeof *nt);
          if (!nt) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for the trie");
          tok->trie = nt;
        }
        c = (int32_t)tok->n_trie++;
        tok->trie[c] = (struct tsr__trie_node){-1, tok->trie[node].child, -1, s[i]};
        tok->trie[node].child = c;
      }
      node = c;
    }
    tok->trie[node].id = id; /* a later duplicate wins, as in the map */
  }
  return TSR_OK;
}

static void mark_eog(struct tsr_tokenizer *tok) {
  static const char *const names[] = {"<|endoftext|>", "<|im_end|>", "<end_of_turn>",
                                      "<|eot_id|>",    "<|eom_id|>", "<|end|>",
                                      "<turn|>"}; /* Gemma 4's turn end */
  int32_t ids[] = {tok->eos, tok->eot, tok->eom};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (ids[i] >= 0) tok->eog[ids[i]] = 1;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = tsr_tokenizer_find(tok, names[i], strlen(names[i]));
    if (id >= 0 && tok->type[id] == TSR_TOKEN_CONTROL) tok->eog[id] = 1;
  }
}

static tsr_status load(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  const char *model, *path = tsr_gguf_path(g);
  tsr_status st = tsr_gguf_get_str(g, "tokenizer.ggml.model", &model);
  if (st) return st;
  if (strcmp(model, "gpt2") == 0)
    tok->kind = TSR__TOK_GPT2;
  else if (strcmp(model, "llama") == 0)
    tok->kind = TSR__TOK_SPM;
  else if (strcmp(model, "gemma4") == 0)
    tok->kind = TSR__TOK_GEMMA4;
  else
    return tsr_error_set(
        TSR_ERR_UNSUPPORTED,
        "%s: tokenizer.ggml.model = '%s' is not supported (supported: gpt2, llama, gemma4)", path,
        model);
  const char *pre = "default";
  if (tsr_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 &&
      (st = tsr_gguf_get_str(g, "tokenizer.ggml.pre", &pre)))
    return st;
  tok->model_name = dup_str(model);
  tok->pre_name = dup_str(pre);
  if (!tok->model_name || !tok->pre_name)
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory");

  if ((st = load_tokens(tok, g))) return st;
  if ((st = build_map(tok))) return st;
  int32_t n = tok->n_vocab;
  if ((st = load_id(g, "tokenizer.ggml.bos_token_id", n, &tok->bos)) ||
      (st = load_id(g, "tokenizer.ggml.eos_token_id", n, &tok->eos)) ||
      (st = load_id(g, "tokenizer.ggml.unknown_token_id", n, &tok->unk)) ||
      (st = load_id(g, "tokenizer.ggml.padding_token_id", n, &tok->pad)) ||
      (st = load_id(g, "tokenizer.ggml.eot_token_id", n, &tok->eot)) ||
      (st = load_id(g, "tokenizer.ggml.eom_token_id", n, &tok->eom)))
    return st;
  if ((st = load_bool(g, "tokenizer.ggml.add_bos_token", tok->kind != TSR__TOK_GPT2,
                      &tok->add_bos)) ||
      (st = load_bool(g, "tokenizer.ggml.add_eos_token", false, &tok->add_eos)))
    return st;
  if (tsr_gguf_find_key(g, "tokenizer.chat_template") >= 0) {
    const char *tmpl;
    if ((st = tsr_gguf_get_str(g, "tokenizer.chat_template", &tmpl))) return st;
    if (!(tok->chat_template = dup_str(tmpl)))
      return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory");
  }

  if (tok->kind == TSR__TOK_GPT2) {
    if (tsr_gguf_find_key(g, "tokenizer.ggml.pre") < 0)
      return tsr_error_set(TSR_ERR_UNSUPPORTED,
                           "%s: tokenizer.ggml.pre is absent; tokenizer.ggml.model 'gpt2' needs a "
                           "pre-tokenizer (supported: qwen2, qwen35)",
                           path);
    if ((st = tsr__pretok_compile(tok, path))) return st;
    if ((st = tsr__bpe_load_merges(tok, g))) return st;
  } else {
    /* llama.cpp writes no pre for gemma4 and its loader implies "gemma4" */
    bool gemma4 = tok->kind == TSR__TOK_GEMMA4;
    if (strcmp(pre, "default") != 0 && !(gemma4 && strcmp(pre, "gemma4") == 0))
      return tsr_error_set(
          TSR_ERR_UNSUPPORTED,
          "%s: tokenizer.ggml.pre = '%s' is not supported with tokenizer.ggml.model "
          "'%s' (supported: default%s)",
          path, pre, model, gemma4 ? ", gemma4" : "");
    /* Absent means true to llama.cpp, whose files these are. */
    bool prefix;
    if ((st = load_bool(g, "tokenizer.ggml.add_space_prefix", true, &prefix))) return st;
    if (prefix)
      return tsr_error_set(
          TSR_ERR_UNSUPPORTED,
          "%s: tokenizer.ggml.add_space_prefix is %s: a SentencePiece dummy prefix "
          "is not implemented (Gemma 3 and Gemma 4 set it false)",
          path,
          tsr_gguf_find_key(g, "tokenizer.ggml.add_space_prefix") < 0 ? "absent, which means true"
                                                                      : "true");
    if ((st = gemma4 ? tsr__gemma4_load(tok, g) : tsr__spm_load(tok, g))) return st;
  }
  if ((st = build_pieces(tok))) return st;
  if ((st = build_trie(tok))) return st;
  mark_eog(tok);
  return TSR_OK;
}

tsr_status tsr_tokenizer_load(const struct tsr_gguf *model, struct tsr_tokenizer **out) {
  *out = NULL;
  struct tsr_tokenizer *tok = calloc(1, sizeof *tok);
  if (!tok) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory");
  tsr_status st = load(tok, model);
  if (st) {
    tsr_tokenizer_free(tok);
    return st;
  }
  *out = tok;
  return TSR_OK;
}

void tsr_tokenizer_free(struct tsr_tokenizer *tok) {
  if (!tok) return;
  tsr__pretok_free(tok);
  free(tok->model_name);
  free(tok->pre_name);
  free(tok->text);
  free(tok->text_off);
  free(tok->text_len);
  free(tok->piece);
  free(tok->piece_off);
  free(tok->piece_len);
  free(tok->type);
  free(tok->eog);
  free(tok->map);
  free(tok->merge_key);
  free(tok->merge_rank);
  free(tok->merge_out);
  free(tok->score_rank);
  free(tok->cp_len);
  free(tok->trie);
  free(tok->chat_template);
  free(tok);
}

/* ---- encoding -------------------------------------------------------------- */

/* The longest added token at s, or -1; *mlen gets its length. */
static int32_t match_added(const struct tsr_tokenizer *tok, const unsigned char *s, size_t len,
                           size_t *mlen) {
  int32_t node = 0, best = -1;
  for (size_t i = 0; i < len; i++) {
    int32_t c = tok->trie[node].child;
    while (c >= 0 && tok->trie[c].byte != s[i]) c = tok->trie[c].sibling;
    if (c < 0) break;
    node = c;
    if (tok->trie[node].id >= 0) {
      best = tok->trie[node].id;
      *mlen = i + 1;
    }
  }
  return best;
}

/* One stretch of text between added tokens: normalize, pre-tokenize, merge. */
static tsr_status encode_segment(const struct tsr_tokenizer *tok, struct tsr__tok_work *w,
                                 const char *s, size_t len, struct tsr__ids *out) {
  if (!len) return TSR_OK;
  if (tok->kind == TSR__TOK_GPT2) return tsr__gpt2_encode(tok, w, s, len, out);
  /* SentencePiece sees spaces as U+2581. */
  size_t spaces = 0, need;
  for (size_t i = 0; i < len; i++) spaces += s[i] == ' ';
  if (!tsr_size_mul(spaces, 2, &need) || !tsr_size_add(need, len, &need))
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: text too long");
  tsr_status st = tsr__tok_buf_reserve(w, need);
  if (st) return st;
  char *b = w->buf;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == ' ') {
      memcpy(b, "\xE2\x96\x81", 3);
      b += 3;
    } else
      *b++ = s[i];
  }
  return tsr__spm_encode(tok, w, (const unsigned char *)w->buf, need, out);
}

/* Whether the special token matched at text[i, i + mlen) may be parsed as one. */
static bool special_allowed(bool parse_special, const unsigned char *special_ok, size_t i,
                            size_t mlen) {
  if (!parse_special) return false;
  if (!special_ok) return true;
  for (size_t j = i; j < i + mlen; j++)
    if (!special_ok[j]) return false;
  return true;
}

tsr_status tsr_tokenizer_encode(const struct tsr_tokenizer *tok, const char *text, size_t len,
                                bool parse_special, bool add_special, int32_t **ids, size_t *n) {
  return tsr_tokenizer_encode_marked(tok, text, len, parse_special, NULL, add_special, ids, n);
}

tsr_status tsr_tokenizer_encode_marked(const struct tsr_tokenizer *tok, const char *text,
                                       size_t len, bool parse_special,
                                       const unsigned char *special_ok, bool add_special,
                                       int32_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  if (!text && len)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "tokenizer: NULL text of %zu bytes", len);
  struct tsr__ids out = {0};
  struct tsr__tok_work w = {0};
  tsr_status st = TSR_OK;
  if (add_special && tok->add_bos && tok->bos >= 0) st = tsr__ids_push(&out, tok->bos);

  const unsigned char *s = (const unsigned char *)text;
  size_t seg = 0, i = 0;
  while (!st && i < len) {
    size_t mlen = 0;
    int32_t id = tok->trie_first[s[i]] ? match_added(tok, s + i, len - i, &mlen) : -1;
    if (id < 0) {
      i++;
      continue;
    }
    if (tok->type[id] != TSR_TOKEN_USER_DEFINED && parse_special && special_ok &&
        special_ok[i] && !special_allowed(parse_special, special_ok, i, mlen)) {
      /* the longest match ran past the parsed bytes: take the longest within them */
      size_t run = 0, m2 = 0;
      while (i + run < len && special_ok[i + run]) run++;
      int32_t id2 = match_added(tok, s + i, run, &m2);
      if (id2 >= 0) id = id2, mlen = m2;
    }
    if (tok->type[id] != TSR_TOKEN_USER_DEFINED &&
        !special_allowed(parse_special, special_ok, i, mlen)) {
      /* Unparsed, a special token is ordinary text of the segment. A match
      ** wholly in unparsed bytes consumes them, so no added token starts
      ** inside it; one that reaches into parsed bytes gives way to them. */
      bool reaches_parsed = parse_special && special_ok && special_ok[i + mlen - 1];
      i += reaches_parsed ? 1 : mlen;
      continue;
    }
    st = encode_segment(tok, &w, text + seg, i - seg, &out);
    if (!st) st = tsr__ids_push(&out, id);
    i += mlen;
    seg = i;
  }
  if (!st && seg < len) st = encode_segment(tok, &w, text + seg, len - seg, &out);
  if (!st && add_special && tok->add_eos && tok->eos >= 0) st = tsr__ids_push(&out, tok->eos);
  tsr__tok_work_free(&w);
  if (st) {
    free(out.v);
    return st;
  }
  if (!out.n) {
    free(out.v);
    out.v = NULL;
  }
  *ids = out.v;
  *n = out.n;
  return TSR_OK;
}

/* ---- decoding and accessors -------------------------------------------------- */

const char *tsr_tokenizer_piece(const struct tsr_tokenizer *tok, int32_t id, size_t *len) {
  if (id < 0 || id >= tok->n_vocab) return NULL;
  if (len) *len = tok->piece_len[id];
  return tok->piece + tok->piece_off[id];
}

tsr_status tsr_tokenizer_decode(const struct tsr_tokenizer *tok, const int32_t *ids, size_t n,
                                char **text, size_t *len) {
  *text = NULL;
  if (len) *len = 0;
  size_t total = 1;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= tok->n_vocab)
      return tsr_error_set(TSR_ERR_INVALID_ARG,
                           "tokenizer: id %d at position %zu is out of range (vocabulary of %d)",
                           ids[i], i, tok->n_vocab);
    if (!tsr_size_add(total, tok->piece_len[ids[i]], &total))
      return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: decoded text too long");
  }
  char *t = malloc(total);
  if (!t) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu bytes", total);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(t + o, tok->piece + tok->piece_off[ids[i]], tok->piece_len[ids[i]]);
    o += tok->piece_len[ids[i]];
  }
  t[o] = '\0';
  *text = t;
  if (len) *len = o;
  return TSR_OK;
}

const char *tsr_tokenizer_token_text(const struct tsr_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_vocab ? tok->text + tok->text_off[id] : NULL;
}

enum tsr_token_type tsr_tokenizer_token_type(const struct tsr_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_vocab ? (enum tsr_token_type)tok->type[id] : TSR_TOKEN_UNDEFINED;
}

int32_t tsr_tokenizer_n_vocab(const struct tsr_tokenizer *tok) { return tok->n_vocab; }
int32_t tsr_tokenizer_bos(const struct tsr_tokenizer *tok) { return tok->bos; }
int32_t tsr_tokenizer_eos(const struct tsr_tokenizer *tok) { return tok->eos; }
int32_t tsr_tokenizer_pad(const struct tsr_tokenizer *tok) { return tok->pad; }
bool tsr_tokenizer_adds_bos(const struct tsr_tokenizer *tok) {
  return tok->add_bos && tok->bos >= 0;
}
bool tsr_tokenizer_adds_eos(const struct tsr_tokenizer *tok) {
  return tok->add_eos && tok->eos >= 0;
}
const char *tsr_tokenizer_model_name(const struct tsr_tokenizer *tok) { return tok->model_name; }
const char *tsr_tokenizer_pre_name(const struct tsr_tokenizer *tok) { return tok->pre_name; }
const char *tsr_tokenizer_chat_template(const struct tsr_tokenizer *tok) {
  return tok->chat_template;
}

bool tsr_tokenizer_is_eog(const struct tsr_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_vocab && tok->eog[id];
}

/* ---- streaming UTF-8 --------------------------------------------------------- */

/* Whether n (< the full length) leading bytes can still begin a valid character. */
static bool utf8_valid_prefix(const unsigned char *s, size_t n) {
  unsigned char c = s[0], lo = 0x80, hi = 0xBF;
  if (c == 0xE0)
    lo = 0xA0;
  else if (c == 0xED)
    hi = 0x9F;
  else if (c == 0xF0)
    lo = 0x90;
  else if (c == 0xF4)
    hi = 0x8F;
  if (n > 1 && (s[1] < lo || s[1] > hi)) return false;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return false;
  return true;
}

static size_t utf8_expected_len(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 1; /* ASCII, or a byte that starts nothing: passed through alone */
}

size_t tsr_utf8_stream_push(struct tsr_utf8_stream *s, const char *piece, size_t len, char *out) {
  size_t np = s->n_pending, total = np + len, k = 0, o = 0;
#define AT(i) ((i) < np ? s->pending[i] : (unsigned char)piece[(i)-np])
  s->n_pending = 0;
  while (k < total) {
    unsigned char tmp[4];
    size_t need = utf8_expected_len(AT(k)), avail = total - k, m = need < avail ? need : avail;
    for (size_t j = 0; j < m; j++) tmp[j] = AT(k + j);
    if (need == 1 || (avail >= need && tsr__utf8_char_len(tmp, need) == 0) ||
        (avail < need && !utf8_valid_prefix(tmp, avail))) {
      out[o++] = (char)tmp[0];
      k++;
    } else if (avail >= need) {
      memcpy(out + o, tmp, need);
      o += need;
      k += need;
    } else {
      memcpy(s->pending, tmp, avail);
      s->n_pending = (uint32_t)avail;
      break;
    }
  }
#undef AT
  return o;
}

size_t tsr_utf8_stream_flush(struct tsr_utf8_stream *s, char *out) {
  size_t n = s->n_pending;
  memcpy(out, s->pending, n);
  s->n_pending = 0;
  return n;
}
