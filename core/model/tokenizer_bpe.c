/*
** The merge engine shared by both tokenizer families, and what each family
** ranks merges by.
**
** A word starts as one symbol per byte (gpt2) or per character (spm), kept
** in a doubly linked list. Every adjacent pair that can merge sits in a
** binary heap keyed by its priority, ties going to the leftmost pair; the
** best pair is merged and the two pairs it creates with its neighbours are
** pushed. Entries made stale by an earlier merge are recognised when popped
** (the pair at that place no longer holds the ids the entry was made for). This
** is O(n log n) per word, so a long run of spaces or digits costs no more
** than its length suggests.
**
** gpt2, gemma4: the priority is the merge's rank in tokenizer.ggml.merges
**       (Gemma 4's GGUF scores are all -1000: only the merges order pieces).
** spm:  the reference tokenizer (Hugging Face's, built from the vocabulary)
**       orders the merges of normal pieces by the merged piece's score,
**       higher first; then by the left part's length in characters, longer
**       first; then the right part's; then by the merged piece's id. Packing
**       those into one 64-bit key reproduces that order exactly.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "model/tokenizer_internal.h"

/* ---- GPT-2's byte <-> code point mapping -------------------------------------
** Printable bytes stand for themselves; the other 68 (0-32, 127-160, 173)
** are moved, in order, to U+0100 onwards so every byte has a visible glyph. */

static bool byte_is_printable(unsigned b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t tsr__byte_to_cp(uint8_t b) {
  if (byte_is_printable(b)) return b;
  if (b <= 32) return 256u + b;
  if (b <= 160) return 256u + 33 + (b - 127u);
  return 256u + 67; /* 173 */
}

int tsr__cp_to_byte(uint32_t cp) {
  if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
  if (cp <= 256 + 32) return (int)(cp - 256);
  if (cp <= 256 + 66) return (int)(cp - 256 - 33 + 127);
  if (cp == 256 + 67) return 173;
  return -1;
}

/* ---- the heap ------------------------------------------------------------------ */

static bool cand_before(const struct tsr__tok_cand *a, const struct tsr__tok_cand *b) {
  return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static tsr_status heap_push(struct tsr__tok_work *w, struct tsr__tok_cand c) {
  if (w->heap_n == w->heap_cap) {
    size_t cap = w->heap_cap ? w->heap_cap * 2 : 256;
    struct tsr__tok_cand *h = realloc(w->heap, cap * sizeof *h);
    if (!h) return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu merges", cap);
    w->heap = h;
    w->heap_cap = cap;
  }
  size_t i = w->heap_n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_before(&c, &w->heap[p])) break;
    w->heap[i] = w->heap[p];
    i = p;
  }
  w->heap[i] = c;
  return TSR_OK;
}

