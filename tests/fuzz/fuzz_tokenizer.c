/* libFuzzer target: tokenizer encode and decode on arbitrary bytes, for every
** tokenizer family, built once at start-up:
**   0  gpt2, pre qwen2:   the default model's vocabulary (models/ref-qwen3-21m.gguf)
**   1  gpt2, pre qwen35:  the same vocabulary and merges under Qwen3.5's regex
**   2  gemma4:            models/ref-gemma4-23m.gguf
**   3  llama (spm):       the Gemma 4 vocabulary scored by id, merged by score
**   4  gpt2, tiny:        added tokens that overlap, nest and hold UTF-8
**   5  llama (spm), tiny: the unit tests' vocabulary with added tokens
** Input: one flag byte, then the text.
**   bits 0-2: the tokenizer (mod 6)    bit 3: parse_special    bit 4: add_special
**   bit 5: encode_marked, only every other run of `stride` bytes marked as
**   template bytes; bits 6-7: stride - 1
** Checked: encoding any bytes succeeds with ids in range; decoding gives the
** exact bytes back (gpt2: for text NFC cannot change, i.e. with no byte from
** 0xCC up; spm and gemma4: with U+2581 read back as a space, as SentencePiece
** decodes it); encode_marked with every byte marked is encode with
** parse_special, with none marked encode without; streaming the pieces through
** tsr_utf8_stream gives the decoded text; decoding ids read from the input
** fails exactly when one is out of range. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

#ifndef TSR_FUZZ_MODELS_DIR
#define TSR_FUZZ_MODELS_DIR "models"
#endif

enum { N_TOK = 6 };
static struct tsr_tokenizer *g_tok[N_TOK];
static volatile uint64_t g_sink;

/* ---- building the tokenizers ------------------------------------------------ */

struct tok_spec {
  const char *model, *pre; /* pre NULL: key absent */
  const char *const *tokens;
  const int32_t *types;
  size_t n;
  const char *const *merges; /* NULL: key absent */
  size_t n_merges;
  const float *scores; /* NULL: key absent */
  int32_t bos, eos, unk; /* -1: key absent */
};

static void die(const char *what) {
  fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, tsr_error_message());
  abort();
}

static struct tsr_tokenizer *build(const struct tok_spec *s) {
  char dir[] = "/tmp/tsr_fuzz_tok_XXXXXX", path[64];
  if (!mkdtemp(dir)) die("mkdtemp");
  snprintf(path, sizeof path, "%s/tok.gguf", dir);
  struct tsr_gguf_writer *w;
  int ok = tsr_gguf_writer_new(&w) == TSR_OK;
  ok = ok && !tsr_gguf_writer_add_str(w, "tokenizer.ggml.model", s->model);
  if (s->pre) ok = ok && !tsr_gguf_writer_add_str(w, "tokenizer.ggml.pre", s->pre);
  ok = ok && !tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", s->tokens, s->n);
  ok = ok && !tsr_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_I32, s->types, s->n);
  if (s->merges)
    ok = ok && !tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", s->merges, s->n_merges);
  if (s->scores)
    ok = ok && !tsr_gguf_writer_add_arr(w, "tokenizer.ggml.scores", TSR_GGUF_F32, s->scores, s->n);
  if (s->bos >= 0) ok = ok && !tsr_gguf_writer_add_i32(w, "tokenizer.ggml.bos_token_id", s->bos);
  if (s->eos >= 0) ok = ok && !tsr_gguf_writer_add_i32(w, "tokenizer.ggml.eos_token_id", s->eos);
  if (s->unk >= 0)
    ok = ok && !tsr_gguf_writer_add_i32(w, "tokenizer.ggml.unknown_token_id", s->unk);
  if (strcmp(s->model, "gpt2"))
    ok = ok && !tsr_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", 0);
  ok = ok && !tsr_gguf_writer_write(w, path);
  tsr_gguf_writer_free(w);
  struct tsr_gguf *g;
  struct tsr_tokenizer *tok = NULL;
  ok = ok && !tsr_gguf_open(path, &g);
  if (ok) {
    ok = !tsr_tokenizer_load(g, &tok);
    tsr_gguf_close(g);
  }
  unlink(path);
  rmdir(dir);
  if (!ok) die(s->model);
  return tok;
}

static struct tsr_tokenizer *load_model(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", TSR_FUZZ_MODELS_DIR, name);
  struct tsr_gguf *g;
  struct tsr_tokenizer *tok;
  if (tsr_gguf_open(path, &g) || tsr_tokenizer_load(g, &tok)) die(path);
  tsr_gguf_close(g);
  return tok;
}

