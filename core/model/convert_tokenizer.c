/*
** tokenizer.json (+ tokenizer_config.json, chat_template.jinja) ->
** tokenizer.ggml.*, following what llama.cpp's converter writes:
**
** Byte-level BPE (no byte_fallback): tokenizer.ggml.model "gpt2", pre as
** given; tokens by id up to the config's vocab_size, gaps filled with
** "[PAD<id>]" (unused); added tokens are control when flagged special or
** when they look special (<|...|>, <unused..>, <pad>, <mask>), else
** user-defined with ▁ turned back into a space; no scores.
**
** SentencePiece-style BPE (byte_fallback, ▁ for spaces: Gemma): model
** "gemma4" when pre is "gemma4", else "llama", and no tokenizer.ggml.pre
** key (llama.cpp writes none; its loader implies gemma4's); scores -1000
** for every token (llama.cpp's LlamaHfVocab); <0xXX> pieces are byte
** tokens, the special tokens control; for gemma4 the chat-visible markers
** (<|channel>, ...) are user-defined, add_space_prefix is false and
** add_bos_token true.
**
** Both: merges ("a b"; pair-form merges joined, a space inside a part
** written as U+0120 as gguf-py does), the special token ids (the
** tokenizer_config entries looked up among added_tokens, then config.json's
** *_token_id), add_bos/add_eos/add_sep from the post-processor template and
** tokenizer_config's add_*_token, and the chat template.
**
** Refused, naming the file and the key, because the written file would be
** one tessera run cannot load or one that says something else than the
** tokenizer: an empty model.vocab; a token listed twice; ids with gaps below
** the highest; an added token on an id that holds another string; a merge
** whose parts or join are not tokens (as written, after the U+0120 step);
** no merges; a byte without its token (byte-level: GPT-2's character;
** SentencePiece-style: <0xXX>, or the unknown token); a vocabulary of the
** other kind than the model's pre-tokenizer; config.json's *_token_id
** outside the vocabulary; entries of tokenizer_config.json of another type
** than the one read.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/convert.h"
#include "common/error.h"
#include "model/json.h"

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* llama.cpp's special token kinds and their GGUF keys. */
enum { SP_BOS, SP_EOS, SP_UNK, SP_SEP, SP_PAD, SP_CLS, SP_MASK, SP_EOT, SP_COUNT };
static const char *const g_sp_name[SP_COUNT] = {"bos", "eos", "unk", "sep",
                                                "pad", "cls", "mask", "eot"};
static const char *const g_sp_key[SP_COUNT] = {
    "tokenizer.ggml.bos_token_id",     "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", /* sic */
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.cls_token_id",
    "tokenizer.ggml.mask_token_id",    "tokenizer.ggml.eot_token_id"};

/* A set of strings by content, each with the id it was added under. */
struct strset {
  const char **str;
  size_t *len;
  int64_t *id;
  uint64_t mask;
};

struct tok {
  struct tsr_convert *cv;
  char path[4200];    /* tokenizer.json, for messages */
  char tc_path[4200]; /* tokenizer_config.json */
  cJSON *tj, *tc;     /* tokenizer.json, tokenizer_config.json (NULL if absent) */
  const cJSON *added;
  bool spm, gemma4;
  int64_t n, n_base; /* ids; entries of model.vocab (HF's vocab_size) */
  int64_t max_id;    /* the highest id the tokenizer itself gives */
  struct strset texts; /* model.vocab's strings, then the written tokens */
  const char **text; /* per id */
  int32_t *type;
  char **owned;      /* strings this file made */
  int64_t n_owned;
  /* SpecialVocab */
  const char *content[SP_COUNT]; /* tokenizer_config's token contents */
  bool use_eot;
  int64_t id[SP_COUNT];          /* -1: unset */
  int add[SP_COUNT];             /* -1 unset, 0, 1: add_<kind>_token */
};

/* ---- a string set (vocabulary lookups) ----------------------------------- */

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

static void strset_free(struct strset *s) {
  free(s->str);
  free(s->len);
  free(s->id);
  memset(s, 0, sizeof *s);
}

static tsr_status strset_init(struct strset *s, int64_t n) {
  strset_free(s);
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap *= 2;
  s->str = calloc(cap, sizeof *s->str);
  s->len = calloc(cap, sizeof *s->len);
  s->id = calloc(cap, sizeof *s->id);
  s->mask = cap - 1;
  return s->str && s->len && s->id ? TSR_OK : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
}

/* The slot of (p, n): where it is, or the empty slot it would take. */
static uint64_t strset_slot(const struct strset *s, const char *p, size_t n) {
  uint64_t i = fnv1a(p, n) & s->mask;
  while (s->str[i] && !(s->len[i] == n && !memcmp(s->str[i], p, n))) i = (i + 1) & s->mask;
  return i;
}

/* The id of (p, n), or -1. */
static int64_t strset_find(const struct strset *s, const char *p, size_t n) {
  uint64_t i = strset_slot(s, p, n);
  return s->str[i] ? s->id[i] : -1;
}

