/*
** The JSON side of tessera serve: requests parsed and validated field by
** field (a field the endpoint does not know, or a setting it cannot honour,
** is a 400 naming it), and the OpenAI and llama-server response shapes.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "model/json.h"
#include "server_internal.h"

/* ---- text ---- */

/* Length of the valid UTF-8 character at s (n bytes left), or 0. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
  const unsigned char c = s[0];
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (!len || len > n || (len == 2 && c < 0xc2)) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (len == 3) {
    const uint32_t cp = (uint32_t)(c & 15) << 12 | (uint32_t)(s[1] & 63) << 6 | (s[2] & 63);
    if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  }
  if (len == 4) {
    const uint32_t cp = (uint32_t)(c & 7) << 18 | (uint32_t)(s[1] & 63) << 12 |
                        (uint32_t)(s[2] & 63) << 6 | (s[3] & 63);
    if (cp < 0x10000 || cp > 0x10ffff) return 0;
  }
  return len;
}

bool srv_text_append(struct srv_request *r, const char *bytes, size_t len) {
  if (r->n_text + len * 3 + 1 > r->cap_text) {
    size_t cap = r->cap_text ? r->cap_text : 256;
    while (cap < r->n_text + len * 3 + 1) cap *= 2;
    char *grown = realloc(r->text, cap);
    if (!grown) return false;
    r->text = grown;
    r->cap_text = cap;
  }
  const unsigned char *s = (const unsigned char *)bytes;
  for (size_t i = 0; i < len;) {
    size_t n = s[i] ? utf8_char_len(s + i, len - i) : 0;
    if (n) {
      memcpy(r->text + r->n_text, s + i, n);
      r->n_text += n, i += n;
    } else { /* JSON strings hold neither NULs (cJSON) nor broken bytes */
      memcpy(r->text + r->n_text, "\xef\xbf\xbd", 3);
      r->n_text += 3, i++;
    }
  }
  r->text[r->n_text] = 0;
  return true;
}

/* ---- request parsing ---- */

struct perr {
  char *msg;
  size_t cap;
  const char **param;
};

static int bad(struct perr *e, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, e->cap, fmt, ap);
  va_end(ap);
  *e->param = param;
  return 400;
}

static bool in_list(const char *name, const char *const *list) {
  for (; *list; list++)
    if (!strcmp(name, *list)) return true;
  return false;
}

static int check_fields(const cJSON *root, const char *const *known, const char *endpoint,
                        struct perr *e) {
  static __thread char name[128]; /* outlives the parsed body: the error names it */
  for (const cJSON *f = root->child; f; f = f->next)
    if (!in_list(f->string, known)) {
      snprintf(name, sizeof name, "%s", f->string);
      return bad(e, name, "unknown field '%s' for %s (tessera cannot honour it)", name,
                 endpoint);
    }
  return 0;
}

/* A number field in [lo, hi] (integral when integral); absent leaves *out. */
static int get_num(const cJSON *root, const char *name, double lo, double hi, bool integral,
                   double *out, struct perr *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (!v || cJSON_IsNull(v)) return 0;
  int64_t i;
  if (!cJSON_IsNumber(v))
    return bad(e, name, "'%s' must be a number, not %s", name, tsr_json_type_name(v));
  if (!isfinite(v->valuedouble)) /* 1e999: a number JSON allows and a double cannot hold */
    return bad(e, name, "'%s' is too large to be a number here", name);
  if (integral && !tsr_json_as_i64(v, &i))
    return bad(e, name, "'%s' must be an integer, not %g", name, v->valuedouble);
  if (v->valuedouble < lo || v->valuedouble > hi)
    return bad(e, name, "'%s' is %g, outside [%g, %g]", name, v->valuedouble, lo, hi);
  *out = v->valuedouble;
  return 0;
}

static int get_bool(const cJSON *root, const char *name, bool *out, struct perr *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsBool(v))
    return bad(e, name, "'%s' must be a boolean, not %s", name, tsr_json_type_name(v));
  *out = cJSON_IsTrue(v);
  return 0;
}

/* A field that exists in the API but can only take its neutral value here. */
static int only_neutral(const cJSON *root, const char *name, double neutral, struct perr *e) {
  double v = neutral;
  int st = get_num(root, name, -1e9, 1e9, false, &v, e);
  if (st) return st;
  if (v != neutral)
    return bad(e, name, "'%s' other than %g is not supported (no such sampler here)", name,
               neutral);
  return 0;
}