/* A model's vocabulary as a spec, to rebuild it with another model or pre. */
struct vocab {
  struct tsr_gguf *g;
  const char **tokens, **merges;
  int32_t *types;
  size_t n, n_merges;
};

static void read_vocab(const char *name, struct vocab *v) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", TSR_FUZZ_MODELS_DIR, name);
  const struct tsr_gguf_kv *tk, *ty, *mg;
  if (tsr_gguf_open(path, &v->g) ||
      tsr_gguf_get_arr(v->g, "tokenizer.ggml.tokens", TSR_GGUF_STRING, &tk) ||
      tsr_gguf_get_arr(v->g, "tokenizer.ggml.token_type", TSR_GGUF_TYPE_COUNT, &ty) ||
      tsr_gguf_get_arr(v->g, "tokenizer.ggml.merges", TSR_GGUF_STRING, &mg) || tk->n != ty->n)
    die(path);
  v->n = tk->n;
  v->n_merges = mg->n;
  v->tokens = calloc(v->n, sizeof *v->tokens);
  v->types = calloc(v->n, sizeof *v->types);
  v->merges = calloc(v->n_merges + 1, sizeof *v->merges);
  for (size_t i = 0; i < v->n; i++) {
    int64_t t;
    if (tsr_gguf_arr_i64(v->g, ty, i, &t)) die(path);
    v->tokens[i] = tk->strs[i].ptr;
    v->types[i] = (int32_t)t;
  }
  for (size_t i = 0; i < v->n_merges; i++) v->merges[i] = mg->strs[i].ptr;
}

static void free_vocab(struct vocab *v) {
  free(v->tokens);
  free(v->types);
  free(v->merges);
  tsr_gguf_close(v->g);
}

/* The byte-level spelling of byte b (GPT-2's mapping), in buf. */
static const char *byte_level(uint8_t b, char buf[3]) {
  uint32_t cp = tsr__byte_to_cp(b);
  if (cp < 0x80) {
    buf[0] = (char)cp, buf[1] = 0;
  } else {
    buf[0] = (char)(0xC0 | (cp >> 6)), buf[1] = (char)(0x80 | (cp & 0x3F)), buf[2] = 0;
  }
  return buf;
}

/* 256 byte tokens, a few merges, and added tokens that share prefixes, nest
** inside each other, sit inside normal text, and hold multi-byte characters. */
static struct tsr_tokenizer *build_tiny_gpt2(void) {
  static char bytes[256][3];
  static const char *const extra[] = {
      "ab", "abc", "\xC4\xA0t", "\xC4\xA0th", "<|im_start|>", "<|im_end|>", "<|im", "<tool>",
      "\xC3\xA9", "<unk>", "\n", "\xE2\x96\x81x", "\xCC\x81", "<|im_end|>x", "ool"};
  static const int32_t extra_types[] = {
      TSR_TOKEN_NORMAL, TSR_TOKEN_NORMAL, TSR_TOKEN_NORMAL, TSR_TOKEN_NORMAL, TSR_TOKEN_CONTROL,
      TSR_TOKEN_CONTROL, TSR_TOKEN_CONTROL, TSR_TOKEN_USER_DEFINED, TSR_TOKEN_USER_DEFINED,
      TSR_TOKEN_UNKNOWN, TSR_TOKEN_USER_DEFINED, TSR_TOKEN_USER_DEFINED, TSR_TOKEN_CONTROL,
      TSR_TOKEN_NORMAL, TSR_TOKEN_USER_DEFINED};
  enum { N_EXTRA = sizeof extra / sizeof extra[0] };
  const char *tokens[256 + N_EXTRA];
  int32_t types[256 + N_EXTRA];
  for (int b = 0; b < 256; b++) {
    tokens[b] = byte_level((uint8_t)b, bytes[b]);
    types[b] = TSR_TOKEN_NORMAL;
  }
  for (int i = 0; i < N_EXTRA; i++) tokens[256 + i] = extra[i], types[256 + i] = extra_types[i];
  static const char *const merges[] = {"a b", "ab c", "\xC4\xA0 t", "\xC4\xA0t h"};
  struct tok_spec s = {"gpt2", "qwen2", tokens, types, 256 + N_EXTRA, merges, 4, NULL,
                       256 + 4, 256 + 5, -1};
  return build(&s);
}