/* Adds str under id unless present; returns the id it already had, or -1. The set
** holds at most half its slots (strset_init's n). */
static int64_t strset_add(struct strset *s, const char *str, int64_t id) {
  size_t n = strlen(str);
  uint64_t i = strset_slot(s, str, n);
  if (s->str[i]) return s->id[i];
  s->str[i] = str;
  s->len[i] = n;
  s->id[i] = id;
  return -1;
}

static char *own(struct tok *t, char *s) {
  if (s) t->owned[t->n_owned++] = s;
  return s;
}

static bool looks_special(const char *s) {
  size_t n = strlen(s);
  if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]"))
    return true;
  if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return true;
  const char *fw = "\xef\xbd\x9c"; /* ｜ U+FF5C (deepseek-coder) */
  if (n >= 8 && s[0] == '<' && !strncmp(s + 1, fw, 3) && !strncmp(s + n - 4, fw, 3) &&
      s[n - 1] == '>')
    return true;
  return n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>';
}

static bool is_byte_piece(const char *s) {
  static const char *hex = "0123456789abcdefABCDEF";
  return strlen(s) == 6 && !strncmp(s, "<0x", 3) && strchr(hex, s[3]) && strchr(hex, s[4]) &&
         s[5] == '>';
}

/* A tokenizer_config entry ("<bos>" or {"content": "<bos>", ...}) as text. */
static const char *entry_content(const cJSON *e) {
  if (cJSON_IsString(e)) return e->valuestring;
  const cJSON *c = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "content") : NULL;
  return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* Whether tokenizer_config names this text as a special token (HF's
** all_special_tokens: the kinds plus additional/extra special tokens). */
static bool config_special(const struct tok *t, const char *text) {
  if (!t->tc) return false;
  for (int k = 0; k < SP_EOT; k++) {
    char key[32];
    snprintf(key, sizeof key, "%s_token", g_sp_name[k]);
    const char *c = entry_content(cJSON_GetObjectItemCaseSensitive(t->tc, key));
    if (c && !strcmp(c, text)) return true;
  }
  static const char *lists[] = {"additional_special_tokens", "extra_special_tokens"};
  for (int l = 0; l < 2; l++) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(t->tc, lists[l]);
    for (const cJSON *e = cJSON_IsArray(arr) ? arr->child : NULL; e; e = e->next) {
      const char *c = entry_content(e);
      if (c && !strcmp(c, text)) return true;
    }
  }
  return false;
}

/* ---- the vocabulary ------------------------------------------------------ */

static tsr_status set_token(struct tok *t, int64_t id, const char *text, const char *where) {
  if (id < 0 || id >= t->n)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s token '%.40s' has id %lld, outside the "
                         "vocabulary of %lld (config vocab_size)", t->path, where, text,
                         (long long)id, (long long)t->n);
  t->text[id] = text;
  return TSR_OK;
}

static tsr_status build_vocab(struct tok *t, const cJSON *vocab) {
  int64_t max_id = -1;
  t->n_base = cJSON_GetArraySize(vocab);
  if (!t->n_base)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: model.vocab is empty; expected the tokens and "
                         "their ids", t->path);
  tsr_status st = strset_init(&t->texts, t->n_base);
  if (st != TSR_OK) return st;
  for (const cJSON *e = vocab->child; e; e = e->next) {
    int64_t id, other;
    if (!tsr_json_as_i64(e, &id) || id < 0)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: model.vocab['%.40s'] is not a token id", t->path,
                           e->string);
    /* JSON objects may repeat a key; the parser keeps both */
    if ((other = strset_add(&t->texts, e->string, id)) >= 0)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: model.vocab lists '%.40s' twice (ids %lld and "
                           "%lld); expected each token once", t->path, e->string,
                           (long long)other, (long long)id);
    if (id > max_id) max_id = id;
  }
  int i = 0;
  for (const cJSON *a = t->added ? t->added->child : NULL; a; a = a->next, i++) {
    int64_t id;
    if (!tsr_json_as_i64(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) || id < 0 ||
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(a, "content")))
      return tsr_error_set(TSR_ERR_FORMAT, "%s: added_tokens[%d] lacks an id (an integer of at "
                           "least 0) or a string content", t->path, i);
    if (id > max_id) max_id = id;
  }
  t->max_id = max_id;
  /* the model's vocab_size (text_config's first, as llama.cpp merges it in) */
  const cJSON *cfg = tsr_convert_config(t->cv);
  const char *vs_path = tsr_json_find(cfg, "text_config.vocab_size") ? "text_config.vocab_size"
                                                                     : "vocab_size";
  t->n = max_id + 1;
  if (tsr_json_find(cfg, vs_path)) {
    st = tsr_json_i64(cfg, "config.json", vs_path, &t->n);
    if (st != TSR_OK) return st;
    if (t->n <= max_id)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: token id %lld is not below config.json's %s %lld",
                           t->path, (long long)max_id, vs_path, (long long)t->n);
  }
  if (t->n <= 0 || t->n > (1 << 24))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: vocabulary size %lld is out of range", t->path,
                         (long long)t->n);
  t->text = calloc((size_t)t->n, sizeof *t->text);
  t->type = calloc((size_t)t->n, sizeof *t->type);
  int64_t n_added = t->added ? cJSON_GetArraySize(t->added) : 0;
  t->owned = calloc((size_t)(t->n + n_added + 1), sizeof *t->owned);
  if (!t->text || !t->type || !t->owned) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (const cJSON *e = vocab->child; e && st == TSR_OK; e = e->next) {
    int64_t id;
    tsr_json_as_i64(e, &id);
    if (t->text[id])
      return tsr_error_set(TSR_ERR_FORMAT, "%s: id %lld is given to both '%.40s' and '%.40s'",
                           t->path, (long long)id, t->text[id], e->string);
    st = set_token(t, id, e->string, "vocab");
    if (st == TSR_OK) t->type[id] = (t->spm && is_byte_piece(e->string)) ? TT_BYTE : TT_NORMAL;
  }
  return st;
}