static int get_stop(const cJSON *root, const char *name, struct srv_params *p, struct perr *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (!v || cJSON_IsNull(v)) return 0;
  if (cJSON_IsString(v)) {
    if (!*v->valuestring) return bad(e, name, "'%s' must not be empty", name);
    if (!(p->stop[p->n_stop++] = strdup(v->valuestring))) return 500;
    return 0;
  }
  if (!cJSON_IsArray(v))
    return bad(e, name, "'%s' must be a string or an array of strings, not %s", name,
               tsr_json_type_name(v));
  if (cJSON_GetArraySize(v) > SRV_MAX_STOP)
    return bad(e, name, "'%s' holds %d strings; at most %d", name, cJSON_GetArraySize(v),
               SRV_MAX_STOP);
  for (const cJSON *s = v->child; s; s = s->next) {
    if (!cJSON_IsString(s) || !*s->valuestring)
      return bad(e, name, "'%s' must hold non-empty strings only", name);
    if (strlen(s->valuestring) >= 256) return bad(e, name, "a '%s' string is over 255 bytes", name);
    if (!(p->stop[p->n_stop++] = strdup(s->valuestring))) return 500;
  }
  return 0;
}

static int sampling_fields(const struct srv *s, const cJSON *root, struct srv_params *p,
                           struct perr *e) {
  const struct srv_sampling *d = &s->cfg.sampling;
  double temp = d->temperature, top_p = d->top_p, min_p = d->min_p, top_k = d->top_k;
  double seed = (double)s->cfg.seed;
  int st = get_num(root, "temperature", 0, 2, false, &temp, e);
  if (!st) st = get_num(root, "top_p", 0, 1, false, &top_p, e);
  if (!st && top_p <= 0) st = bad(e, "top_p", "'top_p' must be above 0");
  if (!st) st = get_num(root, "min_p", 0, 0.999999, false, &min_p, e);
  if (!st) st = get_num(root, "top_k", 0, 1e9, true, &top_k, e);
  if (!st) st = get_num(root, "seed", -9007199254740992.0, 9007199254740992.0, true, &seed, e);
  if (st) return st;
  p->sampling = (struct srv_sampling){.temperature = temp, .top_k = (int32_t)top_k,
                                      .top_p = top_p, .min_p = min_p};
  if (seed == -1) { /* a fresh seed per request */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    p->sampling.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
  } else {
    p->sampling.seed = (uint64_t)(int64_t)seed;
  }
  return 0;
}

static int stream_options(const cJSON *root, struct srv_params *p, struct perr *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsObject(v))
    return bad(e, "stream_options", "'stream_options' must be an object");
  if (!p->stream) return bad(e, "stream_options", "'stream_options' needs 'stream': true");
  static const char *const known[] = {"include_usage", NULL};
  int st = check_fields(v, known, "stream_options", e);
  return st ? st : get_bool(v, "include_usage", &p->include_usage, e);
}

/* The prompt's tokens (ids, n from tsr_tokenize or tsr_chat_tokenize: status st) kept in p. */
static int take_prompt(tsr_status st, int32_t *ids, size_t n, const char *param,
                       struct srv_params *p, struct perr *e) {
  if (st != TSR_OK) return bad(e, param, "%s", tsr_error_message());
  if (n == 0 || n > INT32_MAX) {
    tsr_free(ids);
    return bad(e, param, "the prompt is empty");
  }
  p->prompt = ids;
  p->n_prompt = (int32_t)n;
  return 0;
}