/* core/tests/test_tokenizer.c's spm vocabulary: <unk> <s> </s>, the byte tokens, pieces. */
static struct tsr_tokenizer *build_tiny_spm(void) {
  static const char *const pieces[] = {
      "\xE2\x96\x81", "h", "e", "l", "o", "he", "ll", "hell", "hello", "\xE2\x96\x81hello", "lo",
      "hel", "<start>", "\n", "o<", "<u|v>", "|v", "<"};
  static const float piece_scores[] = {-1, -1, -1, -1, -1, -5, -2, -4, -3,
                                       -6, -9, -9, 0,  0,  -1, 0,  0,  -1};
  enum { NP = sizeof pieces / sizeof pieces[0], BASE = 3 + 256, N = BASE + NP };
  static char names[256][8];
  const char *tokens[N];
  int32_t types[N];
  float scores[N];
  tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
  for (int i = 0; i < 3; i++) types[i] = TSR_TOKEN_CONTROL, scores[i] = 0;
  for (int b = 0; b < 256; b++) {
    snprintf(names[b], sizeof names[b], "<0x%02X>", b);
    tokens[3 + b] = names[b], types[3 + b] = TSR_TOKEN_BYTE, scores[3 + b] = 0;
  }
  for (int i = 0; i < NP; i++)
    tokens[BASE + i] = pieces[i], types[BASE + i] = TSR_TOKEN_NORMAL, scores[BASE + i] = piece_scores[i];
  types[BASE + 12] = TSR_TOKEN_CONTROL;
  types[BASE + 13] = TSR_TOKEN_USER_DEFINED;
  types[BASE + 15] = TSR_TOKEN_CONTROL;
  types[BASE + 16] = TSR_TOKEN_USER_DEFINED;
  struct tok_spec s = {"llama", "default", tokens, types, N, NULL, 0, scores, 1, 2, 0};
  return build(&s);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  g_tok[0] = load_model("ref-qwen3-21m.gguf");
  struct vocab q;
  read_vocab("ref-qwen3-21m.gguf", &q);
  struct tok_spec s35 = {"gpt2", "qwen35", q.tokens, q.types, q.n, q.merges, q.n_merges, NULL,
                         -1, tsr_tokenizer_eos(g_tok[0]), -1};
  g_tok[1] = build(&s35);
  free_vocab(&q);

  g_tok[2] = load_model("ref-gemma4-23m.gguf");
  struct vocab gv;
  read_vocab("ref-gemma4-23m.gguf", &gv);
  float *scores = malloc(gv.n * sizeof *scores);
  for (size_t i = 0; i < gv.n; i++) scores[i] = -(float)i; /* earlier pieces merge first */
  struct tok_spec spm = {"llama", NULL, gv.tokens, gv.types, gv.n, NULL, 0, scores,
                         tsr_tokenizer_bos(g_tok[2]), tsr_tokenizer_eos(g_tok[2]), 3};
  g_tok[3] = build(&spm);
  free(scores);
  free_vocab(&gv);

  g_tok[4] = build_tiny_gpt2();
  g_tok[5] = build_tiny_spm();
  return 0;
}

/* ---- one input ----------------------------------------------------------------- */

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
  return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* The text decode must give back for text encoded without BOS and EOS, or NULL
** (into *len) when there is no exact expectation. */
static char *expected_text(const struct tsr_tokenizer *tok, const char *text, size_t len,
                           size_t *out_len) {
  char *want = malloc(len + 1);
  size_t o = 0;
  if (!strcmp(tsr_tokenizer_model_name(tok), "gpt2")) {
    for (size_t i = 0; i < len; i++)
      if ((unsigned char)text[i] >= 0xCC) { /* NFC may change it */
        free(want);
        return NULL;
      }
    memcpy(want, text, len);
    o = len;
  } else {
    for (size_t i = 0; i < len; i++) {
      if (i + 2 < len && !memcmp(text + i, "\xE2\x96\x81", 3)) {
        want[o++] = ' ';
        i += 2;
      } else {
        want[o++] = text[i];
      }
    }
  }
  *out_len = o;
  return want;
}

/* Streaming the pieces of ids gives what decoding them gives. */
static void check_stream(const struct tsr_tokenizer *tok, const int32_t *ids, size_t n,
                         const char *decoded, size_t decoded_len) {
  char *out = malloc(decoded_len + 4 * n + 8);
  size_t o = 0;
  struct tsr_utf8_stream us = TSR_UTF8_STREAM_INIT;
  for (size_t i = 0; i < n; i++) {
    size_t pl;
    const char *piece = tsr_tokenizer_piece(tok, ids[i], &pl);
    REQUIRE(piece != NULL);
    o += tsr_utf8_stream_push(&us, piece, pl, out + o);
    REQUIRE(o <= decoded_len);
  }
  o += tsr_utf8_stream_flush(&us, out + o);
  REQUIRE(o == decoded_len && !memcmp(out, decoded, o));
  free(out);
}