/* added_tokens against model.vocab and each other (an id names one string),
** and no id below the highest left without a token: HF's tokenizer would
** have no text for it, and the GGUF only a made-up placeholder. Runs before
** apply_added, while t->text holds model.vocab alone. */
static tsr_status check_ids(struct tok *t) {
  const char **given = calloc((size_t)t->n, sizeof *given);
  if (!given) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = TSR_OK;
  int i = 0;
  for (const cJSON *a = t->added ? t->added->child : NULL; a && st == TSR_OK; a = a->next, i++) {
    int64_t id;
    tsr_json_as_i64(cJSON_GetObjectItemCaseSensitive(a, "id"), &id);
    const char *text = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
    if (t->text[id] && strcmp(t->text[id], text))
      st = tsr_error_set(TSR_ERR_FORMAT, "%s: added_tokens[%d] gives id %lld to '%.40s', but "
                         "model.vocab gives it to '%.40s'; expected one token per id", t->path, i,
                         (long long)id, text, t->text[id]);
    else if (given[id] && strcmp(given[id], text))
      st = tsr_error_set(TSR_ERR_FORMAT, "%s: added_tokens[%d] gives id %lld to '%.40s', an "
                         "earlier entry to '%.40s'; expected one token per id", t->path, i,
                         (long long)id, text, given[id]);
    given[id] = text;
  }
  int64_t n_gaps = 0, first = -1;
  for (int64_t id = 0; id <= t->max_id && st == TSR_OK; id++)
    if (!t->text[id] && !given[id] && !n_gaps++) first = id;
  if (st == TSR_OK && n_gaps)
    st = tsr_error_set(TSR_ERR_FORMAT, "%s: %lld id%s below %lld (the highest the tokenizer "
                       "gives) belong%s to no token in model.vocab or added_tokens, the first "
                       "%lld; expected ids without gaps", t->path, (long long)n_gaps,
                       n_gaps == 1 ? "" : "s", (long long)t->max_id, n_gaps == 1 ? "s" : "",
                       (long long)first);
  free(given);
  return st;
}

/* Types of tokens the vocab lists and of added tokens, per the two modes. */
static tsr_status apply_added(struct tok *t) {
  static const char *visible[] = {"<|channel>",       "<channel|>",       "<|tool_call>",
                                  "<tool_call|>",     "<|tool_response>", "<tool_response|>",
                                  "<|\"|>"};
  for (const cJSON *a = t->added ? t->added->child : NULL; a; a = a->next) {
    int64_t id;
    tsr_json_as_i64(cJSON_GetObjectItemCaseSensitive(a, "id"), &id);
    const char *text = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
    bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
    tsr_status st = set_token(t, id, text, "added");
    if (st != TSR_OK) return st;
    if (t->spm) {
      /* LlamaHfVocab: an added token inside the model's vocab keeps the vocab's typing
      ** (byte / control if special / normal); one past it is control or user-defined */
      bool ctl = special || config_special(t, text);
      if (id < t->n_base)
        t->type[id] = ctl ? TT_CONTROL : is_byte_piece(text) ? TT_BYTE : TT_NORMAL;
      else t->type[id] = ctl ? TT_CONTROL : TT_USER;
    } else if (special || looks_special(text)) {
      t->type[id] = TT_CONTROL;
    } else {
      /* llama.cpp pre-normalizes user-defined spaces: ▁ back to ' ' */
      size_t n = strlen(text);
      char *copy = own(t, malloc(n + 1));
      if (!copy) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
      size_t o = 0;
      for (size_t i = 0; i < n; i++) {
        if (!strncmp(text + i, "\xe2\x96\x81", 3)) copy[o++] = ' ', i += 2;
        else copy[o++] = text[i];
      }
      copy[o] = '\0';
      t->text[id] = copy;
      t->type[id] = TT_USER;
    }
  }
  for (int64_t id = 0; id < t->n; id++) {
    if (!t->text[id]) {
      char buf[32];
      snprintf(buf, sizeof buf, "[PAD%lld]", (long long)id);
      if (!(t->text[id] = own(t, strdup(buf)))) return tsr_error_set(TSR_ERR_NOMEM, "no memory");
      t->type[id] = TT_UNUSED;
    } else if (t->spm && t->type[id] == TT_NORMAL && config_special(t, t->text[id])) {
      t->type[id] = TT_CONTROL;
    }
    if (t->gemma4)
      for (size_t v = 0; v < sizeof visible / sizeof visible[0]; v++)
        if (!strcmp(t->text[id], visible[v])) t->type[id] = TT_USER; /* the chat parser reads */
  }
  return TSR_OK;
}