/* Chat: messages rendered with the model's template, then tokenized. */
static int chat_prompt(const struct srv *s, const cJSON *root, struct srv_params *p,
                       struct perr *e) {
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
    return bad(e, "messages", "'messages' must be a non-empty array");
  const int n = cJSON_GetArraySize(msgs);
  const char **role_of = calloc((size_t)n, sizeof *role_of);
  const char **content_of = calloc((size_t)n, sizeof *content_of);
  char **owned = calloc((size_t)n, sizeof *owned);
  int st = role_of && content_of && owned ? 0 : 500, i = 0;
  for (const cJSON *x = msgs->child; x && !st; x = x->next, i++) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(x, "content");
    static const char *const known[] = {"role", "content", NULL};
    static const char *const known_part[] = {"type", "text", NULL};
    char where[48];
    snprintf(where, sizeof where, "messages[%d]", i);
    if (!cJSON_IsObject(x)) {
      st = bad(e, "messages", "messages[%d] must be an object", i);
      break;
    }
    if (cJSON_GetObjectItemCaseSensitive(x, "name")) { /* no chat template has a place for it */
      st = bad(e, "messages", "messages[%d].name is not supported: the chat template has no "
               "place for a participant's name", i);
      break;
    }
    if ((st = check_fields(x, known, where, e))) break;
    if (!cJSON_IsString(role)) {
      st = bad(e, "messages", "messages[%d].role must be a string", i);
      break;
    }
    role_of[i] = !strcmp(role->valuestring, "developer") ? "system" : role->valuestring;
    if (cJSON_IsString(content)) {
      content_of[i] = content->valuestring;
    } else if (cJSON_IsArray(content)) { /* text parts, joined */
      size_t len = 1;
      int j = 0;
      for (const cJSON *part = content->child; part && !st; part = part->next, j++) {
        snprintf(where, sizeof where, "messages[%d].content[%d]", i, j);
        if (!cJSON_IsObject(part)) {
          st = bad(e, "messages", "%s must be an object", where);
          break;
        }
        if ((st = check_fields(part, known_part, where, e))) break;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
          st = bad(e, "messages", "messages[%d].content: only {\"type\": \"text\", \"text\": "
                   "...} parts are supported", i);
        else
          len += strlen(text->valuestring);
      }
      if (st) break;
      if (!(owned[i] = calloc(len, 1))) st = 500;
      for (const cJSON *part = content->child; part && !st; part = part->next)
        strcat(owned[i], cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
      content_of[i] = owned[i];
    } else {
      st = bad(e, "messages", "messages[%d].content must be a string or an array of text "
               "parts", i);
    }
  }
  if (!st) { /* the template's markers are special tokens; the same text in a message is not */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const tsr_status ts = tsr_chat_tokenize(s->e, role_of, content_of, (size_t)n, 1, &ids, &n_ids);
    st = take_prompt(ts, ids, n_ids, "messages", p, e);
  }
  for (int j = 0; owned && j < n; j++) free(owned[j]);
  free(owned);
  free(role_of);
  free(content_of);
  return st;
}

/* A prompt: a string, token ids, or (OpenAI) an array of one string. */
static int text_prompt(const struct srv *s, const cJSON *root, struct srv_params *p,
                       struct perr *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "prompt");
  if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child)) v = v->child;
  /* a prompt's text is text unless the request asks for its special tokens */
  bool parse_special = false;
  int st = get_bool(root, "parse_special", &parse_special, e);
  if (st) return st;
  if (cJSON_IsString(v)) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const tsr_status ts = tsr_tokenize(s->e, v->valuestring, strlen(v->valuestring),
                                       TSR_TOKENIZE_ADD_SPECIAL |
                                           (parse_special ? TSR_TOKENIZE_PARSE_SPECIAL : 0),
                                       &ids, &n_ids);
    return take_prompt(ts, ids, n_ids, "prompt", p, e);
  }
  if (!cJSON_IsArray(v) || !cJSON_GetArraySize(v))
    return bad(e, "prompt", "'prompt' must be a string or a non-empty array of token ids");
  const int n = cJSON_GetArraySize(v);
  if (!(p->prompt = malloc((size_t)n * sizeof *p->prompt))) return 500;
  int i = 0;
  for (const cJSON *x = v->child; x; x = x->next, i++) {
    int64_t id;
    if (!tsr_json_as_i64(x, &id) || id < 0 || id >= s->n_vocab)
      return bad(e, "prompt", "prompt[%d] is not a token id in [0, %d)", i, s->n_vocab);
    p->prompt[i] = (int32_t)id;
  }
  p->n_prompt = n;
  return 0;
}

static const char *const k_chat_fields[] = {
    "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "stop", "stream", "stream_options", "n", "presence_penalty",
    "frequency_penalty", "logprobs", "user", NULL};
static const char *const k_completion_fields[] = {
    "prompt", "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stream", "stream_options", "n", "echo", "presence_penalty", "frequency_penalty", "logprobs",
    "user", "parse_special", NULL};
static const char *const k_llama_fields[] = {
    "prompt", "n_predict", "cache_prompt", "stop", "stream", "temperature", "top_k", "top_p",
    "min_p", "seed", "parse_special", NULL};

