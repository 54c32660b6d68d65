/*
** gpt2 pre-tokenizers: NFC normalization (utf8proc), then a regex (PCRE2,
** UTF mode with Unicode properties) splits the text into pre-tokens, each of
** which is merged on its own.
**
** The patterns are the ones in the models' tokenizer.json files, which is
** what the reference tokenizer runs (llama.cpp spells the case-insensitive
** contractions out as [sS] classes instead), with \s written out. Text between matches (only bytes
** that are not valid UTF-8 can fall there: the last alternatives match any
** character) becomes pre-tokens of its own, so every input byte is encoded.
*/
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "model/tokenizer_internal.h"

/* \s spelled out as Unicode's White_Space: PCRE2's \s also takes U+180E,
** which the reference's regex engine (Oniguruma) does not. */
#define WS                                                                                         \
  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"               \
  "\\x{202F}\\x{205F}\\x{3000}"

static const struct {
  const char *name, *pattern;
} pretoks[] = {
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
     "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"},
    /* Qwen3.5: combining marks join the letters they follow. */
    {"qwen35", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
               "| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])"
               "|[" WS "]+"},
};

tsr_status tsr__pretok_compile(struct tsr_tokenizer *tok, const char *path) {
  const char *pattern = NULL;
  for (size_t i = 0; i < sizeof pretoks / sizeof pretoks[0]; i++)
    if (strcmp(tok->pre_name, pretoks[i].name) == 0) pattern = pretoks[i].pattern;
  if (!pattern)
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.pre = '%s' is not a supported pre-tokenizer for "
                         "tokenizer.ggml.model 'gpt2' (supported: qwen2, qwen35)",
                         path, tok->pre_name);
  int err;
  PCRE2_SIZE at;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return tsr_error_set(TSR_ERR_INTERNAL,
                         "tokenizer: pre-tokenizer '%s' does not compile at %zu: %s", tok->pre_name,
                         (size_t)at, (const char *)msg);
  }
  /* Without JIT (a build lacking it) matching still works, only slower. */
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  tok->re = re;
  tok->nfc = true;
  return TSR_OK;
}

void tsr__pretok_free(struct tsr_tokenizer *tok) {
  pcre2_code_free((pcre2_code *)tok->re);
  tok->re = NULL;
}

void tsr__pretok_work_free(struct tsr__tok_work *w) {
  pcre2_match_data_free((pcre2_match_data *)w->match);
  w->match = NULL;
}

/* NFC of s into w->buf; *out points at the normalized text (s itself when
** nothing can change). Invalid UTF-8 bytes are kept as they are: only the
** valid stretches between them are normalized. */
static tsr_status nfc(struct tsr__tok_work *w, const char *s, size_t len, const char **out,
                      size_t *out_len) {
  *out = s;
  *out_len = len;
  /* Below U+0300 every character is already NFC and composes with nothing
  ** that is also below U+0300; such text has no byte from 0xCC up. */
  size_t i = 0;
  while (i < len && (unsigned char)s[i] < 0xCC) i++;
  if (i == len) return TSR_OK;

  size_t o = 0;
  i = 0;
  while (i < len) {
    size_t start = i, cl;
    while (i < len && (cl = tsr__utf8_char_len((const unsigned char *)s + i, len - i))) i += cl;
    if (i > start) {
      utf8proc_uint8_t *dst = NULL;
      utf8proc_ssize_t n =
          utf8proc_map((const utf8proc_uint8_t *)s + start, (utf8proc_ssize_t)(i - start), &dst,
                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
      if (n < 0) {
        free(dst);
        return tsr_error_set(TSR_ERR_INTERNAL, "tokenizer: NFC normalization failed: %s",
                             utf8proc_errmsg(n));
      }
      tsr_status st = tsr__tok_buf_reserve(w, o + (size_t)n + (len - i));
      if (st) {
        free(dst);
        return st;
      }
      memcpy(w->buf + o, dst, (size_t)n);
      o += (size_t)n;
      free(dst);
    }
    if (i < len) { /* one invalid byte */
      tsr_status st = tsr__tok_buf_reserve(w, o + 1 + (len - i));
      if (st) return st;
      w->buf[o++] = s[i++];
    }
  }
  *out = w->buf;
  *out_len = o;
  return TSR_OK;
}

tsr_status tsr__gpt2_encode(const struct tsr_tokenizer *tok, struct tsr__tok_work *w, const char *s,
                            size_t len, struct tsr__ids *out) {
  tsr_status st;
  if (tok->nfc && (st = nfc(w, s, len, &s, &len))) return st;
  const pcre2_code *re = tok->re;
  if (!w->match && !(w->match = pcre2_match_data_create_from_pattern(re, NULL)))
    return tsr_error_set(TSR_ERR_NOMEM, "tokenizer: out of memory for regex match data");
  pcre2_match_data *md = w->match;
  const unsigned char *u = (const unsigned char *)s;
  size_t pos = 0;
  while (pos < len) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, 0, md, NULL);
    size_t ms = len, me = len;
    if (rc >= 0) {
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      ms = ov[0];
      me = ov[1];
    } else if (rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return tsr_error_set(TSR_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s' failed at byte %zu: %s",
                           tok->pre_name, pos, (const char *)msg);
    }
    if (ms > pos && (st = tsr__bpe_encode_word(tok, w, u + pos, ms - pos, out))) return st;
    if (me > ms && (st = tsr__bpe_encode_word(tok, w, u + ms, me - ms, out))) return st;
    if (me == ms && ms < len) { /* no pattern here matches empty; guard anyway */
      if ((st = tsr__bpe_encode_word(tok, w, u + ms, 1, out))) return st;
      me = ms + 1;
    }
    pos = me;
  }
  return TSR_OK;
}