/* The written tokens, for the lookups below (a repeated text keeps its first id). */
static tsr_status index_tokens(struct tok *t) {
  tsr_status st = strset_init(&t->texts, t->n);
  for (int64_t id = 0; id < t->n && st == TSR_OK; id++) strset_add(&t->texts, t->text[id], id);
  return st;
}

static int64_t find2(const struct strset *s, const char *a, size_t al, const char *b,
                     size_t bl) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < al + bl; i++)
    h = (h ^ (unsigned char)(i < al ? a[i] : b[i - al])) * 0x100000001b3ull;
  for (uint64_t i = h & s->mask; s->str[i]; i = (i + 1) & s->mask)
    if (s->len[i] == al + bl && !memcmp(s->str[i], a, al) && !memcmp(s->str[i] + al, b, bl))
      return s->id[i];
  return -1;
}

/* A merge as written ("A B", split at the first space past the first byte,
** as tessera run reads it): both parts and their join must be tokens. */
static tsr_status check_merge(const struct tok *t, int64_t i, const char *m, bool spaced) {
  size_t len = strlen(m);
  const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
  if (!sp)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges[%lld] is '%.80s'; expected two "
                         "parts, \"a b\" or [a, b]", t->path, (long long)i, m);
  size_t al = (size_t)(sp - m), bl = len - al - 1;
  const char *what = NULL;
  size_t wl = 0;
  if (strset_find(&t->texts, m, al) < 0) what = m, wl = al;
  else if (strset_find(&t->texts, sp + 1, bl) < 0) what = sp + 1, wl = bl;
  else if (find2(&t->texts, m, al, sp + 1, bl) < 0) what = "their join", wl = strlen(what);
  if (!what) return TSR_OK;
  return tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges[%lld] is '%.80s': %s%.*s%s is not in "
                       "the vocabulary; expected both parts and their join to be tokens%s",
                       t->path, (long long)i, m, what == sp + 1 || what == m ? "'" : "",
                       (int)(wl > 80 ? 80 : wl), what, what == sp + 1 || what == m ? "'" : "",
                       spaced ? " (a space inside a part is written as U+0120, as llama.cpp does)"
                              : "");
}

static tsr_status write_merges(struct tok *t, const cJSON *merges) {
  /* tessera run (and llama.cpp) load no BPE vocabulary without its merges */
  if (!merges || cJSON_IsNull(merges) || (cJSON_IsArray(merges) && !merges->child))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges is %s; expected the BPE merges", t->path,
                         merges && !cJSON_IsNull(merges) ? "empty" : "missing");
  if (!cJSON_IsArray(merges)) {
    char what[96];
    tsr_convert_describe(merges, what, sizeof what);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges should be an array, found %s",
                         t->path, what);
  }
  int64_t n = cJSON_GetArraySize(merges);
  const char **list = calloc((size_t)n, sizeof *list);
  char **made = calloc((size_t)n, sizeof *made);
  tsr_status st = (list && made) ? TSR_OK : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  int64_t i = 0;
  for (const cJSON *m = merges->child; m && st == TSR_OK; m = m->next, i++) {
    if (cJSON_IsString(m)) {
      list[i] = m->valuestring;
      st = check_merge(t, i, list[i], false);
      continue;
    }
    const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsString(a) ||
        !cJSON_IsString(b)) {
      st = tsr_error_set(TSR_ERR_FORMAT, "%s: model.merges[%lld] is neither \"a b\" nor [a, b]",
                         t->path, (long long)i);
      break;
    }
    /* a space inside a part becomes U+0120 (2 bytes), so the pair stays splittable */
    size_t cap = 2 * (strlen(a->valuestring) + strlen(b->valuestring)) + 2, o = 0;
    char *s = made[i] = malloc(cap);
    if (!s) {
      st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
      break;
    }
    bool spaced = false;
    for (int part = 0; part < 2; part++) {
      if (part) s[o++] = ' ';
      for (const char *c = part ? b->valuestring : a->valuestring; *c; c++) {
        if (*c == ' ') s[o++] = '\xc4', s[o++] = '\xa0', spaced = true;
        else s[o++] = *c;
      }
    }
    s[o] = '\0';
    list[i] = s;
    st = check_merge(t, i, s, spaced);
  }
  if (st == TSR_OK) st = tsr_convert_out_arr_str(t->cv, "tokenizer.ggml.merges", list, n);
  for (int64_t k = 0; made && k < n; k++) free(made[k]);
  free(made);
  free(list);
  return st;
}