static int parse_fields(struct srv *s, enum srv_kind k, const cJSON *root, struct srv_params *p,
                        struct perr *e) {
  static const char *const names[] = {"/v1/chat/completions", "/v1/completions", "/completion"};
  const char *const *known = k == SRV_CHAT         ? k_chat_fields
                             : k == SRV_COMPLETION ? k_completion_fields
                                                   : k_llama_fields;
  int st = check_fields(root, known, names[k], e);
  if (st) return st;
  const int32_t profile_max = s->cfg.max_tokens;
  const double not_asked = -2; /* below every valid value, -1 included */
  double max = not_asked, n = 1;
  p->cache_prompt = true;
  if (k == SRV_LLAMA) {
    st = get_num(root, "n_predict", -1, 1e9, true, &max, e);
    if (!st && max == 0) st = bad(e, "n_predict", "'n_predict' must be -1 or at least 1");
    if (!st) st = get_bool(root, "cache_prompt", &p->cache_prompt, e);
  } else {
    st = get_num(root, "max_tokens", 1, 1e9, true, &max, e);
    if (!st && k == SRV_CHAT) st = get_num(root, "max_completion_tokens", 1, 1e9, true, &max, e);
    if (!st) st = get_num(root, "n", 1, 1, true, &n, e);
    if (!st) st = only_neutral(root, "presence_penalty", 0, e);
    if (!st) st = only_neutral(root, "frequency_penalty", 0, e);
    const cJSON *v;
    if (!st && (v = cJSON_GetObjectItemCaseSensitive(root, "model")) && !cJSON_IsString(v))
      st = bad(e, "model", "'model' must be a string");
    if (!st && (v = cJSON_GetObjectItemCaseSensitive(root, "user")) && !cJSON_IsString(v))
      st = bad(e, "user", "'user' must be a string");
    if (!st && (v = cJSON_GetObjectItemCaseSensitive(root, "logprobs")) && !cJSON_IsNull(v) &&
        !cJSON_IsFalse(v))
      st = bad(e, "logprobs", "'logprobs' is not supported");
    bool echo = false;
    if (!st && k == SRV_COMPLETION) st = get_bool(root, "echo", &echo, e);
    if (!st && echo) st = bad(e, "echo", "'echo' is not supported");
  }
  if (!st) st = get_bool(root, "stream", &p->stream, e);
  if (!st && k != SRV_LLAMA) st = stream_options(root, p, e);
  if (!st) st = sampling_fields(s, root, p, e);
  if (!st) st = get_stop(root, "stop", p, e);
  p->max_tokens_default = max == not_asked;
  if (p->max_tokens_default) max = k == SRV_COMPLETION ? 16 : profile_max > 0 ? profile_max : -1;
  p->max_tokens = (int64_t)max;
  return st;
}

/* The offset of a \u0000 escape in the JSON text, or -1. The request's strings
** are C strings, which would end there: such a request is refused, not cut. */
static long nul_escape(const char *s, size_t n) {
  for (size_t i = 0; i + 1 < n; i++) {
    if (s[i] != '\\') continue;
    if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return (long)i;
    i++; /* the escaped character */
  }
  return -1;
}

/* tsr_json_parse of a request body, or 400 naming what is wrong. */
static int parse_body(const char *body, size_t len, struct perr *e, cJSON **root) {
  const long nul = nul_escape(body, len);
  if (nul >= 0)
    return bad(e, NULL, "a string holds \\u0000 (byte %ld): NUL characters are not "
               "accepted, since the text would end there", nul);
  if (tsr_json_parse(body, len, "request body", root) != TSR_OK)
    return bad(e, NULL, "invalid JSON: %s", tsr_error_message());
  return 0;
}

int srv_parse_request(struct srv *s, enum srv_kind k, const char *body, size_t len,
                      struct srv_request **out, char *msg, size_t cap, const char **param,
                      const char **code) {
  struct perr e = {msg, cap, param};
  *out = NULL;
  *param = *code = NULL;
  cJSON *root = NULL;
  const int pst = parse_body(body, len, &e, &root);
  if (pst) return pst;
  struct srv_request *r = calloc(1, sizeof *r);
  int st = r ? 0 : 500;
  if (!st && !cJSON_IsObject(root)) st = bad(&e, NULL, "the body must be a JSON object");
  if (!st) {
    r->p.kind = k;
    st = parse_fields(s, k, root, &r->p, &e);
  }
  if (!st) st = k == SRV_CHAT ? chat_prompt(s, root, &r->p, &e) : text_prompt(s, root, &r->p, &e);
  /* the prompt and every token asked for must fit the slot's share of the cache; a
  ** default limit (the profile's, or 16) only bounds what the context leaves */
  if (!st && r->p.max_tokens_default && r->p.max_tokens > s->n_ctx_slot - r->p.n_prompt)
    r->p.max_tokens = s->n_ctx_slot > r->p.n_prompt ? s->n_ctx_slot - r->p.n_prompt : 1;
  if (!st && (r->p.n_prompt >= s->n_ctx_slot ||
              (r->p.max_tokens > 0 && r->p.n_prompt + r->p.max_tokens > s->n_ctx_slot))) {
    *code = "context_length_exceeded";
    char asks[96] = ""; /* the limit by the name this endpoint gives it */
    if (r->p.max_tokens > 0)
      snprintf(asks, sizeof asks, " and %s asks for %lld more",
               k == SRV_LLAMA ? "n_predict" : "max_tokens", (long long)r->p.max_tokens);
    st = bad(&e, k == SRV_CHAT ? "messages" : "prompt",
             "this slot's context is %d tokens; the prompt has %d%s", s->n_ctx_slot,
             r->p.n_prompt, asks);
  }
  tsr_sampler *probe = NULL; /* the sampler's own validation, before queueing */
  if (!st && srv_sampler_open(s, &r->p.sampling, &probe) != TSR_OK)
    st = bad(&e, NULL, "%s", tsr_error_message());
  tsr_sampler_close(probe);
  cJSON_Delete(root);
  if (st == 500) snprintf(msg, cap, "out of memory");
  if (st) {
    srv_request_free(r);
    return st;
  }
  r->refs = 1;
  r->slot = -1;
  r->created = (long long)time(NULL);
  *out = r;
  return 0;
}