static struct tsr__tok_cand heap_pop(struct tsr__tok_work *w) {
  struct tsr__tok_cand top = w->heap[0], last = w->heap[--w->heap_n];
  size_t i = 0, n = w->heap_n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && cand_before(&w->heap[c + 1], &w->heap[c])) c++;
    if (!cand_before(&w->heap[c], &last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (n) w->heap[i] = last;
  return top;
}

/* ---- pair lookups -------------------------------------------------------------- */

static bool ranked_pair(const struct tsr_tokenizer *tok, int32_t l, int32_t r, uint64_t *key,
                      int32_t *merged) {
  uint64_t k = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
  for (uint64_t i = (k * 0x9E3779B97F4A7C15ull >> 20) & tok->merge_mask;;
       i = (i + 1) & tok->merge_mask) {
    if (!tok->merge_key[i]) return false;
    if (tok->merge_key[i] == k) {
      *key = tok->merge_rank[i];
      *merged = tok->merge_out[i];
      return true;
    }
  }
}

static bool spm_pair(const struct tsr_tokenizer *tok, int32_t l, int32_t r, uint64_t *key,
                     int32_t *merged) {
  if (tok->type[l] != TSR_TOKEN_NORMAL || tok->type[r] != TSR_TOKEN_NORMAL) return false;
  int32_t m = tsr__tok_find2(tok, tok->text + tok->text_off[l], tok->text_len[l],
                             tok->text + tok->text_off[r], tok->text_len[r]);
  if (m < 0 || tok->type[m] != TSR_TOKEN_NORMAL) return false;
  *key = ((uint64_t)tok->score_rank[m] << 40) | ((uint64_t)(255 - tok->cp_len[l]) << 32) |
         ((uint64_t)(255 - tok->cp_len[r]) << 24) | (uint64_t)m;
  *merged = m;
  return true;
}

typedef bool (*pair_fn)(const struct tsr_tokenizer *, int32_t, int32_t, uint64_t *, int32_t *);

static tsr_status push_pair(const struct tsr_tokenizer *tok, struct tsr__tok_work *w, pair_fn pair,
                            int32_t left, int32_t right) {
  if (left < 0 || right < 0) return TSR_OK;
  struct tsr__tok_cand c = {0, left, w->sym[left].id, w->sym[right].id, -1};
  if (!pair(tok, c.left_id, c.right_id, &c.key, &c.out)) return TSR_OK;
  return heap_push(w, c);
}

/* Merges w->sym[0..n) (already linked) and appends the resulting ids. */
static tsr_status merge_all(const struct tsr_tokenizer *tok, struct tsr__tok_work *w, size_t n,
                            pair_fn pair, struct tsr__ids *out) {
  tsr_status st = TSR_OK;
  w->heap_n = 0;
  for (size_t i = 0; i + 1 < n && !st; i++)
    st = push_pair(tok, w, pair, (int32_t)i, (int32_t)i + 1);
  while (!st && w->heap_n) {
    struct tsr__tok_cand c = heap_pop(w);
    struct tsr__tok_sym *l = &w->sym[c.left];
    /* Stale unless the same two ids still stand side by side here; a
    ** symbol's id only ever changes to a longer piece, so equal ids mean
    ** nothing merged into either since the entry was made. */
    if (l->id != c.left_id || l->next < 0 || w->sym[l->next].id != c.right_id) continue;
    struct tsr__tok_sym *r = &w->sym[l->next];
    l->id = c.out;
    l->next = r->next;
    if (r->next >= 0) w->sym[r->next].prev = c.left;
    r->id = -1;
    st = push_pair(tok, w, pair, l->prev, c.left);
    if (!st) st = push_pair(tok, w, pair, c.left, l->next);
  }
  for (int32_t i = n ? 0 : -1; i >= 0 && !st; i = w->sym[i].next)
    st = tsr__ids_push(out, w->sym[i].id);
  return st;
}

static void link_syms(struct tsr__tok_work *w, size_t n) {
  for (size_t i = 0; i < n; i++) {
    w->sym[i].prev = (int32_t)i - 1;
    w->sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
  }
}

/* ---- gpt2 ---------------------------------------------------------------------- */

tsr_status tsr__bpe_encode_word(const struct tsr_tokenizer *tok, struct tsr__tok_work *w,
                                const unsigned char *s, size_t len, struct tsr__ids *out) {
  if (len == 1) return tsr__ids_push(out, tok->byte_tok[s[0]]);
  tsr_status st = tsr__tok_work_reserve(w, len);
  if (st) return st;
  for (size_t i = 0; i < len; i++) w->sym[i].id = tok->byte_tok[s[i]];
  link_syms(w, len);
  return merge_all(tok, w, len, ranked_pair, out);
}

static tsr_status load_merge_table(struct tsr_tokenizer *tok, const struct tsr_gguf *g);

tsr_status tsr__bpe_load_merges(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  const char *path = tsr_gguf_path(g);
  for (int b = 0; b < 256; b++) {
    uint32_t cp = tsr__byte_to_cp((uint8_t)b);
    char u[2];
    size_t ul = 1;
    if (cp < 0x80)
      u[0] = (char)cp;
    else {
      u[0] = (char)(0xC0 | (cp >> 6));
      u[1] = (char)(0x80 | (cp & 0x3F));
      ul = 2;
    }
    tok->byte_tok[b] = tsr_tokenizer_find(tok, u, ul);
    if (tok->byte_tok[b] < 0)
      return tsr_error_set(
          TSR_ERR_FORMAT,
          "%s: tokenizer.ggml.tokens lacks '%.*s', the byte-level token of byte 0x%02X", path,
          (int)ul, u, b);
  }
  return load_merge_table(tok, g);
}

/* tokenizer.ggml.merges ("A B", split at the first space past the first
** byte) as (left id, right id) -> (rank, merged id). */
static tsr_status load_merge_table(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  const char *path = tsr_gguf_path(g);
  const struct tsr_gguf_kv *kv;
  tsr_status st = tsr_gguf_get_arr(g, "tokenizer.ggml.merges", TSR_GGUF_STRING, &kv);
  if (st) return st;
  if (kv->n >= UINT32_MAX)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.merges has %llu entries", path,
                         (unsigned long long)kv->n);
  uint64_t cap = 16;
  while (cap < 2 * kv->n) cap *= 2;
  tok->merge_key = calloc(cap, sizeof *tok->merge_key);
  tok->merge_rank = malloc(cap * sizeof *tok->merge_rank);
  tok->merge_out = malloc(cap * sizeof *tok->merge_out);
  if (!tok->merge_key || !tok->merge_rank || !tok->merge_out)
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %llu merges",
                         (unsigned long long)kv->n);
  tok->merge_mask = cap - 1;
  for (uint64_t m = 0; m < kv->n; m++) {
    const char *s = kv->strs[m].ptr;
    size_t len = (size_t)kv->strs[m].len;
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] = '%.*s' is not 'A B'",
                           path, (unsigned long long)m, (int)(len > 80 ? 80 : len), s);
    size_t al = (size_t)(sp - s), bl = len - al - 1;
    int32_t a = tsr_tokenizer_find(tok, s, al), b = tsr_tokenizer_find(tok, sp + 1, bl);
    int32_t ab = tsr__tok_find2(tok, s, al, sp + 1, bl);
    if (a < 0 || b < 0 || ab < 0)
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: tokenizer.ggml.merges[%llu] = '%.*s': '%.*s' is not in "
                           "tokenizer.ggml.tokens",
                           path, (unsigned long long)m, (int)(len > 80 ? 80 : len), s,
                           (int)(a < 0   ? al
                                 : b < 0 ? bl
                                         : al + bl + 1),
                           a < 0   ? s
                           : b < 0 ? sp + 1
                                   : s);
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t i = (k * 0x9E3779B97F4A7C15ull >> 20) & tok->merge_mask;
    while (tok->merge_key[i] && tok->merge_key[i] != k) i = (i + 1) & tok->merge_mask;
    if (tok->merge_key[i]) continue; /* a repeated merge keeps its first rank */
    tok->merge_key[i] = k;
    tok->merge_rank[i] = (uint32_t)m;
    tok->merge_out[i] = ab;
  }
  return TSR_OK;
}

