/*
** Tokenizer tests.
**
** Without arguments: unit tests on tiny vocabularies written into GGUF files
** with the core's writer (byte mapping, merge order, pre-tokenizer splits,
** added tokens, SentencePiece merges and byte fallback, Gemma 4's ranked
** merges, BOS, errors, streaming UTF-8).
**
** With --corpus EXPECTED.json: the real tokenizer named in the file's header
** (source_file, looked up in ${TESSERA_MODEL_CACHE:-$HOME/.cache/tessera/models})
** must reproduce every case's ids exactly, with and without special-token
** parsing, and decode them back to the expected text. A missing model file
** is a failure that says how to fetch it.
**
** With --gemma4 FIXTURE_DIR EXPECTED.json [TESSERA]: the fixture's
** tokenizer.json converted in process (the core's tokenizer writer, as
** `tessera convert` runs it for gemma4) must reproduce the committed ids of
** Hugging Face tokenizers (tests/reference/make_tokenizer_expected.py) the
** same way. With the tessera binary, the whole fixture is also converted by
** `tessera convert`, its GGUF checked likewise, and `tessera run` must
** generate from it.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/convert.h"
#include "common/error.h"
#include "model/gguf.h"
#include "harness.h"
#include "model/json.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

/* ---- building tiny tokenizers ----------------------------------------------- */

/* UTF-8 of GPT-2's mapped character for each byte of s. */
static const char *bl(const char *s) {
  static char bufs[8][256];
  static int k;
  char *o = bufs[k++ & 7], *p = o;
  for (; *s; s++) {
    uint32_t cp = tsr__byte_to_cp((uint8_t)*s);
    if (cp < 0x80)
      *p++ = (char)cp;
    else {
      *p++ = (char)(0xC0 | (cp >> 6));
      *p++ = (char)(0x80 | (cp & 0x3F));
    }
  }
  *p = '\0';
  return o;
}

struct spec {
  const char *model, *pre;    /* pre NULL: key absent */
  const char *const *extra;   /* tokens after the 256 byte tokens (gpt2) or all tokens (spm) */
  const int32_t *extra_types; /* NULL: all normal */
  int n_extra;
  const char *const *merges;
  int n_merges;
  const float *scores; /* spm: one per token */
  int64_t bos, eos;    /* -2: key absent */
  int add_bos;         /* -1: key absent */
  int space_prefix;    /* llama only; -1: key absent */
};

static char g_dir[] = "/tmp/tsr_test_tok_XXXXXX";

/* Writes the tokenizer described by sp and loads it; returns the status. */
static tsr_status build(const struct spec *sp, struct tsr_tokenizer **out) {
  *out = NULL;
  int gpt2 = strcmp(sp->model, "gpt2") == 0;
  int n = (gpt2 ? 256 : 0) + sp->n_extra;
  const char **tokens = calloc((size_t)n, sizeof *tokens);
  char(*bytes)[4] = calloc(256, 4);
  int32_t *types = calloc((size_t)n, sizeof *types);
  int i = 0;
  if (gpt2)
    for (; i < 256; i++) {
      char raw[2] = {(char)i, 0};
      if (i == 0) { /* bl() stops at NUL */
        memcpy(bytes[0], "\xC4\x80", 3);
      } else
        strcpy(bytes[i], bl(raw));
      tokens[i] = bytes[i];
      types[i] = TSR_TOKEN_NORMAL;
    }
  for (int j = 0; j < sp->n_extra; j++, i++) {
    tokens[i] = sp->extra[j];
    types[i] = sp->extra_types ? sp->extra_types[j] : TSR_TOKEN_NORMAL;
  }
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK_OK(tsr_gguf_writer_add_str(w, "tokenizer.ggml.model", sp->model));
  if (sp->pre) CHECK_OK(tsr_gguf_writer_add_str(w, "tokenizer.ggml.pre", sp->pre));
  CHECK_OK(tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n));
  CHECK_OK(
      tsr_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_I32, types, (uint64_t)n));
  if (sp->n_merges)
    CHECK_OK(tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", sp->merges,
                                         (uint64_t)sp->n_merges));
  else if (gpt2)
    CHECK_OK(tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", NULL, 0));
  if (sp->scores)
    CHECK_OK(
        tsr_gguf_writer_add_arr(w, "tokenizer.ggml.scores", TSR_GGUF_F32, sp->scores, (uint64_t)n));
  if (sp->bos != -2)
    CHECK_OK(tsr_gguf_writer_add_i32(w, "tokenizer.ggml.bos_token_id", (int32_t)sp->bos));
  if (sp->eos != -2)
    CHECK_OK(tsr_gguf_writer_add_i32(w, "tokenizer.ggml.eos_token_id", (int32_t)sp->eos));
  if (sp->add_bos >= 0)
    CHECK_OK(tsr_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", sp->add_bos));
  if (!gpt2 && sp->space_prefix >= 0)
    CHECK_OK(tsr_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", sp->space_prefix));
  char path[300];
  snprintf(path, sizeof path, "%s/tok.gguf", g_dir);
  CHECK_OK(tsr_gguf_writer_write(w, path));
  tsr_gguf_writer_free(w);
  free(tokens);
  free(bytes);
  free(types);
  struct tsr_gguf *g;
  tsr_status st = tsr_gguf_open(path, &g);
  CHECK_OK(st);
  if (st) return st;
  st = tsr_tokenizer_load(g, out);
  tsr_gguf_close(g); /* the tokenizer must not need the file any more */
  unlink(path);
  return st;
}

/* Encodes text and compares with the expected ids (terminated by -1). */
static int encodes_marked_to(const struct tsr_tokenizer *tok, const char *text, size_t len,
                             bool special, const unsigned char *special_ok, bool add,
                             const int32_t *want) {
  int32_t *ids;
  size_t n, nw = 0;
  if (tsr_tokenizer_encode_marked(tok, text, len, special, special_ok, add, &ids, &n)) {
    fprintf(stderr, "  encode failed: %s\n", tsr_error_message());
    return 0;
  }
  while (want[nw] >= 0) nw++;
  int ok = n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "  '%.*s': got", (int)len, text);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, ", want");
    for (size_t i = 0; i < nw; i++) fprintf(stderr, " %d", want[i]);
    fputc('\n', stderr);
  }
  free(ids);
  return ok;
}
static int encodes_to(const struct tsr_tokenizer *tok, const char *text, size_t len, bool special,
                      bool add, const int32_t *want) {
  return encodes_marked_to(tok, text, len, special, NULL, add, want);
}
#define ENC(tok, text, special, ...)                                                               \
  encodes_to(tok, text, strlen(text), special, false, (const int32_t[]){__VA_ARGS__, -1})