void srv_request_free(struct srv_request *r) {
  if (!r) return;
  for (int i = 0; i < r->p.n_stop; i++) free(r->p.stop[i]);
  free(r->p.prompt);
  free(r->text);
  free(r);
}

/* ---- responses ---- */

static char *print(cJSON *o) {
  char *s = o ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  return s;
}

/* The length of the well-formed UTF-8 sequence at s (shortest form, no surrogates,
** at most U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s) {
  const unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
      (c == 0xF4 && s[1] > 0x8F))
    return 0;
  return n;
}

/* s with every byte that is not part of well-formed UTF-8 replaced by U+FFFD: request
** text echoed in an error (a field name, a role, a path) must not make the body
** invalid JSON. malloc'd; NULL when out of memory. */
static char *utf8_clean(const char *s) {
  const size_t n = strlen(s);
  char *out = malloc(3 * n + 1), *o = out;
  if (!out) return NULL;
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    const size_t k = utf8_seq(p);
    if (k) {
      memcpy(o, p, k), o += k, p += k;
    } else {
      memcpy(o, "\xEF\xBF\xBD", 3), o += 3, p++;
    }
  }
  *o = 0;
  return out;
}

char *srv_render_error(int status, const char *msg, const char *param, const char *code) {
  char *clean_msg = utf8_clean(msg), *clean_param = param ? utf8_clean(param) : NULL;
  if (!clean_msg || (param && !clean_param)) {
    free(clean_msg), free(clean_param);
    return NULL;
  }
  msg = clean_msg, param = clean_param;
  cJSON *o = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(o, "error");
  const char *type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  cJSON_AddStringToObject(err, "message", msg);
  cJSON_AddStringToObject(err, "type", type);
  if (param) cJSON_AddStringToObject(err, "param", param);
  else cJSON_AddNullToObject(err, "param");
  if (code) cJSON_AddStringToObject(err, "code", code);
  else cJSON_AddNullToObject(err, "code");
  free(clean_msg), free(clean_param);
  return print(o);
}

static void add_usage(cJSON *o, const struct srv_request *r) {
  cJSON *u = cJSON_AddObjectToObject(o, "usage");
  cJSON_AddNumberToObject(u, "prompt_tokens", r->p.n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", r->n_gen);
  cJSON_AddNumberToObject(u, "total_tokens", r->p.n_prompt + r->n_gen);
}

static void add_timings(cJSON *o, const struct srv_request *r) {
  cJSON *t = cJSON_AddObjectToObject(o, "timings");
  const int32_t prompt_n = r->p.n_prompt - r->n_cached;
  const double prompt_ms = 1e3 * (r->t_first - r->t_start);
  const double gen_ms = 1e3 * (r->t_end - r->t_first);
  cJSON_AddNumberToObject(t, "prompt_n", prompt_n);
  cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
  cJSON_AddNumberToObject(t, "prompt_per_token_ms", prompt_n ? prompt_ms / prompt_n : 0);
  cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? 1e3 * prompt_n / prompt_ms : 0);
  cJSON_AddNumberToObject(t, "predicted_n", r->n_gen);
  cJSON_AddNumberToObject(t, "predicted_ms", gen_ms);
  cJSON_AddNumberToObject(t, "predicted_per_token_ms", r->n_gen ? gen_ms / r->n_gen : 0);
  cJSON_AddNumberToObject(t, "predicted_per_second", gen_ms > 0 ? 1e3 * r->n_gen / gen_ms : 0);
}

