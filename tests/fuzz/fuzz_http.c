/* libFuzzer target: what `tessera serve` does with a request before the engine sees it.
** Input: an HTTP request as a client sends it, "METHOD PATH ...\r\n", header lines,
** "\r\n", then the body. Without a socket (libmicrohttpd's parsing is its own):
**   headers  every header goes through the framing check (Content-Length /
**            Transfer-Encoding), Content-Type through the JSON check, Origin
**            through the CORS list, Authorization through the key check;
**   body     through the endpoint the path names (chat, completions, llama-server
**            completion, tokenize, detokenize; any other path: the body's first
**            byte picks one), with the default model's tokenizer and ChatML, which
**            a stand-in engine below serves through the embedding API's token,
**            chat and sampler calls (the only engine calls the request parser
**            makes).
** Checked: every refusal has a message and renders as valid JSON (the error body a
** client gets); an accepted request's prompt is a non-empty run of token ids in
** range that fits the slot with its reply; tokenize/detokenize answers are JSON. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "engine/sampler.h"
#include "model/chat.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "server/server_internal.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

#ifndef TSR_FUZZ_MODELS_DIR
#define TSR_FUZZ_MODELS_DIR "models"
#endif

static struct srv g_srv;
static struct tsr_gguf *g_model; /* held for the run, as the server holds it */

/* ---- the stand-in engine: a tokenizer and ChatML ---- */

struct tsr_engine {
  struct tsr_tokenizer *tok;
};
static struct tsr_engine g_engine;

void tsr_free(void *p) { free(p); }

tsr_status tsr_tokenize(tsr_engine *e, const char *text, size_t len, unsigned flags,
                        int32_t **tokens, size_t *n) {
  return tsr_tokenizer_encode(e->tok, text, len, flags & TSR_TOKENIZE_PARSE_SPECIAL,
                              flags & TSR_TOKENIZE_ADD_SPECIAL, tokens, n);
}

tsr_status tsr_detokenize(tsr_engine *e, const int32_t *tokens, size_t n, char **text,
                          size_t *len) {
  return tsr_tokenizer_decode(e->tok, tokens, n, text, len);
}

tsr_status tsr_chat_tokenize(tsr_engine *e, const char *const *roles, const char *const *contents,
                             size_t n, int add_generation_prompt, int32_t **tokens,
                             size_t *n_tokens) {
  struct tsr_chat_message *m = calloc(n ? n : 1, sizeof *m);
  REQUIRE(m);
  for (size_t i = 0; i < n; i++) m[i] = (struct tsr_chat_message){roles[i], contents[i]};
  char *text = NULL;
  unsigned char *marks = NULL;
  tsr_status st = tsr_chat_render_marked(TSR_CHAT_CHATML, m, n, add_generation_prompt, &text,
                                         &marks);
  if (st == TSR_OK)
    st = tsr_tokenizer_encode_marked(e->tok, text, strlen(text), true, marks, true, tokens,
                                     n_tokens);
  free(text), free(marks), free(m);
  return st;
}

/* srv_sampler_open passes temperature, top_k, top_p, min_p and seed, in that order */
tsr_status tsr_sampler_open(const tsr_engine *e, const char *const *sets, int n_sets,
                            tsr_sampler **out) {
  double temp, top_p, min_p;
  int top_k;
  unsigned long long seed;
  REQUIRE(n_sets == 5 && sscanf(sets[0], "temperature=%lf", &temp) == 1 &&
          sscanf(sets[1], "top_k=%d", &top_k) == 1 && sscanf(sets[2], "top_p=%lf", &top_p) == 1 &&
          sscanf(sets[3], "min_p=%lf", &min_p) == 1 && sscanf(sets[4], "seed=%llu", &seed) == 1);
  struct tsr_sampler_params p = {.temperature = (float)temp, .top_k = top_k, .top_p = (float)top_p,
                                 .min_p = (float)min_p, .seed = seed};
  return tsr_sampler_new(&p, tsr_tokenizer_n_vocab(e->tok), out);
}

void tsr_sampler_close(tsr_sampler *s) { tsr_sampler_free(s); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (tsr_gguf_open(TSR_FUZZ_MODELS_DIR "/ref-qwen3-21m.gguf", &g_model) != TSR_OK ||
      tsr_tokenizer_load(g_model, &g_engine.tok) != TSR_OK) {
    fprintf(stderr, "fuzz_http: %s\n", tsr_error_message());
    abort();
  }
  g_srv.e = &g_engine;
  g_srv.cfg.sampling = (struct srv_sampling){.temperature = 0.8, .top_k = 40, .top_p = 0.95,
                                             .min_p = 0.05};
  g_srv.cfg.seed = -1;
  g_srv.cfg.max_tokens = 256;
  g_srv.cfg.cors_origins = "https://app.example, http://127.0.0.1:3000";
  g_srv.n_vocab = tsr_tokenizer_n_vocab(g_engine.tok);
  g_srv.n_slots = 1;
  g_srv.n_ctx_slot = 512;
  return 0;
}