/* mask: one '1' (special tokens parsed) or '0' (text) per byte of text */
static int encodes_marked(const struct tsr_tokenizer *tok, const char *text, const char *mask,
                          const int32_t *want) {
  unsigned char ok[256];
  const size_t len = strlen(text);
  if (strlen(mask) != len || len > sizeof ok) return 0;
  for (size_t i = 0; i < len; i++) ok[i] = mask[i] == '1';
  return encodes_marked_to(tok, text, len, true, ok, false, want);
}
#define ENC_MARKED(tok, text, mask, ...)                                                           \
  encodes_marked(tok, text, mask, (const int32_t[]){__VA_ARGS__, -1})

/* encode then decode gives back exactly the input bytes */
static int round_trips(const struct tsr_tokenizer *tok, const char *text, size_t len) {
  int32_t *ids;
  size_t n, dl;
  char *back;
  if (tsr_tokenizer_encode(tok, text, len, true, false, &ids, &n)) return 0;
  if (tsr_tokenizer_decode(tok, ids, n, &back, &dl)) {
    free(ids);
    return 0;
  }
  int ok = dl == len && memcmp(back, text, len) == 0;
  free(ids);
  free(back);
  return ok;
}

/* ---- gpt2 -------------------------------------------------------------------- */

static void byte_mapping_round_trips_all_256_bytes(void) {
  int seen[512] = {0};
  for (int b = 0; b < 256; b++) {
    uint32_t cp = tsr__byte_to_cp((uint8_t)b);
    CHECK(cp < 512);
    if (cp >= 512) continue;
    CHECK(!seen[cp]);
    seen[cp] = 1;
    CHECK(tsr__cp_to_byte(cp) == b);
    if (b >= '!' && b <= '~') CHECK(cp == (uint32_t)b);
  }
  CHECK(tsr__byte_to_cp(' ') == 0x120);  /* Ġ */
  CHECK(tsr__byte_to_cp('\n') == 0x10A); /* Ċ */
  CHECK(tsr__cp_to_byte(0x144) == -1 && tsr__cp_to_byte(0x41) == 'A');

  /* every byte value, through a tokenizer with no merges, comes back as itself */
  struct spec sp = {"gpt2", "qwen2", NULL, NULL, 0, NULL, 0, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  char all[256];
  for (int b = 0; b < 256; b++) all[b] = (char)b;
  CHECK(round_trips(tok, all, 256));
  int32_t *ids;
  size_t n;
  CHECK_OK(tsr_tokenizer_encode(tok, all, 256, true, false, &ids, &n));
  CHECK(n == 256);
  for (size_t i = 0; i < n && n == 256; i++) CHECK(ids[i] == (int32_t)i);
  free(ids);
  tsr_tokenizer_free(tok);
}

static void merges_apply_lowest_rank_first(void) {
  const char *extra[] = {"ab", "bc", "abc"};
  const char *m1[] = {"b c", "a b", "a bc"}; /* bc first: a|bc -> abc */
  const char *m2[] = {"a b", "b c"};         /* ab first: ab|c, no ab+c merge */
  struct spec sp = {"gpt2", "qwen2", extra, NULL, 3, m1, 3, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  CHECK(ENC(tok, "abc", false, 258));
  CHECK(ENC(tok, "abcab", false, 258, 256)); /* one pre-token */
  tsr_tokenizer_free(tok);
  sp.merges = m2;
  sp.n_merges = 2;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  CHECK(ENC(tok, "abc", false, 256, 'c'));
  tsr_tokenizer_free(tok);
}

static void equal_merges_go_leftmost_first(void) {
  const char *extra[] = {"aa"};
  const char *m[] = {"a a"};
  struct spec sp = {"gpt2", "qwen2", extra, NULL, 1, m, 1, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  CHECK(ENC(tok, "aaa", false, 256, 'a'));
  CHECK(ENC(tok, "aaaaa", false, 256, 256, 'a'));
  tsr_tokenizer_free(tok);
}

static void long_words_merge_in_reasonable_time(void) {
  /* 200k spaces are one pre-token; merging it must not be quadratic. */
  char sp2[8], sp4[16], m1[16], m2[24];
  strcpy(sp2, bl("  "));
  strcpy(sp4, bl("    "));
  snprintf(m1, sizeof m1, "%s %s", bl(" "), bl(" "));
  snprintf(m2, sizeof m2, "%s %s", sp2, sp2);
  const char *extra[] = {sp2, sp4};
  const char *m[] = {m1, m2};
  struct spec sp = {"gpt2", "qwen2", extra, NULL, 2, m, 2, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  size_t len = 200001;
  char *text = malloc(len);
  memset(text, ' ', len);
  int32_t *ids;
  size_t n;
  clock_t t0 = clock();
  CHECK_OK(tsr_tokenizer_encode(tok, text, len, true, false, &ids, &n));
  double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
  CHECK_MSG(s < 2.0, "%.2f s for 200k spaces", s);
  CHECK(n == 50001 && ids[0] == 257 && ids[49999] == 257 && ids[50000] == ' ');
  free(ids);
  free(text);
  tsr_tokenizer_free(tok);
}

static void qwen2_regex_splits_words_numbers_and_contractions(void) {
  char m_o_sp[16], m_sp_w[16], sp_w[8], m_12[8];
  snprintf(m_o_sp, sizeof m_o_sp, "o %s", bl(" "));
  snprintf(m_sp_w, sizeof m_sp_w, "%s w", bl(" "));
  strcpy(sp_w, bl(" w"));
  strcpy(m_12, "1 2");
  const char *extra[] = {"o"
                         "\xC4\xA0",
                         sp_w, "12", "'m"};
  const char *m[] = {m_o_sp, m_sp_w, m_12, "' m"};
  struct spec sp = {"gpt2", "qwen2", extra, NULL, 4, m, 4, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  /* "o " never merges: the space begins the next pre-token " w" */
  CHECK(ENC(tok, "o w", false, 'o', 257));
  /* digits are pre-tokens of one digit each, so "12" never forms */
  CHECK(ENC(tok, "12", false, '1', '2'));
  /* contractions split off, in either case */
  CHECK(ENC(tok, "I'm", false, 'I', 259));
  CHECK(ENC(tok, "I'M", false, 'I', '\'', 'M'));
  tsr_tokenizer_free(tok);
}

static void qwen35_keeps_combining_marks_with_letters(void) {
  /* KI: U+0915 (a letter) then U+093F (a spacing mark, \p{M}). qwen2 puts the
  ** mark in a pre-token of its own; qwen35 keeps it with the letter, so only
  ** qwen35 can merge the two. */
  const char *ki = "\xE0\xA4\x95\xE0\xA4\xBF";
  char k1[16], ka[16], vi[16], whole[32], m1[32], m2[32], m3[32], m4[48];
  strcpy(k1, bl("\xE0\xA4"));
  strcpy(ka, bl("\xE0\xA4\x95"));
  strcpy(vi, bl("\xE0\xA4\xBF"));
  strcpy(whole, bl(ki));
  snprintf(m1, sizeof m1, "%s %s", bl("\xE0"), bl("\xA4"));
  snprintf(m2, sizeof m2, "%s %s", k1, bl("\x95"));
  snprintf(m3, sizeof m3, "%s %s", k1, bl("\xBF"));
  snprintf(m4, sizeof m4, "%s %s", ka, vi);
  const char *extra[] = {k1, ka, vi, whole};
  const char *m[] = {m1, m2, m3, m4};
  struct spec sp = {"gpt2", "qwen2", extra, NULL, 4, m, 4, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *q2, *q35;
  CHECK_OK(build(&sp, &q2));
  sp.pre = "qwen35";
  CHECK_OK(build(&sp, &q35));
  if (!q2 || !q35) return;
  CHECK(ENC(q2, ki, false, 257, 258));
  CHECK(ENC(q35, ki, false, 259));
  CHECK(strcmp(tsr_tokenizer_pre_name(q35), "qwen35") == 0);
  tsr_tokenizer_free(q2);
  tsr_tokenizer_free(q35);
}

static void nfc_composes_before_merging(void) {
  /* é is C3 A9 composed; e + U+0301 decomposed. */
  char e[16], m1[16];
  strcpy(e, bl("\xC3\xA9"));
  snprintf(m1, sizeof m1, "%s %s", bl("\xC3"), bl("\xA9"));
  const char *extra[] = {e};
  const char *m[] = {m1};
  struct spec sp = {"gpt2", "qwen2", extra, NULL, 1, m, 1, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  CHECK(ENC(tok, "\xC3\xA9", false, 256));
  CHECK(ENC(tok, "e\xCC\x81", false, 256));
  tsr_tokenizer_free(tok);
}

static void invalid_utf8_is_encoded_byte_level(void) {
  struct spec sp = {"gpt2", "qwen2", NULL, NULL, 0, NULL, 0, NULL, -2, -2, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  const char *bad[] = {"\xFF",
                       "a\xC3",
                       "\xC3(x",
                       "\xE2\x82",
                       "ab \xED\xA0\x80 cd",
                       "\xF4\x90\x80\x80",
                       "\xCC\x81\xFF\xCC\x81",
                       "\xC0\xAF\n\x80"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_MSG(round_trips(tok, bad[i], strlen(bad[i])), "case %zu", i);
  CHECK(ENC(tok,
            "a\xFF"
            "b",
            false, 'a', 0xFF, 'b'));
  tsr_tokenizer_free(tok);
}

static void special_tokens_match_only_when_parsed(void) {
  const char *extra[] = {"<|im_end|>", "<tool>", "<|im", "<|im_end|>x"};
  const int32_t types[] = {TSR_TOKEN_CONTROL, TSR_TOKEN_USER_DEFINED, TSR_TOKEN_CONTROL,
                           TSR_TOKEN_NORMAL};
  struct spec sp = {"gpt2", "qwen2", extra, types, 4, NULL, 0, NULL, -2, 256, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  CHECK(ENC(tok, "a<|im_end|>b", true, 'a', 256, 'b'));
  /* unparsed, the text is encoded as text: bytes here, no merges */
  CHECK(ENC(tok, "<|im_end|>", false, '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>'));
  /* user-defined tokens are matched either way */
  CHECK(ENC(tok, "x<tool>", false, 'x', 257));
  CHECK(ENC(tok, "x<tool>", true, 'x', 257));
  /* the longest token at the leftmost position wins; a normal token is never matched literally */
  CHECK(ENC(tok, "<|im_end|>x", true, 256, 'x'));
  CHECK(ENC(tok, "<|im<|im_end|>", true, 258, 256));
  CHECK(ENC(tok, "<|im_en", true, 258, '_', 'e', 'n'));
  CHECK(tsr_tokenizer_is_eog(tok, 256));
  CHECK(!tsr_tokenizer_is_eog(tok, 257) && !tsr_tokenizer_is_eog(tok, 'a'));
  CHECK(!tsr_tokenizer_is_eog(tok, -1) && !tsr_tokenizer_is_eog(tok, 1 << 30));
  /* control tokens decode as their text */
  int32_t ids[] = {'a', 256, 257};
  char *text;
  size_t len;
  CHECK_OK(tsr_tokenizer_decode(tok, ids, 3, &text, &len));
  CHECK(len == 17 && strcmp(text, "a<|im_end|><tool>") == 0);
  free(text);
  int32_t bad = 300;
  CHECK(tsr_tokenizer_decode(tok, &bad, 1, &text, &len) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "300") != NULL);
  CHECK(tsr_tokenizer_find(tok, "<tool>", 6) == 257 && tsr_tokenizer_find(tok, "<tool", 5) == -1);
  tsr_tokenizer_free(tok);
}

/* A chat prompt's message bytes are text: the same characters that are a control
** token in the template's bytes are encoded as their bytes there. */
static void special_tokens_match_only_in_marked_bytes(void) {
  const char *extra[] = {"<|im_end|>", "<tool>", "<|im"};
  const int32_t types[] = {TSR_TOKEN_CONTROL, TSR_TOKEN_USER_DEFINED, TSR_TOKEN_CONTROL};
  struct spec sp = {"gpt2", "qwen2", extra, types, 3, NULL, 0, NULL, -2, 256, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  /* template marker, the same marker in a message, template marker */
  CHECK(ENC_MARKED(tok, "<|im_end|><|im_end|><|im_end|>", "111111111100000000001111111111", 256,
                   '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>', 256));
  /* a match that starts in a message and ends in template bytes is text up to them */
  CHECK(ENC_MARKED(tok, "x<|im_end|>", "00000111111", 'x', '<', '|', 'i', 'm', '_', 'e', 'n', 'd',
                   '|', '>'));
  /* the longest marker that stays in template bytes wins over one reaching a message */
  CHECK(ENC_MARKED(tok, "<|im_end|>", "1111000000", 258, '_', 'e', 'n', 'd', '|', '>'));
  /* user-defined tokens are matched in messages too, as without parse_special */
  CHECK(ENC_MARKED(tok, "x<tool>", "0000000", 'x', 257));
  /* every byte marked: the same as parse_special */
  CHECK(ENC_MARKED(tok, "a<|im_end|>b", "111111111111", 'a', 256, 'b'));
  tsr_tokenizer_free(tok);
}

static void empty_text_and_bos(void) {
  const char *extra[] = {"<s>", "</s>"};
  const int32_t types[] = {TSR_TOKEN_CONTROL, TSR_TOKEN_CONTROL};
  struct spec sp = {"gpt2", "qwen2", extra, types, 2, NULL, 0, NULL, 256, 257, -1, 0};
  struct tsr_tokenizer *tok;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  int32_t *ids = (int32_t *)1;
  size_t n = 7;
  CHECK_OK(tsr_tokenizer_encode(tok, "", 0, true, true, &ids, &n));
  CHECK(n == 0 && ids == NULL); /* gpt2 without add_bos_token adds nothing */
  CHECK(!tsr_tokenizer_adds_bos(tok));
  CHECK(tsr_tokenizer_bos(tok) == 256 && tsr_tokenizer_eos(tok) == 257);
  CHECK(tsr_tokenizer_n_vocab(tok) == 258);
  CHECK(tsr_tokenizer_chat_template(tok) == NULL);
  tsr_tokenizer_free(tok);

  sp.add_bos = 1;
  CHECK_OK(build(&sp, &tok));
  if (!tok) return;
  CHECK(tsr_tokenizer_adds_bos(tok) && !tsr_tokenizer_adds_eos(tok));
  CHECK(encodes_to(tok, "", 0, true, true, (const int32_t[]){256, -1}));
  CHECK(encodes_to(tok, "hi", 2, true, true, (const int32_t[]){256, 'h', 'i', -1}));
  CHECK(encodes_to(tok, "hi", 2, true, false, (const int32_t[]){'h', 'i', -1}));
  tsr_tokenizer_free(tok);
}

static void load_errors_name_the_key(void) {
  struct tsr_tokenizer *tok;
  struct spec sp = {"gpt2", "llama3", NULL, NULL, 0, NULL, 0, NULL, -2, -2, -1, 0};
  CHECK(build(&sp, &tok) == TSR_ERR_UNSUPPORTED && !tok);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.pre") && strstr(tsr_error_message(), "llama3"));

  sp.pre = NULL; /* absent: no default regex is guessed */
  CHECK(build(&sp, &tok) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.pre is absent") != NULL);

  sp.model = "bert";
  sp.pre = "qwen2";
  CHECK(build(&sp, &tok) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.model") && strstr(tsr_error_message(), "bert"));

  sp.model = "gpt2";
  sp.bos = 256; /* one past the end */
  CHECK(build(&sp, &tok) == TSR_ERR_FORMAT);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.bos_token_id") &&
        strstr(tsr_error_message(), "256"));

  sp.bos = -2;
  const char *m[] = {"a zz"};
  sp.merges = m;
  sp.n_merges = 1;
  CHECK(build(&sp, &tok) == TSR_ERR_FORMAT);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.merges[0]") &&
        strstr(tsr_error_message(), "'zz'"));

  const char *extra[] = {"x"};
  const int32_t types[] = {9};
  struct spec sp2 = {"gpt2", "qwen2", extra, types, 1, NULL, 0, NULL, -2, -2, -1, 0};
  CHECK(build(&sp2, &tok) == TSR_ERR_FORMAT);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.token_type[256]") != NULL);
}

/* ---- spm ----------------------------------------------------------------------- */

/* <unk> <s> </s>, 256 byte tokens, then pieces. */
static const char *g_spm_pieces[] = {
    "\xE2\x96\x81",      "h",  "e",   "l",       "o",  "he", "ll",    "hell", "hello",
    "\xE2\x96\x81hello", "lo", "hel", "<start>", "\n", "o<", "<u|v>", "|v",   "<"};
enum { SPM_BASE = 3 + 256 };

static tsr_status build_spm_prefix(const float *piece_scores, int space_prefix,
                                   struct tsr_tokenizer **tok) {
  enum { NP = sizeof g_spm_pieces / sizeof g_spm_pieces[0], N = SPM_BASE + NP };
  static char names[256][8];
  const char *tokens[N];
  int32_t types[N];
  float scores[N];
  tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
  for (int i = 0; i < 3; i++) types[i] = TSR_TOKEN_CONTROL, scores[i] = 0;
  for (int b = 0; b < 256; b++) {
    snprintf(names[b], sizeof names[b], "<0x%02X>", b);
    tokens[3 + b] = names[b];
    types[3 + b] = TSR_TOKEN_BYTE;
    scores[3 + b] = 0;
  }
  for (int i = 0; i < NP; i++) {
    tokens[SPM_BASE + i] = g_spm_pieces[i];
    types[SPM_BASE + i] = TSR_TOKEN_NORMAL;
    scores[SPM_BASE + i] = piece_scores[i];
  }
  types[SPM_BASE + 12] = TSR_TOKEN_CONTROL;
  types[SPM_BASE + 13] = TSR_TOKEN_USER_DEFINED;
  types[SPM_BASE + 15] = TSR_TOKEN_CONTROL;
  types[SPM_BASE + 16] = TSR_TOKEN_USER_DEFINED;
  struct spec sp = {"llama", "default", tokens, types, N, NULL, 0, scores, 1, 2, -1, space_prefix};
  return build(&sp, tok);
}

static tsr_status build_spm(const float *piece_scores, struct tsr_tokenizer **tok) {
  return build_spm_prefix(piece_scores, 0, tok);
}

static void spm_merges_highest_score_first(void) {
  /*                  ▁   h   e   l   o   he  ll  hell hello ▁hello lo hel <start> \n o< <u|v> |v < */
  const float s1[] = {-1, -1, -1, -1, -1, -5, -2, -4, -3, -6, -9, -9, 0, 0, -1, 0, 0, -1};
  struct tsr_tokenizer *tok;
  CHECK_OK(build_spm(s1, &tok));
  if (!tok) return;
  enum { SP = SPM_BASE, H = SPM_BASE + 1, E, L, O, HE, LL, HELL, HELLO, SHELLO, LO, HEL };
  /* ll (-2) before he (-5): h e ll o -> he ll o -> hell o -> hello */
  CHECK(ENC(tok, "hello", false, HELLO));
  CHECK(ENC(tok, " hello", false, SHELLO));
  CHECK(ENC(tok, "hello hello", false, HELLO, SHELLO));
  /* a character outside the vocabulary falls back to its bytes */
  CHECK(ENC(tok, "h\xC3\xA9", false, H, 3 + 0xC3, 3 + 0xA9));
  CHECK(round_trips(tok, "h\xC3\xA9 hello\xFF", 11));
  CHECK(tsr_tokenizer_adds_bos(tok)); /* llama's default */
  CHECK(encodes_to(tok, "he", 2, true, true, (const int32_t[]){1, HE, -1}));
  /* control tokens only when parsed; user-defined always */
  CHECK(ENC(tok, "<start>", true, SPM_BASE + 12));
  CHECK(ENC(tok, "o\nh", false, O, SPM_BASE + 13, H));
  /* unparsed, a control token's text merges with what surrounds it */
  CHECK(ENC(tok, "o<start>", true, O, SPM_BASE + 12));
  CHECK(ENC(tok, "o<start>", false, SPM_BASE + 14, 3 + 's', 3 + 't', 3 + 'a', 3 + 'r', 3 + 't',
            3 + '>'));
  /* ...and still covers its bytes: the user-defined |v inside <u|v> is not matched */
  CHECK(ENC(tok, "u|v", false, 3 + 'u', SPM_BASE + 16));
  CHECK(ENC(tok, "<u|v>", false, SPM_BASE + 17, 3 + 'u', 3 + '|', 3 + 'v', 3 + '>'));
  CHECK(ENC(tok, "<u|v>", true, SPM_BASE + 15));
  /* "ello": ll (-2) beats lo (-9), and neither ell nor llo is a piece */
  CHECK(ENC(tok, "ello", false, E, LL, O));
  tsr_tokenizer_free(tok);

  /* now lo (-1) beats ll (-2) although ll is further left */
  const float s2[] = {-1, -1, -1, -1, -1, -5, -2, -4, -3, -6, -1, -9, 0, 0, -1, 0, 0, -1};
  CHECK_OK(build_spm(s2, &tok));
  if (!tok) return;
  CHECK(ENC(tok, "ello", false, E, L, LO));
  tsr_tokenizer_free(tok);
}

static void spm_dummy_prefix_is_refused(void) {
  const float s[] = {-1, -1, -1, -1, -1, -5, -2, -4, -3, -6, -9, -9, 0, 0, -1, 0, 0, -1};
  struct tsr_tokenizer *tok;
  CHECK(build_spm_prefix(s, 1, &tok) == TSR_ERR_UNSUPPORTED && !tok);
  CHECK(strstr(tsr_error_message(), "tokenizer.ggml.add_space_prefix") != NULL);
  CHECK(build_spm_prefix(s, -1, &tok) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "absent") != NULL);
}

static void spm_decode_turns_marks_into_spaces(void) {
  const float s[] = {-1, -1, -1, -1, -1, -5, -2, -4, -3, -6, -9, -9, 0, 0, -1, 0, 0, -1};
  struct tsr_tokenizer *tok;
  CHECK_OK(build_spm(s, &tok));
  if (!tok) return;
  int32_t ids[] = {1, SPM_BASE + 8, SPM_BASE + 9, 3 + 0xC3, 3 + 0xA9};
  char *text;
  size_t len;
  CHECK_OK(tsr_tokenizer_decode(tok, ids, 5, &text, &len));
  CHECK(len == 3 + 5 + 6 + 2 && memcmp(text, "<s>hello hello\xC3\xA9", len) == 0);
  free(text);
  size_t pl;
  const char *p = tsr_tokenizer_piece(tok, 3 + 0x41, &pl);
  CHECK(p && pl == 1 && p[0] == 'A');
  CHECK(tsr_tokenizer_piece(tok, -1, &pl) == NULL);
  tsr_tokenizer_free(tok);
}

/* ---- gemma4 -------------------------------------------------------------------- */

/* The spm layout above as Gemma 4's GGUF has it: every score -1000, merges ranked. */
static tsr_status build_gemma4(const char *pre, int space_prefix, struct tsr_tokenizer **tok) {
  enum { NP = sizeof g_spm_pieces / sizeof g_spm_pieces[0], N = SPM_BASE + NP };
  static char names[256][8];
  const char *tokens[N];
  int32_t types[N];
  float scores[N];
  tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
  for (int i = 0; i < 3; i++) types[i] = TSR_TOKEN_CONTROL;
  for (int b = 0; b < 256; b++) {
    snprintf(names[b], sizeof names[b], "<0x%02X>", b);
    tokens[3 + b] = names[b];
    types[3 + b] = TSR_TOKEN_BYTE;
  }
  for (int i = 0; i < NP; i++) {
    tokens[SPM_BASE + i] = g_spm_pieces[i];
    types[SPM_BASE + i] = TSR_TOKEN_NORMAL;
  }
  for (int i = 0; i < N; i++) scores[i] = -1000;
  types[SPM_BASE + 12] = TSR_TOKEN_CONTROL;
  types[SPM_BASE + 13] = TSR_TOKEN_USER_DEFINED;
  static const char *merges[] = {"l o", "h e", "he l", "l l", "hel lo", "\xE2\x96\x81 hello"};
  struct spec sp = {"gemma4", pre, tokens, types, N, merges, 6, scores, 1, 2, -1, space_prefix};
  return build(&sp, tok);
}

static void gemma4_merges_by_rank_with_byte_fallback(void) {
  struct tsr_tokenizer *tok;
  CHECK_OK(build_gemma4(NULL, 0, &tok));
  if (!tok) return;
  enum { SP = SPM_BASE, H, E, L, O, HE, LL, HELL, HELLO, SHELLO, LO, HEL };
  /* l o first, then h e, he l, and hel lo: ll and hell never form on this path */
  CHECK(ENC(tok, "hello", false, HELLO));
  CHECK(ENC(tok, " hello", false, SHELLO));
  /* hell is a piece, but no merge makes it */
  CHECK(ENC(tok, "hell", false, HEL, L));
  CHECK(ENC(tok, "ll", false, LL));
  /* a character the vocabulary lacks falls back to its bytes */
  CHECK(ENC(tok, "h\xC3\xA9", false, H, 3 + 0xC3, 3 + 0xA9));
  /* the newline is an added (user-defined) token and splits the text */
  CHECK(ENC(tok, "lo\nlo", false, LO, SPM_BASE + 13, LO));
  CHECK(tsr_tokenizer_adds_bos(tok)); /* absent add_bos_token means yes */
  CHECK(!strcmp(tsr_tokenizer_model_name(tok), "gemma4"));
  int32_t ids[] = {SHELLO, 3 + 0xC3, 3 + 0xA9, HEL};
  char *text;
  size_t len;
  CHECK_OK(tsr_tokenizer_decode(tok, ids, 4, &text, &len));
  CHECK(len == 11 && memcmp(text, " hello\xC3\xA9hel", len) == 0);
  free(text);
  tsr_tokenizer_free(tok);

  CHECK_OK(build_gemma4("gemma4", 0, &tok)); /* llama.cpp's implied pre, written out */
  tsr_tokenizer_free(tok);
  CHECK(build_gemma4("qwen2", 0, &tok) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "'qwen2'") != NULL);
  CHECK(build_gemma4(NULL, 1, &tok) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "add_space_prefix") != NULL);
}

/* ---- streaming ----------------------------------------------------------------- */

static void utf8_stream_holds_partial_characters(void) {
  struct tsr_utf8_stream s = TSR_UTF8_STREAM_INIT;
  char out[32];
  CHECK(tsr_utf8_stream_push(&s, "a\xE2\x82", 3, out) == 1 && out[0] == 'a');
  CHECK(tsr_utf8_stream_push(&s, "\xAC", 1, out) == 3 && memcmp(out, "\xE2\x82\xAC", 3) == 0);
  /* a 4-byte emoji one byte at a time */
  const char *e = "\xF0\x9F\x98\x80";
  size_t got = 0;
  for (int i = 0; i < 4; i++) got += tsr_utf8_stream_push(&s, e + i, 1, out + got);
  CHECK(got == 4 && memcmp(out, e, 4) == 0);
  /* bytes that can never complete pass through at once */
  CHECK(tsr_utf8_stream_push(&s, "\xFF", 1, out) == 1 && (unsigned char)out[0] == 0xFF);
  CHECK(tsr_utf8_stream_push(&s, "\xE2(", 2, out) == 2 && memcmp(out, "\xE2(", 2) == 0);
  CHECK(tsr_utf8_stream_push(&s, "\xED\xA0", 2, out) == 2); /* a surrogate's start */
  /* an incomplete character at the end comes out on flush */
  CHECK(tsr_utf8_stream_push(&s, "\xC3", 1, out) == 0);
  CHECK(tsr_utf8_stream_flush(&s, out) == 1 && (unsigned char)out[0] == 0xC3);
  CHECK(tsr_utf8_stream_flush(&s, out) == 0);
}

/* ---- the real corpora -------------------------------------------------------------- */

static int ids_equal(const int32_t *ids, size_t n, const cJSON *want) {
  if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n) return 0;
  size_t i = 0;
  for (const cJSON *v = want->child; v; v = v->next, i++)
    if (!cJSON_IsNumber(v) || (int32_t)v->valuedouble != ids[i]) return 0;
  return 1;
}

static void print_ids(const char *label, const int32_t *ids, size_t n, const cJSON *want) {
  fprintf(stderr, "    %s got: ", label);
  for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n    %s want:", label);
  int k = 0;
  for (const cJSON *v = want ? want->child : NULL; v && k < 40; v = v->next, k++)
    fprintf(stderr, " %d", (int)v->valuedouble);
  fputc('\n', stderr);
}

static int check_corpus(const struct tsr_tokenizer *tok, const cJSON *root,
                        const char *expected_path, const char *family, double load_s);

static int run_corpus(const char *expected_path) {
  cJSON *root;
  if (tsr_json_load(expected_path, &root)) {
    fprintf(stderr, "FAIL: %s\n", tsr_error_message());
    return 1;
  }
  const char *file, *family;
  if (tsr_json_str(root, expected_path, "tokenizer.source_file", &file) ||
      tsr_json_str(root, expected_path, "tokenizer.family", &family)) {
    fprintf(stderr, "FAIL: %s\n", tsr_error_message());
    cJSON_Delete(root);
    return 1;
  }
  const char *cache = getenv("TESSERA_MODEL_CACHE");
  char dir[1024], path[2048];
  if (cache && *cache)
    snprintf(dir, sizeof dir, "%s", cache);
  else
    snprintf(dir, sizeof dir, "%s/.cache/tessera/models", getenv("HOME") ? getenv("HOME") : "");
  snprintf(path, sizeof path, "%s/%s", dir, file);
  if (access(path, R_OK) != 0) {
    fprintf(stderr,
            "FAIL: the %s model file %s is missing: run scripts/fetch-models.sh (or "
            "tests/reference/real/fetch_models.py) to download it into %s, or set "
            "TESSERA_MODEL_CACHE to where it is\n",
            family, path, dir);
    cJSON_Delete(root);
    return 1;
  }
  struct tsr_gguf *g;
  struct tsr_tokenizer *tok = NULL;
  clock_t t0 = clock();
  if (tsr_gguf_open(path, &g) || tsr_tokenizer_load(g, &tok)) {
    fprintf(stderr, "FAIL: %s\n", tsr_error_message());
    cJSON_Delete(root);
    return 1;
  }
  tsr_gguf_close(g);
  double load_s = (double)(clock() - t0) / CLOCKS_PER_SEC;
  int fails = check_corpus(tok, root, expected_path, family, load_s);
  tsr_tokenizer_free(tok);
  cJSON_Delete(root);
  return fails ? 1 : 0;
}

/* Every case of an expected-ids file against tok; returns the failures. */
static int check_corpus(const struct tsr_tokenizer *tok, const cJSON *root,
                        const char *expected_path, const char *family, double load_s) {
  int64_t vocab, bos, eos;
  bool add_bos;
  int fails = 0;
  if (tsr_json_i64(root, expected_path, "tokenizer.vocab_size", &vocab) ||
      tsr_json_i64(root, expected_path, "tokenizer.bos_token_id", &bos) ||
      tsr_json_i64(root, expected_path, "tokenizer.eos_token_id", &eos) ||
      tsr_json_bool(root, expected_path, "tokenizer.add_bos_token", &add_bos)) {
    fprintf(stderr, "FAIL: %s\n", tsr_error_message());
    fails++;
  } else if (vocab != tsr_tokenizer_n_vocab(tok) || bos != tsr_tokenizer_bos(tok) ||
             eos != tsr_tokenizer_eos(tok) || add_bos != tsr_tokenizer_adds_bos(tok)) {
    fprintf(stderr, "FAIL: header: vocab %d bos %d eos %d add_bos %d, expected %lld %lld %lld %d\n",
            tsr_tokenizer_n_vocab(tok), tsr_tokenizer_bos(tok), tsr_tokenizer_eos(tok),
            tsr_tokenizer_adds_bos(tok), (long long)vocab, (long long)bos, (long long)eos, add_bos);
    fails++;
  }

  /* end of generation: eos, and the chat templates' turn ends where the vocabulary has them */
  if (!tsr_tokenizer_is_eog(tok, tsr_tokenizer_eos(tok)) || tsr_tokenizer_is_eog(tok, 0)) {
    fprintf(stderr, "FAIL: eos %d is not end of generation, or token 0 is\n",
            tsr_tokenizer_eos(tok));
    fails++;
  }
  static const char *const turn_ends[] = {"<|im_end|>", "<|endoftext|>", "<end_of_turn>",
                                          "<turn|>"};
  for (size_t i = 0; i < sizeof turn_ends / sizeof turn_ends[0]; i++) {
    int32_t id = tsr_tokenizer_find(tok, turn_ends[i], strlen(turn_ends[i]));
    if (id >= 0 && !tsr_tokenizer_is_eog(tok, id)) {
      fprintf(stderr, "FAIL: %s (%d) is not end of generation\n", turn_ends[i], id);
      fails++;
    }
  }

  const cJSON *cases = tsr_json_find(root, "cases");
  int n_cases = 0, n_bad = 0;
  double enc_s = 0;
  size_t n_tokens = 0;
  for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next, n_cases++) {
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(c, "text");
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(c, "decoded");
    const cJSON *ji = cJSON_GetObjectItemCaseSensitive(c, "ids");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(c, "ids_no_special");
    if (!cJSON_IsString(jt) || !cJSON_IsString(jd) || !cJSON_IsArray(ji) || !cJSON_IsArray(jn)) {
      fprintf(stderr, "FAIL: case %d is malformed\n", n_cases);
      n_bad++;
      continue;
    }
    const char *text = jt->valuestring;
    size_t len = strlen(text);
    int32_t *ids = NULL, *ids2 = NULL;
    size_t n = 0, n2 = 0, dl = 0;
    char *back = NULL;
    clock_t t1 = clock();
    tsr_status st = tsr_tokenizer_encode(tok, text, len, true, false, &ids, &n);
    if (!st) st = tsr_tokenizer_encode(tok, text, len, false, false, &ids2, &n2);
    enc_s += (double)(clock() - t1) / CLOCKS_PER_SEC;
    if (!st) st = tsr_tokenizer_decode(tok, ids, n, &back, &dl);
    /* with add_special, BOS leads when the model asks for it, and nothing else changes */
    int32_t *ids3 = NULL;
    size_t n3 = 0;
    if (!st) st = tsr_tokenizer_encode(tok, text, len, true, true, &ids3, &n3);
    int ok_bos = !st && n3 == n + (add_bos ? 1 : 0) && (!add_bos || ids3[0] == bos) &&
                 (n == 0 || memcmp(ids3 + (add_bos ? 1 : 0), ids, n * sizeof *ids) == 0);
    free(ids3);
    n_tokens += n;
    int ok_ids = !st && ids_equal(ids, n, ji), ok_ns = !st && ids_equal(ids2, n2, jn);
    int ok_dec = !st && dl == strlen(jd->valuestring) && memcmp(back, jd->valuestring, dl) == 0;
    if (!ok_ids || !ok_ns || !ok_dec || !ok_bos) {
      n_bad++;
      if (n_bad <= 20) {
        fprintf(stderr, "  case %d '%.60s':%s%s%s%s%s\n", n_cases, text, st ? " error: " : "",
                st ? tsr_error_message() : "", !ok_ids ? " ids differ" : "",
                !ok_ns ? " ids_no_special differ" : "", !ok_bos ? " add_special differs" : "");
        if (!st && !ok_ids) print_ids("ids", ids, n, ji);
        if (!st && !ok_ns) print_ids("no_special", ids2, n2, jn);
        if (!st && !ok_dec) fprintf(stderr, "    decoded '%.*s'\n", (int)dl, back);
      }
    }
    free(ids);
    free(ids2);
    free(back);
  }
  printf("%s: %d cases, %d mismatched; %zu tokens; load %.3f s, encode %.3f s\n", family, n_cases,
         n_bad, n_tokens, load_s, enc_s);
  if (n_cases < 300) {
    fprintf(stderr, "FAIL: only %d cases in %s\n", n_cases, expected_path);
    fails++;
  }
  return fails + n_bad;
}

/* ---- gemma4: the fixtures' tokenizer.json through the converter -------------------- */

static tsr_status convert_tokenizer_only(void *ctx, const struct tsr_host *h,
                                         struct tsr_convert *cv) {
  (void)ctx;
  h->convert->hf_skip_prefix(cv, ""); /* the weights are not this test's business */
  tsr_status st = h->convert->out_str(cv, "general.architecture", "gemma4");
  return st ? st : h->convert->tokenizer(cv, "gemma4");
}

static tsr_status convert_in_process(const char *dir, const char *out) {
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = out, .outtype = TSR_F32};
  struct tsr_convert *cv = NULL;
  tsr_status st = tsr_convert_open(&o, &cv);
  if (st) return st;
  struct tsr_convert_v1 converter = {.struct_size = sizeof converter, .hf_types = "gemma4",
                                     .convert = convert_tokenizer_only};
  st = tsr_convert_with(cv, &converter, "tokenizer_only");
  if (!st) st = tsr_convert_finish(cv, NULL);
  tsr_convert_free(cv);
  return st;
}

/* The expected ids against the tokenizer of a converted GGUF; returns the failures. */
static int check_gguf(const char *path, const cJSON *root, const char *expected,
                      const char *label) {
  struct tsr_gguf *g;
  struct tsr_tokenizer *tok = NULL;
  clock_t t0 = clock();
  if (tsr_gguf_open(path, &g)) {
    fprintf(stderr, "FAIL: %s: %s\n", label, tsr_error_message());
    return 1;
  }
  tsr_status st = tsr_tokenizer_load(g, &tok);
  tsr_gguf_close(g);
  if (st) {
    fprintf(stderr, "FAIL: %s: %s\n", label, tsr_error_message());
    return 1;
  }
  int fails = check_corpus(tok, root, expected, label, (double)(clock() - t0) / CLOCKS_PER_SEC);
  if (strcmp(tsr_tokenizer_model_name(tok), "gemma4") != 0) {
    fprintf(stderr, "FAIL: %s: tokenizer model '%s', not gemma4\n", label,
            tsr_tokenizer_model_name(tok));
    fails++;
  }
  tsr_tokenizer_free(tok);
  return fails;
}

static int file_contains(const char *path, const char *needle) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, needle) != NULL;
}

/* `tessera convert` of the whole fixture, its tokenizer, and `tessera run` on it. */
static int run_tessera(const char *tessera, const char *dir, const char *tmp, const cJSON *root,
                       const char *expected) {
  char gguf[512], out[512], err[512], cmd[4096];
  snprintf(gguf, sizeof gguf, "%s/model.gguf", tmp);
  snprintf(out, sizeof out, "%s/run.out", tmp);
  snprintf(err, sizeof err, "%s/run.err", tmp);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --outtype f32 > '%s' 2>&1", tessera, dir, gguf,
           err);
  int rc = system(cmd), fails = 0;
  if (rc != 0) {
    fprintf(stderr, "FAIL: tessera convert exited with %d (%s)\n", rc, err);
    return 1;
  }
  fails += check_gguf(gguf, root, expected, "gemma4 (tessera convert)");
  /* <bos> he ll o: the prompt must reach the model as the tokenizer encodes it */
  snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p hello -n 8 --temp 0 > '%s' 2> '%s'", tessera,
           gguf, out, err);
  rc = system(cmd);
  if (rc != 0) {
    fprintf(stderr, "FAIL: tessera run -m %s -p hello -n 8 --temp 0 exited with %d\n", gguf, rc);
    fails++;
  } else if (!file_contains(err, "prompt eval: 4 tokens") &&
             !file_contains(out, "prompt eval: 4 tokens")) {
    fprintf(stderr, "FAIL: tessera run did not report a 4-token prompt (<bos> he ll o)\n");
    fails++;
  } else {
    printf("tessera run on the converted gemma4_dense: exit 0, 4-token prompt\n");
  }
  unlink(out);
  unlink(err);
  unlink(gguf);
  return fails;
}