/* The common head of OpenAI objects. */
static cJSON *oai_object(const struct srv *s, const struct srv_request *r, const char *object) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", object);
  cJSON_AddNumberToObject(o, "created", (double)r->created);
  cJSON_AddStringToObject(o, "model", s->model_id);
  return o;
}

static cJSON *string_n(const char *text, size_t len) {
  char *copy = malloc(len + 1);
  if (!copy) return NULL;
  memcpy(copy, text, len);
  copy[len] = 0;
  cJSON *v = cJSON_CreateString(copy);
  free(copy);
  return v;
}

static void add_finish(cJSON *choice, const struct srv_request *r) {
  if (r->finish) cJSON_AddStringToObject(choice, "finish_reason", r->finish);
  else cJSON_AddNullToObject(choice, "finish_reason");
}

static void llama_fields(const struct srv *s, cJSON *o, const struct srv_request *r) {
  cJSON_AddNumberToObject(o, "id_slot", r->slot);
  cJSON_AddStringToObject(o, "model", s->model_id);
  cJSON_AddNumberToObject(o, "tokens_predicted", r->n_gen);
  cJSON_AddNumberToObject(o, "tokens_evaluated", r->p.n_prompt);
  cJSON_AddNumberToObject(o, "tokens_cached", r->n_cached);
  cJSON_AddStringToObject(o, "stop_type", r->stop_type ? r->stop_type : "none");
  cJSON_AddStringToObject(o, "stopping_word", r->stopping_word);
  cJSON_AddBoolToObject(o, "truncated", false);
  add_timings(o, r);
}

char *srv_render_result(const struct srv *s, const struct srv_request *r) {
  if (r->p.kind == SRV_LLAMA) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "content", string_n(r->text ? r->text : "", r->n_text));
    cJSON_AddBoolToObject(o, "stop", true);
    llama_fields(s, o, r);
    return print(o);
  }
  const bool chat = r->p.kind == SRV_CHAT;
  cJSON *o = oai_object(s, r, chat ? "chat.completion" : "text_completion");
  cJSON *choice = cJSON_CreateObject();
  cJSON_AddNumberToObject(choice, "index", 0);
  cJSON *text = string_n(r->text ? r->text : "", r->n_text);
  if (chat) {
    cJSON *m = cJSON_AddObjectToObject(choice, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddItemToObject(m, "content", text);
  } else {
    cJSON_AddItemToObject(choice, "text", text);
  }
  cJSON_AddNullToObject(choice, "logprobs");
  add_finish(choice, r);
  cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), choice);
  add_usage(o, r);
  add_timings(o, r);
  return print(o);
}

char *srv_render_chunk(const struct srv *s, const struct srv_request *r, const char *text,
                       size_t len, bool first) {
  if (r->p.kind == SRV_LLAMA) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "content", string_n(text, len));
    cJSON_AddBoolToObject(o, "stop", false);
    cJSON_AddNumberToObject(o, "id_slot", r->slot);
    return print(o);
  }
  const bool chat = r->p.kind == SRV_CHAT;
  cJSON *o = oai_object(s, r, chat ? "chat.completion.chunk" : "text_completion");
  cJSON *choice = cJSON_CreateObject();
  cJSON_AddNumberToObject(choice, "index", 0);
  if (chat) {
    cJSON *d = cJSON_AddObjectToObject(choice, "delta");
    if (first) cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddItemToObject(d, "content", string_n(text, len));
  } else {
    cJSON_AddItemToObject(choice, "text", string_n(text, len));
    cJSON_AddNullToObject(choice, "logprobs");
  }
  cJSON_AddNullToObject(choice, "finish_reason");
  cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), choice);
  return print(o);
}