/* ---- spm ----------------------------------------------------------------------- */

tsr_status tsr__spm_encode(const struct tsr_tokenizer *tok, struct tsr__tok_work *w,
                           const unsigned char *s, size_t len, struct tsr__ids *out) {
  /* Every byte may become a symbol (byte fallback), never more. */
  tsr_status st = tsr__tok_work_reserve(w, len);
  if (st) return st;
  size_t n = 0;
  for (size_t i = 0; i < len;) {
    size_t cl = tsr__utf8_char_len(s + i, len - i);
    int32_t id = cl ? tsr_tokenizer_find(tok, (const char *)s + i, cl) : -1;
    if (!cl) cl = 1; /* an invalid byte stands alone */
    if (id >= 0)
      w->sym[n++].id = id;
    else
      for (size_t j = 0; j < cl; j++) w->sym[n++].id = tok->byte_tok[s[i + j]];
    i += cl;
  }
  link_syms(w, n);
  return merge_all(tok, w, n, tok->kind == TSR__TOK_GEMMA4 ? ranked_pair : spm_pair, out);
}

/* The <0xXX> token of each byte, for characters the vocabulary lacks; the
** unknown token where a byte has none. */
static tsr_status load_byte_tokens(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  const char *path = tsr_gguf_path(g);
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    tok->byte_tok[b] = tsr_tokenizer_find(tok, name, 6);
    if (tok->byte_tok[b] < 0) tok->byte_tok[b] = tok->unk;
    if (tok->byte_tok[b] < 0)
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: tokenizer.ggml.tokens has no byte token %s and there is no "
                           "tokenizer.ggml.unknown_token_id to fall back to",
                           path, name);
  }
  return TSR_OK;
}