static int run_gemma4(const char *dir, const char *expected, const char *tessera) {
  cJSON *root;
  if (tsr_json_load(expected, &root)) {
    fprintf(stderr, "FAIL: %s\n", tsr_error_message());
    return 1;
  }
  char tmp[] = "/tmp/tsr_test_tok4_XXXXXX", gguf[512];
  if (!mkdtemp(tmp)) {
    perror("mkdtemp");
    cJSON_Delete(root);
    return 1;
  }
  snprintf(gguf, sizeof gguf, "%s/tokenizer.gguf", tmp);
  int fails = 0;
  if (convert_in_process(dir, gguf)) {
    fprintf(stderr, "FAIL: converting %s: %s\n", dir, tsr_error_message());
    fails++;
  } else {
    fails += check_gguf(gguf, root, expected, "gemma4 (tokenizer writer)");
  }
  unlink(gguf);
  if (tessera) fails += run_tessera(tessera, dir, tmp, root, expected);
  rmdir(tmp);
  cJSON_Delete(root);
  return fails ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--corpus") == 0) return run_corpus(argv[2]);
  if ((argc == 4 || argc == 5) && strcmp(argv[1], "--gemma4") == 0)
    return run_gemma4(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
  if (argc != 1) {
    fprintf(stderr,
            "usage: %s [--corpus EXPECTED.json | --gemma4 FIXTURE_DIR EXPECTED.json [TESSERA]]\n",
            argv[0]);
    return 2;
  }
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  TSR_RUN(byte_mapping_round_trips_all_256_bytes);
  TSR_RUN(merges_apply_lowest_rank_first);
  TSR_RUN(equal_merges_go_leftmost_first);
  TSR_RUN(long_words_merge_in_reasonable_time);
  TSR_RUN(qwen2_regex_splits_words_numbers_and_contractions);
  TSR_RUN(qwen35_keeps_combining_marks_with_letters);
  TSR_RUN(nfc_composes_before_merging);
  TSR_RUN(invalid_utf8_is_encoded_byte_level);
  TSR_RUN(special_tokens_match_only_when_parsed);
  TSR_RUN(special_tokens_match_only_in_marked_bytes);
  TSR_RUN(empty_text_and_bos);
  TSR_RUN(load_errors_name_the_key);
  TSR_RUN(spm_merges_highest_score_first);
  TSR_RUN(spm_dummy_prefix_is_refused);
  TSR_RUN(spm_decode_turns_marks_into_spaces);
  TSR_RUN(gemma4_merges_by_rank_with_byte_fallback);
  TSR_RUN(utf8_stream_holds_partial_characters);
  rmdir(g_dir);
  return TSR_TEST_EXIT();
}