/* The events that end a stream, each "data: ...\n\n". */
char *srv_render_final(const struct srv *s, const struct srv_request *r) {
  char *parts[3] = {NULL, NULL, NULL};
  if (r->err_status) {
    parts[0] = srv_render_error(r->err_status, r->err_msg, NULL, NULL);
  } else if (r->p.kind == SRV_LLAMA) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "content", "");
    cJSON_AddBoolToObject(o, "stop", true);
    llama_fields(s, o, r);
    parts[0] = print(o);
  } else {
    const bool chat = r->p.kind == SRV_CHAT;
    cJSON *o = oai_object(s, r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", 0);
    if (chat) cJSON_AddObjectToObject(choice, "delta");
    else cJSON_AddStringToObject(choice, "text", "");
    add_finish(choice, r);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), choice);
    parts[0] = print(o);
    if (r->p.include_usage) {
      cJSON *u = oai_object(s, r, chat ? "chat.completion.chunk" : "text_completion");
      cJSON_AddArrayToObject(u, "choices");
      add_usage(u, r);
      parts[1] = print(u);
    }
  }
  const bool done_marker = r->p.kind != SRV_LLAMA || r->err_status;
  size_t len = 16;
  for (int i = 0; i < 2; i++) len += parts[i] ? strlen(parts[i]) + 8 : 0;
  char *out = malloc(len + 16);
  if (out) {
    out[0] = 0;
    for (int i = 0; i < 2; i++)
      if (parts[i]) strcat(strcat(strcat(out, "data: "), parts[i]), "\n\n");
    if (done_marker) strcat(out, "data: [DONE]\n\n");
  }
  free(parts[0]), free(parts[1]);
  return out;
}

char *srv_render_models(const struct srv *s) {
  cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON_AddStringToObject(m, "id", s->model_id);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)time(NULL));
  cJSON_AddStringToObject(m, "owned_by", "tessera");
  cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
  return print(o);
}

char *srv_render_props(const struct srv *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model", s->model_id);
  cJSON_AddNumberToObject(o, "slots", s->n_slots);
  cJSON_AddNumberToObject(o, "slot_context", s->n_ctx_slot);
  cJSON_AddStringToObject(o, "composition", s->composition ? s->composition : "");
  return print(o);
}

char *srv_render_slots(struct srv *s) {
  cJSON *a = cJSON_CreateArray();
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_slots; i++) {
    const struct srv_slot *sl = &s->slots[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", i);
    cJSON_AddStringToObject(o, "state", sl->req ? "processing" : "idle");
    cJSON_AddNumberToObject(o, "n_ctx", s->n_ctx_slot);
    cJSON_AddNumberToObject(o, "n_cached", sl->n_cached);
    cJSON_AddNumberToObject(o, "n_prompt", sl->req ? sl->req->p.n_prompt : 0);
    cJSON_AddNumberToObject(o, "n_decoded", sl->req ? sl->req->n_gen : 0);
    cJSON_AddItemToArray(a, o);
  }
  pthread_mutex_unlock(&s->mu);
  return print(a);
}

char *srv_render_metrics(struct srv *s, const char *more) {
  pthread_mutex_lock(&s->mu);
  const struct srv_metrics m = s->m;
  int busy = 0, waiting = s->n_queue;
  for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].req != NULL;
  pthread_mutex_unlock(&s->mu);
  struct { const char *name, *type, *help; double v; } rows[] = {
      {"requests_total", "counter", "generation requests accepted or refused", (double)m.requests},
      {"requests_failed_total", "counter", "generation requests that failed", (double)m.failed},
      {"prompt_tokens_total", "counter", "prompt tokens evaluated", (double)m.prompt_tokens},
      {"generated_tokens_total", "counter", "tokens generated", (double)m.generated_tokens},
      {"prompt_seconds_total", "counter", "seconds spent on prompt tokens", m.prompt_seconds},
      {"decode_seconds_total", "counter", "seconds spent on generated tokens", m.decode_seconds},
      {"prompt_tokens_per_second", "gauge", "prompt tokens per second so far",
       m.prompt_seconds > 0 ? (double)m.prompt_tokens / m.prompt_seconds : 0},
      {"decode_tokens_per_second", "gauge", "generated tokens per second so far",
       m.decode_seconds > 0 ? (double)m.generated_tokens / m.decode_seconds : 0},
      {"slots_busy", "gauge", "slots holding a request", busy},
      {"slots_total", "gauge", "slots", s->n_slots},
      {"requests_waiting", "gauge", "requests queued for a slot", waiting},
      {"kv_cells_used", "gauge", "KV cache positions held by the slots", (double)m.kv_used},
      {"kv_cells_total", "gauge", "KV cache positions", (double)m.kv_total},
      {"connections_timed_out_total", "counter",
       "connections closed for sending headers or a body too slowly", (double)m.timeouts},
  };
  const size_t more_len = more ? strlen(more) : 0;
  size_t cap = 8192 + more_len + 1, len = 0; /* a row is under 300 bytes */
  char *out = malloc(cap);
  for (size_t i = 0; out && i < sizeof rows / sizeof *rows; i++)
    len += (size_t)snprintf(out + len, cap - len, "# HELP tessera_%s %s\n# TYPE tessera_%s %s\n"
                            "tessera_%s %.17g\n", rows[i].name, rows[i].help, rows[i].name,
                            rows[i].type, rows[i].name, rows[i].v);
  if (out && more_len) memcpy(out + len, more, more_len + 1);
  return out;
}