/* GPT-2's byte-to-character map (bytes_to_unicode): printable bytes stand for
** themselves, the others for 256, 257, ... in byte order. */
static bool byte_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Every byte has a token, as tessera run's loader requires: byte-level BPE
** its GPT-2 character, SentencePiece-style BPE its <0xXX> piece (or, lacking
** one, the unknown token stands in). */
static tsr_status check_bytes(const struct tok *t) {
  int n_unprintable = 0;
  for (int b = 0; b < 256; b++) {
    char text[8];
    size_t len;
    if (t->spm) {
      len = (size_t)snprintf(text, sizeof text, "<0x%02X>", b);
    } else {
      unsigned cp = byte_printable(b) ? (unsigned)b : 256u + (unsigned)n_unprintable++;
      if (cp < 0x80) text[0] = (char)cp, len = 1;
      else text[0] = (char)(0xC0 | (cp >> 6)), text[1] = (char)(0x80 | (cp & 0x3F)), len = 2;
      text[len] = '\0';
    }
    if (strset_find(&t->texts, text, len) >= 0) continue;
    if (t->spm && t->id[SP_UNK] >= 0) continue;
    if (t->spm)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: the vocabulary has no byte token %s and no "
                           "unknown token to stand in; expected one of them for every byte",
                           t->path, text);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: the vocabulary lacks '%s', the byte-level token "
                         "of byte 0x%02X; expected all 256 of a byte-level BPE vocabulary",
                         t->path, text, b);
  }
  return TSR_OK;
}

/* ---- special tokens (gguf-py's SpecialVocab) ------------------------------ */

static const char *tmpl_special(const cJSON *item) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
  const cJSON *id = s ? cJSON_GetObjectItemCaseSensitive(s, "id") : NULL;
  return cJSON_IsString(id) && id->valuestring[0] ? id->valuestring : NULL;
}
static const char *tmpl_sequence(const cJSON *item) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
  const cJSON *id = s ? cJSON_GetObjectItemCaseSensitive(s, "id") : NULL;
  return cJSON_IsString(id) ? id->valuestring : NULL;
}
static bool same(const char *a, const char *b) { return a && b && !strcmp(a, b); }

/* Crude, as llama.cpp's: reads whether a simple template adds BOS/EOS/SEP. */
static void read_template(struct tok *t, const cJSON *proc, bool have_tc) {
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(proc, "single");
  const cJSON *pair = cJSON_GetObjectItemCaseSensitive(proc, "pair");
  int ns = cJSON_IsArray(single) ? cJSON_GetArraySize(single) : 0;
  const char *first = NULL, *last = NULL;
  const char **bos = &t->content[SP_BOS], **eos = &t->content[SP_EOS];
  if (ns > 1) {
    if ((first = tmpl_special(cJSON_GetArrayItem(single, 0)))) {
      if (!have_tc) *bos = first;
      t->add[SP_BOS] = same(first, *bos) || same(first, t->content[SP_CLS]);
    }
    if ((last = tmpl_special(cJSON_GetArrayItem(single, ns - 1)))) {
      if (!have_tc) *eos = last;
      else if (!same(last, *eos)) {
        /* the template ends turns with another token: that one becomes EOS, the old EOT */
        if (!t->use_eot) t->use_eot = true, t->content[SP_EOT] = *eos;
        *eos = last;
      }
      t->add[SP_EOS] = same(last, *eos);
    }
  }
  int np = cJSON_IsArray(pair) ? cJSON_GetArraySize(pair) : 0;
  if (!np) return;
  int lo = (first && same(tmpl_special(cJSON_GetArrayItem(pair, 0)), first)) ? 1 : 0;
  int hi = (last && same(tmpl_special(cJSON_GetArrayItem(pair, np - 1)), last)) ? np - 1 : np;
  if (hi - lo < 1) return;
  const char *a = tmpl_sequence(cJSON_GetArrayItem(pair, lo));
  const char *b = tmpl_sequence(cJSON_GetArrayItem(pair, hi - 1));
  if (!same(a, "A") || !same(b, "B") || hi - lo < 3) return; /* A [sep] [eos] B */
  bool add_sep = false;
  const char *sep = t->content[SP_SEP];
  const char *m0 = tmpl_special(cJSON_GetArrayItem(pair, lo + 1));
  if (m0 && (same(m0, sep) || same(m0, *eos)) && !last) add_sep = true;
  if (hi - lo == 4) {
    const char *m1 = tmpl_special(cJSON_GetArrayItem(pair, lo + 2));
    if (m1 && (same(m1, sep) || same(m1, *eos))) add_sep = true;
  }
  t->add[SP_SEP] = add_sep;
  if (add_sep && !sep && have_tc) t->content[SP_SEP] = *eos;
}

static void set_id(struct tok *t, int k, int64_t id) {
  if (t->id[k] >= 0 || id < 0) return; /* the first source to name one wins */
  t->id[k] = id;
}