struct scored {
  float score;
  int32_t id;
};
static int by_score_desc(const void *a, const void *b) {
  float x = ((const struct scored *)a)->score, y = ((const struct scored *)b)->score;
  return x > y ? -1 : x < y ? 1 : 0;
}

tsr_status tsr__spm_load(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  const char *path = tsr_gguf_path(g);
  size_t n = (size_t)tok->n_vocab;
  if (n >= (1u << 24))
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.tokens has %zu entries; SentencePiece vocabularies "
                         "of 2^24 or more are not supported",
                         path, n);
  const struct tsr_gguf_kv *kv;
  tsr_status st = tsr_gguf_get_arr(g, "tokenizer.ggml.scores", TSR_GGUF_F32, &kv);
  if (st) return st;
  if (kv->n != n)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: tokenizer.ggml.scores has %llu entries, tokenizer.ggml.tokens %zu",
                         path, (unsigned long long)kv->n, n);
  struct scored *order = malloc(n * sizeof *order);
  tok->score_rank = calloc(n, sizeof *tok->score_rank);
  tok->cp_len = malloc(n);
  if (!order || !tok->score_rank || !tok->cp_len) {
    free(order);
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for %zu scores", n);
  }
  size_t n_normal = 0;
  for (size_t i = 0; i < n; i++) {
    if (tok->type[i] != TSR_TOKEN_NORMAL) continue;
    float s;
    memcpy(&s, (const char *)kv->data + i * sizeof s, sizeof s);
    if (isnan(s)) {
      free(order);
      return tsr_error_set(TSR_ERR_FORMAT, "%s: tokenizer.ggml.scores[%zu] is NaN", path, i);
    }
    order[n_normal++] = (struct scored){s, (int32_t)i};
  }
  /* qsort is not stable, but equal scores share one rank, so the order among
  ** them does not matter. */
  qsort(order, n_normal, sizeof *order, by_score_desc);
  uint32_t rank = 0;
  for (size_t i = 0; i < n_normal; i++) {
    if (i && order[i].score != order[i - 1].score) rank++;
    tok->score_rank[order[i].id] = rank;
  }
  free(order);

  for (size_t i = 0; i < n; i++) {
    const unsigned char *t = (const unsigned char *)tok->text + tok->text_off[i];
    size_t c = 0;
    for (size_t j = 0; j < tok->text_len[i]; j++) c += (t[j] & 0xC0) != 0x80;
    tok->cp_len[i] = (uint8_t)(c > 255 ? 255 : c);
  }
  return load_byte_tokens(tok, g);
}

tsr_status tsr__gemma4_load(struct tsr_tokenizer *tok, const struct tsr_gguf *g) {
  tsr_status st = load_byte_tokens(tok, g);
  return st ? st : load_merge_table(tok, g);
}