/* ---- /tokenize, /detokenize ---- */

/* The body as a JSON object holding only known fields: 0 and *root (free
** it), or 400 (*root may still need freeing). */
static int parse_object(const char *body, size_t len, const char *const *known,
                        const char *endpoint, struct perr *e, cJSON **root) {
  *root = NULL;
  const int st = parse_body(body, len, e, root);
  if (st) return st;
  return cJSON_IsObject(*root) ? check_fields(*root, known, endpoint, e)
                               : bad(e, NULL, "the body must be a JSON object");
}

int srv_tokenize(const struct srv *s, const char *body, size_t len, char **out, char *msg,
                 size_t cap, const char **param) {
  struct perr e = {msg, cap, param};
  *param = NULL;
  static const char *const known[] = {"content", "add_special", "parse_special", NULL};
  bool add_special = false, parse_special = true;
  cJSON *root;
  int st = parse_object(body, len, known, "/tokenize", &e, &root);
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "content");
  if (!st && !cJSON_IsString(c)) st = bad(&e, "content", "'content' must be a string");
  if (!st) st = get_bool(root, "add_special", &add_special, &e);
  if (!st) st = get_bool(root, "parse_special", &parse_special, &e);
  int32_t *ids = NULL;
  size_t n = 0;
  if (!st && tsr_tokenize(s->e, c->valuestring, strlen(c->valuestring),
                          (add_special ? TSR_TOKENIZE_ADD_SPECIAL : 0) |
                              (parse_special ? TSR_TOKENIZE_PARSE_SPECIAL : 0),
                          &ids, &n) != TSR_OK)
    st = bad(&e, "content", "%s", tsr_error_message());
  if (!st) {
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    if (!(*out = print(o))) st = 500;
  }
  free(ids);
  cJSON_Delete(root);
  return st;
}

int srv_detokenize(const struct srv *s, const char *body, size_t len, char **out, char *msg,
                   size_t cap, const char **param) {
  struct perr e = {msg, cap, param};
  *param = NULL;
  static const char *const known[] = {"tokens", NULL};
  cJSON *root;
  int st = parse_object(body, len, known, "/detokenize", &e, &root);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
  if (!st && !cJSON_IsArray(t)) st = bad(&e, "tokens", "'tokens' must be an array of token ids");
  const int n = st ? 0 : cJSON_GetArraySize(t);
  int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
  if (!st && !ids) st = 500;
  int i = 0;
  for (const cJSON *x = st ? NULL : t->child; x && !st; x = x->next, i++) {
    int64_t id;
    if (!tsr_json_as_i64(x, &id) || id < 0 || id >= s->n_vocab)
      st = bad(&e, "tokens", "tokens[%d] is not a token id in [0, %d)", i, s->n_vocab);
    else
      ids[i] = (int32_t)id;
  }
  char *text = NULL;
  size_t tlen = 0;
  if (!st && tsr_detokenize(s->e, ids, (size_t)n, &text, &tlen) != TSR_OK)
    st = bad(&e, "tokens", "%s", tsr_error_message());
  if (!st) {
    struct srv_request tmp = {0}; /* reuse the UTF-8 cleaning of generated text */
    cJSON *o = cJSON_CreateObject();
    if (srv_text_append(&tmp, text, tlen))
      cJSON_AddItemToObject(o, "content", string_n(tmp.text, tmp.n_text));
    free(tmp.text);
    if (!(*out = print(o))) st = 500;
  }
  free(text);
  free(ids);
  cJSON_Delete(root);
  return st;
}

tsr_status srv_sampler_open(const struct srv *s, const struct srv_sampling *p, tsr_sampler **out) {
  char set[5][64];
  snprintf(set[0], sizeof set[0], "temperature=%.17g", p->temperature);
  snprintf(set[1], sizeof set[1], "top_k=%d", p->top_k);
  snprintf(set[2], sizeof set[2], "top_p=%.17g", p->top_p);
  snprintf(set[3], sizeof set[3], "min_p=%.17g", p->min_p);
  snprintf(set[4], sizeof set[4], "seed=%llu", (unsigned long long)p->seed);
  const char *const sets[] = {set[0], set[1], set[2], set[3], set[4]};
  return tsr_sampler_open(s->e, sets, 5, out);
}