/* config.json's *_token_id (one id, or a list: several EOS): each a token.
** llama.cpp skips an id past the vocabulary with a warning; such a config
** does not describe this tokenizer, so it is refused. */
static tsr_status check_config_ids(const struct tok *t, const cJSON *v, const char *key) {
  int i = 0;
  for (const cJSON *e = cJSON_IsArray(v) ? v->child : v; e;
       e = cJSON_IsArray(v) ? e->next : NULL, i++) {
    int64_t id;
    if (!tsr_json_as_i64(e, &id) || id < 0 || id >= t->n) {
      char what[96], at[24] = "";
      tsr_convert_describe(e, what, sizeof what);
      if (cJSON_IsArray(v)) snprintf(at, sizeof at, "[%d]", i);
      return tsr_error_set(TSR_ERR_FORMAT, "config.json: %s%s should be a token id from 0 to "
                           "%lld (the vocabulary's last), found %s", key, at,
                           (long long)t->n - 1, what);
    }
  }
  return TSR_OK;
}

static tsr_status read_specials(struct tok *t) {
  bool have_tc = t->tc && t->tc->child; /* an empty {} counts as absent, as in Python */
  for (int k = 0; k < SP_COUNT; k++) t->id[k] = -1, t->add[k] = -1;
  for (int k = 0; k < SP_EOT && have_tc; k++) {
    char key[32];
    snprintf(key, sizeof key, "%s_token", g_sp_name[k]);
    t->content[k] = entry_content(cJSON_GetObjectItemCaseSensitive(t->tc, key));
  }
  if (!t->content[SP_BOS] && t->content[SP_CLS]) t->content[SP_BOS] = t->content[SP_CLS];
  if (!t->content[SP_EOS] && t->content[SP_SEP]) t->content[SP_EOS] = t->content[SP_SEP];
  const cJSON *pp = cJSON_GetObjectItemCaseSensitive(t->tj, "post_processor");
  const cJSON *procs =
      cJSON_IsObject(pp) ? cJSON_GetObjectItemCaseSensitive(pp, "processors") : NULL;
  const cJSON *one = cJSON_IsObject(pp) ? pp : NULL;
  for (const cJSON *p = cJSON_IsArray(procs) ? procs->child : one; p;
       p = cJSON_IsArray(procs) ? p->next : NULL) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type)) continue;
    if (!strcmp(type->valuestring, "RobertaProcessing")) {
      t->add[SP_BOS] = t->add[SP_EOS] = t->add[SP_SEP] = 1;
      const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "cls"), 0);
      const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "sep"), 0);
      if (!t->content[SP_CLS] && have_tc)
        t->content[SP_CLS] = cJSON_IsString(cls) ? cls->valuestring : t->content[SP_BOS];
      if (!t->content[SP_SEP] && have_tc)
        t->content[SP_SEP] = cJSON_IsString(sep) ? sep->valuestring : t->content[SP_EOS];
    } else if (!strcmp(type->valuestring, "TemplateProcessing")) {
      read_template(t, p, have_tc);
    }
  }
  if (have_tc) {
    for (int k = 0; k < SP_COUNT; k++) {
      char key[40];
      snprintf(key, sizeof key, "add_%s_token", g_sp_name[k]);
      const cJSON *add = cJSON_GetObjectItemCaseSensitive(t->tc, key);
      if (cJSON_IsBool(add)) t->add[k] = cJSON_IsTrue(add);
      if (!t->content[k] || (k == SP_EOT && !t->use_eot)) continue;
      for (const cJSON *a = t->added ? t->added->child : NULL; a; a = a->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        int64_t id;
        if (cJSON_IsString(c) && !strcmp(c->valuestring, t->content[k]) &&
            tsr_json_as_i64(cJSON_GetObjectItemCaseSensitive(a, "id"), &id)) {
          set_id(t, k, id);
          break;
        }
      }
    }
  }
  /* then config.json's *_token_id, at the top level or in text_config */
  const cJSON *cfg = tsr_convert_config(t->cv);
  for (int k = 0; k < SP_EOT; k++) {
    char key[64];
    snprintf(key, sizeof key, "%s_token_id", g_sp_name[k]);
    const cJSON *v = tsr_json_find(cfg, key);
    if (!v) {
      snprintf(key, sizeof key, "text_config.%s_token_id", g_sp_name[k]);
      v = tsr_json_find(cfg, key);
    }
    int64_t id;
    tsr_status st = v ? check_config_ids(t, v, key) : TSR_OK;
    if (st != TSR_OK) return st;
    if (!v || !tsr_json_as_i64(v, &id)) continue; /* a list (several EOS) is not one id */
    set_id(t, k, id);
  }
  return TSR_OK;
}