static void encode_ok(const struct tsr_tokenizer *tok, const char *text, size_t len, bool special,
                      const unsigned char *ok, bool add, int32_t **ids, size_t *n) {
  REQUIRE(tsr_tokenizer_encode_marked(tok, text, len, special, ok, add, ids, n) == TSR_OK);
  REQUIRE((*n == 0) == (*ids == NULL));
  int32_t nv = tsr_tokenizer_n_vocab(tok);
  for (size_t i = 0; i < *n; i++) REQUIRE((*ids)[i] >= 0 && (*ids)[i] < nv);
}

/* Ids taken from the input bytes, some out of range: decode fails exactly then. */
static void decode_raw_ids(const struct tsr_tokenizer *tok, const uint8_t *p, size_t len) {
  size_t n = len / 2;
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  int32_t nv = tsr_tokenizer_n_vocab(tok);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int32_t)((p[2 * i] | p[2 * i + 1] << 8) % (nv + 16)) - 8;
    bad |= ids[i] < 0 || ids[i] >= nv;
    g_sink += tsr_tokenizer_is_eog(tok, ids[i]) + tsr_tokenizer_token_type(tok, ids[i]);
    const char *t = tsr_tokenizer_token_text(tok, ids[i]);
    REQUIRE(!t == (ids[i] < 0 || ids[i] >= nv));
  }
  char *text;
  size_t tl;
  tsr_status st = tsr_tokenizer_decode(tok, ids, n, &text, &tl);
  REQUIRE(bad ? st == TSR_ERR_INVALID_ARG && !text : st == TSR_OK && text && !text[tl]);
  if (!bad) check_stream(tok, ids, n, text, tl);
  free(text);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const unsigned flags = data[0];
  const struct tsr_tokenizer *tok = g_tok[(flags & 7) % N_TOK];
  const bool special = flags & 8, add = flags & 16, marked = flags & 32;
  const size_t stride = 1 + (flags >> 6);
  const char *text = (const char *)data + 1;
  const size_t len = size - 1;

  unsigned char *mask = NULL, *ones = NULL, *zeros = NULL;
  if (marked) {
    mask = malloc(len + 1);
    ones = malloc(len + 1);
    zeros = calloc(len + 1, 1);
    for (size_t i = 0; i < len; i++) mask[i] = !((i / stride) & 1), ones[i] = 1;
  }

  int32_t *ids;
  size_t n;
  encode_ok(tok, text, len, special, mask, add, &ids, &n);
  /* BOS and EOS come only where the tokenizer adds them */
  size_t first = 0, last = n;
  if (add && tsr_tokenizer_adds_bos(tok)) {
    REQUIRE(n >= 1 && ids[0] == tsr_tokenizer_bos(tok));
    first = 1;
  }
  if (add && tsr_tokenizer_adds_eos(tok)) {
    REQUIRE(n > first && ids[n - 1] == tsr_tokenizer_eos(tok));
    last = n - 1;
  }
  REQUIRE(len || last == first);
  const int32_t *body = n ? ids + first : NULL; /* ids is NULL when n is 0 */

  char *back;
  size_t back_len;
  REQUIRE(tsr_tokenizer_decode(tok, body, last - first, &back, &back_len) == TSR_OK);
  REQUIRE(back && !back[back_len]);
  size_t want_len;
  char *want = expected_text(tok, text, len, &want_len);
  if (want) REQUIRE(back_len == want_len && !memcmp(back, want, want_len));
  check_stream(tok, body, last - first, back, back_len);
  free(want);
  free(back);

  if (marked) {
    int32_t *a, *b;
    size_t na, nb;
    encode_ok(tok, text, len, true, ones, add, &a, &na);
    encode_ok(tok, text, len, true, NULL, add, &b, &nb);
    REQUIRE(same_ids(a, na, b, nb));
    free(a);
    free(b);
    encode_ok(tok, text, len, true, zeros, add, &a, &na);
    encode_ok(tok, text, len, false, NULL, add, &b, &nb);
    REQUIRE(same_ids(a, na, b, nb));
    free(a);
    free(b);
  }

  if (len <= 64) g_sink += (uint64_t)tsr_tokenizer_find(tok, text, len);
  decode_raw_ids(tok, data + 1, len);
  free(ids);
  free(mask);
  free(ones);
  free(zeros);
  return 0;
}