/* An error body must be JSON a client can parse, whatever the request held. */
static void check_error_body(int status, const char *msg, const char *param, const char *code) {
  REQUIRE(status >= 400 && status < 600);
  REQUIRE(msg[0] != 0);
  char *body = srv_render_error(status, msg, param, code);
  REQUIRE(body);
  cJSON *doc = cJSON_Parse(body);
  REQUIRE(doc && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(doc, "error")));
  cJSON_Delete(doc);
  free(body);
}

static void headers(const char *head, size_t n) {
  struct srv_framing f = {0};
  char msg[512];
  const char *p = head, *end = head + n;
  const char *eol = memchr(p, '\n', (size_t)(end - p));
  p = eol ? eol + 1 : end; /* the request line */
  while (p < end) {
    eol = memchr(p, '\n', (size_t)(end - p));
    const char *line_end = eol ? eol : end;
    const char *colon = memchr(p, ':', (size_t)(line_end - p));
    if (colon) {
      char key[128], value[1024];
      size_t nk = (size_t)(colon - p), nv = (size_t)(line_end - colon - 1);
      if (nk < sizeof key && nv < sizeof value) {
        memcpy(key, p, nk), key[nk] = 0;
        const char *v = colon + 1;
        while (nv && (*v == ' ' || *v == '\t')) v++, nv--;
        while (nv && (v[nv - 1] == '\r' || v[nv - 1] == ' ')) nv--;
        memcpy(value, v, nv), value[nv] = 0;
        srv_framing_add(&f, key, value);
        if (!strcasecmp(key, "Content-Type") && !srv_json_content_type(value, msg, sizeof msg))
          check_error_body(415, msg, NULL, "unsupported_media_type");
        if (!strcasecmp(key, "Origin")) {
          const char *allow = srv_allowed_origin(g_srv.cfg.cors_origins, value);
          REQUIRE(!allow || !strcmp(allow, "*") || !strcmp(allow, value));
        }
        if (!strcasecmp(key, "Authorization")) {
          REQUIRE(srv_bearer_ok(value, NULL));
          if (srv_bearer_ok(value, "k3y")) REQUIRE(strlen(value) == 10 && !strcmp(value + 7, "k3y"));
        }
      }
    }
    p = eol ? eol + 1 : end;
  }
  const int st = srv_framing_error(&f, msg, sizeof msg);
  if (st) check_error_body(st, msg, NULL, NULL);
}

static void body(int which, const char *text, size_t n) {
  char msg[1024];
  const char *param = NULL, *code = NULL;
  if (which >= 3) {
    char *out = NULL;
    int st = (which == 3 ? srv_tokenize : srv_detokenize)(&g_srv, text, n, &out, msg, sizeof msg,
                                                          &param);
    if (st) {
      check_error_body(st, msg, param, NULL);
    } else {
      cJSON *doc = cJSON_Parse(out);
      REQUIRE(doc && cJSON_IsObject(doc));
      cJSON_Delete(doc);
    }
    free(out);
    return;
  }
  static const enum srv_kind kinds[] = {SRV_CHAT, SRV_COMPLETION, SRV_LLAMA};
  struct srv_request *r = NULL;
  int st = srv_parse_request(&g_srv, kinds[which], text, n, &r, msg, sizeof msg, &param, &code);
  if (st) {
    REQUIRE(!r);
    check_error_body(st, msg, param, code);
    return;
  }
  REQUIRE(r && r->p.n_prompt > 0 && r->p.n_prompt < g_srv.n_ctx_slot);
  for (int32_t i = 0; i < r->p.n_prompt; i++)
    REQUIRE(r->p.prompt[i] >= 0 && r->p.prompt[i] < g_srv.n_vocab);
  REQUIRE(r->p.max_tokens == -1 ||
          (r->p.max_tokens >= 1 && r->p.n_prompt + r->p.max_tokens <= g_srv.n_ctx_slot));
  REQUIRE(r->p.n_stop >= 0 && r->p.n_stop <= SRV_MAX_STOP);
  srv_request_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  const char *sep = NULL;
  for (size_t i = 0; i + 3 < size && !sep; i++)
    if (!memcmp(text + i, "\r\n\r\n", 4)) sep = text + i;
  const size_t n_head = sep ? (size_t)(sep - text) : size;
  headers(text, n_head);
  const char *b = sep ? sep + 4 : text + size;
  size_t n_body = (size_t)(text + size - b);
  static const char *const paths[] = {"/v1/chat/completions ", "/v1/completions ",
                                      "/completion ", "/tokenize ", "/detokenize "};
  int which = -1;
  const char *sp = memchr(text, ' ', n_head);
  for (int k = 0; sp && k < 5 && which < 0; k++)
    if ((size_t)(text + n_head - sp - 1) >= strlen(paths[k]) &&
        !memcmp(sp + 1, paths[k], strlen(paths[k])))
      which = k;
  if (which < 0) { /* any other path: the body's first byte picks the endpoint */
    if (!n_body) return 0;
    which = (uint8_t)b[0] % 5;
    b++, n_body--;
  }
  /* the server keeps the body NUL-terminated (server_http.c), as cJSON reads it */
  char *copy = malloc(n_body + 1);
  REQUIRE(copy);
  memcpy(copy, b, n_body);
  copy[n_body] = 0;
  body(which, copy, n_body);
  free(copy);
  return 0;
}