/* tokenizer_config's chat_template (a string, or a list of named ones), else
** chat_template.jinja, else chat_template.json. */
static tsr_status write_chat_template(struct tok *t) {
  if (!t->tc || !t->tc->child) return TSR_OK;
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(t->tc, "chat_template");
  cJSON *file = NULL;
  char *text = NULL;
  tsr_status st = TSR_OK;
  char path[4200];
  if (!ct) {
    snprintf(path, sizeof path, "%s/chat_template.jinja", tsr_convert_dir(t->cv));
    FILE *f = tsr_json_file_exists(path) ? fopen(path, "rb") : NULL;
    if (f) {
      fseek(f, 0, SEEK_END);
      long n = ftell(f);
      fseek(f, 0, SEEK_SET);
      text = n >= 0 ? malloc((size_t)n + 1) : NULL;
      if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) st = tsr_error_set(TSR_ERR_IO,
                                                                 "%s: cannot read", path);
      else text[n] = '\0';
      fclose(f);
    } else {
      snprintf(path, sizeof path, "%s/chat_template.json", tsr_convert_dir(t->cv));
      if (tsr_json_file_exists(path) && (st = tsr_json_load(path, &file)) == TSR_OK)
        ct = cJSON_GetObjectItemCaseSensitive(file, "chat_template");
    }
  }
  if (st == TSR_OK && text) {
    st = tsr_convert_out_str(t->cv, "tokenizer.chat_template", text);
  } else if (st == TSR_OK && cJSON_IsString(ct)) {
    st = tsr_convert_out_str(t->cv, "tokenizer.chat_template", ct->valuestring);
  } else if (st == TSR_OK && cJSON_IsArray(ct)) {
    const char *names[64];
    int n = 0;
    for (const cJSON *e = ct->child; e && st == TSR_OK; e = e->next) {
      const char *name = entry_content(cJSON_GetObjectItemCaseSensitive(e, "name"));
      const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
      if (!name || !name[0] || !cJSON_IsString(tpl)) continue;
      char key[128], clean[64];
      size_t o = 0;
      for (const char *c = name; *c && o + 1 < sizeof clean; c++)
        clean[o++] = ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9')) ? *c : '_';
      clean[o] = '\0';
      if (!strcmp(clean, "default")) {
        st = tsr_convert_out_str(t->cv, "tokenizer.chat_template", tpl->valuestring);
        continue;
      }
      snprintf(key, sizeof key, "tokenizer.chat_template.%s", clean);
      st = tsr_convert_out_str(t->cv, key, tpl->valuestring);
      if (n < 64) names[n++] = name;
    }
    if (st == TSR_OK && n)
      st = tsr_convert_out_arr_str(t->cv, "tokenizer.chat_templates", names, n);
  }
  free(text);
  cJSON_Delete(file);
  return st;
}

/* ---- entry --------------------------------------------------------------- */

static tsr_status emit(struct tok *t, const char *pre, const cJSON *model) {
  struct tsr_convert *cv = t->cv;
  const char *kind = t->spm ? (t->gemma4 ? "gemma4" : "llama") : "gpt2";
  tsr_status st = tsr_convert_out_str(cv, "tokenizer.ggml.model", kind);
  /* llama.cpp writes no pre for SentencePiece-style vocabularies (its loader sets gemma4's) */
  if (st == TSR_OK && !t->spm && pre && *pre)
    st = tsr_convert_out_str(cv, "tokenizer.ggml.pre", pre);
  if (st == TSR_OK) st = tsr_convert_out_arr_str(cv, "tokenizer.ggml.tokens", t->text, t->n);
  if (st == TSR_OK && t->spm) {
    float *scores = malloc((size_t)t->n * sizeof *scores);
    if (!scores) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t->n; i++) scores[i] = -1000.0f;
    st = tsr_convert_out_arr_f32(cv, "tokenizer.ggml.scores", scores, t->n);
    free(scores);
  }
  if (st == TSR_OK) st = tsr_convert_out_arr_i32(cv, "tokenizer.ggml.token_type", t->type, t->n);
  if (st == TSR_OK) st = write_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"));
  for (int k = 0; k < SP_COUNT && st == TSR_OK; k++)
    if (t->id[k] >= 0) st = tsr_convert_out_u32(cv, g_sp_key[k], (uint32_t)t->id[k]);
  if (t->gemma4) t->add[SP_BOS] = 1;
  static const int add_kinds[] = {SP_BOS, SP_EOS, SP_SEP};
  for (int i = 0; i < 3 && st == TSR_OK; i++) {
    int k = add_kinds[i];
    char key[48];
    snprintf(key, sizeof key, "tokenizer.ggml.add_%s_token", g_sp_name[k]);
    if (t->add[k] >= 0) st = tsr_convert_out_bool(cv, key, t->add[k] == 1);
  }
  if (st == TSR_OK) st = write_chat_template(t);
  if (st == TSR_OK && t->gemma4)
    st = tsr_convert_out_bool(cv, "tokenizer.ggml.add_space_prefix", false);
  return st;
}

/* "found a number 5" for messages. */
static tsr_status wrong_type(const char *file, const char *key, const char *want,
                             const cJSON *v) {
  char what[96];
  tsr_convert_describe(v, what, sizeof what);
  return tsr_error_set(TSR_ERR_FORMAT, "%s: %s should be %s, found %s", file, key, want, what);
}

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* tokenizer_config.json's entries this file reads, each of the type it reads:
** another type would otherwise pass as "not set". */
static tsr_status check_tokenizer_config(const struct tok *t) {
  const cJSON *tc = t->tc;
  if (!tc) return TSR_OK;
  if (!cJSON_IsObject(tc))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: a JSON %s, not an object", t->tc_path,
                         tsr_json_type_name(tc));
  for (int k = 0; k < SP_COUNT; k++) {
    char key[40];
    snprintf(key, sizeof key, "%s_token", g_sp_name[k]);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(tc, key);
    if (k < SP_EOT && !absent(v) && !entry_content(v))
      return wrong_type(t->tc_path, key, "a string or an object with a string content (or null)",
                        v);
    snprintf(key, sizeof key, "add_%s_token", g_sp_name[k]);
    v = cJSON_GetObjectItemCaseSensitive(tc, key);
    if (!absent(v) && !cJSON_IsBool(v)) return wrong_type(t->tc_path, key, "true or false", v);
  }
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
  if (absent(ct) || cJSON_IsString(ct)) return TSR_OK;
  if (!cJSON_IsArray(ct))
    return wrong_type(t->tc_path, "chat_template", "a string or a list of named templates", ct);
  int i = 0;
  for (const cJSON *e = ct->child; e; e = e->next, i++) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
    if (!cJSON_IsString(name) || !name->valuestring[0] || !cJSON_IsString(tpl)) {
      char key[48];
      snprintf(key, sizeof key, "chat_template[%d]", i);
      return wrong_type(t->tc_path, key, "an object with a string name and template", e);
    }
  }
  return TSR_OK;
}

/* tokenizer.json's structure, before anything is read from it. */
static tsr_status check_tokenizer_json(const struct tok *t, const cJSON *model) {
  if (!cJSON_IsObject(t->tj))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: a JSON %s, not an object", t->path,
                         tsr_json_type_name(t->tj));
  if (!cJSON_IsObject(model))
    return absent(model) ? tsr_error_set(TSR_ERR_FORMAT, "%s: no model", t->path)
                         : wrong_type(t->path, "model", "an object", model);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(t->tj, "added_tokens");
  if (!absent(v) && !cJSON_IsArray(v)) return wrong_type(t->path, "added_tokens", "an array", v);
  v = cJSON_GetObjectItemCaseSensitive(model, "byte_fallback");
  if (!absent(v) && !cJSON_IsBool(v))
    return wrong_type(t->path, "model.byte_fallback", "true or false", v);
  return TSR_OK;
}

/* The two kinds this writer produces and tessera run reads: byte-level BPE
** with the arch's pre-tokenizer, and Gemma 4's SentencePiece-style BPE
** (byte_fallback). Another pairing would write a file run refuses. */
static tsr_status check_kind(const struct tok *t, const char *pre) {
  bool want_spm = pre && !strcmp(pre, "gemma4");
  if (t->spm == want_spm) return TSR_OK;
  if (t->spm)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: model.byte_fallback is true (a "
                         "SentencePiece-style vocabulary), but this model's tokenizer is "
                         "byte-level BPE (pre-tokenizer '%s'); expected byte_fallback false",
                         t->path, pre ? pre : "none");
  return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: model.byte_fallback is false (a byte-level "
                       "vocabulary), but this model's tokenizer is Gemma 4's SentencePiece-style "
                       "BPE; expected byte_fallback true", t->path);
}

tsr_status tsr_convert_tokenizer(struct tsr_convert *cv, const char *pre) {
  struct tok t = {.cv = cv};
  snprintf(t.path, sizeof t.path, "%s/tokenizer.json", tsr_convert_dir(cv));
  snprintf(t.tc_path, sizeof t.tc_path, "%s/tokenizer_config.json", tsr_convert_dir(cv));
  tsr_status st = tsr_json_load(t.path, &t.tj);
  if (st == TSR_OK && tsr_json_file_exists(t.tc_path)) st = tsr_json_load(t.tc_path, &t.tc);
  const cJSON *model = NULL, *vocab = NULL;
  if (st == TSR_OK) {
    model = cJSON_GetObjectItemCaseSensitive(t.tj, "model");
    st = check_tokenizer_json(&t, model);
  }
  if (st == TSR_OK) st = check_tokenizer_config(&t);
  if (st == TSR_OK) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    t.added = cJSON_GetObjectItemCaseSensitive(t.tj, "added_tokens");
    if (!cJSON_IsArray(t.added)) t.added = NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE"))
      st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: model.type is %s; tessera convert handles "
                         "BPE tokenizers", t.path,
                         cJSON_IsString(type) ? type->valuestring : "missing");
    else if (!cJSON_IsObject(vocab))
      st = tsr_error_set(TSR_ERR_FORMAT, "%s: model.vocab is not an object", t.path);
  }
  if (st == TSR_OK) {
    t.spm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    t.gemma4 = t.spm && pre && !strcmp(pre, "gemma4");
    st = check_kind(&t, pre);
  }
  if (st == TSR_OK) st = build_vocab(&t, vocab);
  if (st == TSR_OK) st = check_ids(&t);
  if (st == TSR_OK) st = apply_added(&t);
  if (st == TSR_OK) st = index_tokens(&t);
  if (st == TSR_OK) st = read_specials(&t);
  if (st == TSR_OK) st = check_bytes(&t);
  if (st == TSR_OK) st = emit(&t, pre, model);
  if (st != TSR_OK) tsr_error_prefix("convert_tokenizer");
  for (int64_t i = 0; i < t.n_owned; i++) free(t.owned[i]);
  free(t.owned);
  free(t.text);
  free(t.type);
  strset_free(&t.texts);
  cJSON_Delete(t.tj);
  cJSON_Delete(t.tc);
  return st;
}
