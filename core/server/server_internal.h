/*
** tessera serve, inside: requests, slots and the scheduler (server_sched.c),
** JSON requests and responses (server_api.c), HTTP (server_http.c).
**
** Threads. libmicrohttpd runs one thread per connection; one scheduler thread
** owns the engine. They share the server's mutex: the queue, the slots, each
** request's progress and the metrics are read and written under it. The
** engine, the samplers and the text streams are touched by the scheduler
** only, and it does not hold the mutex while a batch runs; connection threads
** call only the engine's read-only token and chat calls (tessera.h says they
** may).
**
** A request is referenced by its connection and, while queued or in a slot,
** by the scheduler; the last one to let go frees it.
*/
#ifndef TSR_SERVER_INTERNAL_H
#define TSR_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"
#include "tessera/tessera.h"

#define SRV_MAX_SLOTS 64
#define SRV_MAX_DRAFT 8 /* proposals of a speculative step at most */
#define SRV_MAX_STOP 16

enum srv_kind { SRV_CHAT, SRV_COMPLETION, SRV_LLAMA };
enum srv_state { SRV_QUEUED, SRV_RUNNING, SRV_DONE };

/* What a request asks for, validated. */
struct srv_params {
  enum srv_kind kind;
  bool stream, include_usage, cache_prompt;
  int64_t max_tokens;                    /* -1: until end of generation or context */
  bool max_tokens_default;               /* max_tokens is the default, not the request's */
  struct srv_sampling {
    double temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
  } sampling;
  char *stop[SRV_MAX_STOP];
  int n_stop;
  int32_t *prompt;
  int32_t n_prompt;
};

struct srv_request {
  struct srv_params p;
  char id[40];
  long long created;
  /* progress: under the server mutex */
  enum srv_state state;
  bool cancel;               /* the client left, or the server stops */
  int slot;
  char *text;                /* generated text, valid UTF-8 */
  size_t n_text, cap_text;
  size_t n_released;         /* bytes of text no stop string can take back */
  int32_t n_gen, n_cached;
  const char *finish;        /* "stop", "length", "cancelled"; NULL while running */
  const char *stop_type;     /* /completion: "eos", "word", "limit", "none" */
  char stopping_word[256];
  int err_status;            /* 0, or the HTTP status of a failure */
  char err_msg[512];
  double t_queued, t_start, t_first, t_end; /* seconds, CLOCK_MONOTONIC */
  int refs;
};

struct srv_slot {
  struct srv_request *req;   /* NULL: idle */
  tsr_sampler *smp;
  tsr_text_stream *text;     /* the reply's text, whole characters at a time */
  int32_t n_prompt_done;     /* prompt tokens the cache holds */
  int32_t next_token;        /* sampled, to be evaluated next step; -1 none */
  int32_t n_cached;          /* tokens the sequence holds (for /slots) */
};

struct srv_metrics {
  uint64_t requests, failed, prompt_tokens, generated_tokens;
  uint64_t timeouts;         /* connections closed for sending headers or a body too slowly */
  double prompt_seconds, decode_seconds;
  uint64_t kv_used, kv_total;
};

/* The profile's settings the server reads (tsr_engine_setting), once. */
struct srv_settings {
  int64_t context, batch;
  int32_t parallel, port, header_timeout, body_timeout, client_connections;
  char host[256], api_key_env[256];
  const char *api_key_env_where; /* the engine's: where the profile set it */
  char *cors_origins;        /* NULL: none */
  struct srv_sampling sampling; /* its seed unused: seed is the default's */
  int64_t seed;                 /* -1: a fresh seed per request */
  int32_t max_tokens;
};

struct srv {
  struct tsr_server_options opt;
  tsr_engine *e;
  struct srv_settings cfg;
  int32_t n_vocab, n_slots, n_ctx_slot, n_batch;
  int32_t max_draft;         /* > 0: the profile's speculator drafts a lone decoder's steps */
  char model_id[256];
  char *composition;         /* the engine's description (/props), made at start */
  const char *api_key;
  pthread_mutex_t mu;
  pthread_cond_t work;       /* the scheduler waits for requests */
  pthread_cond_t progress;   /* connections wait for text or the end */
  struct srv_request **queue;
  int n_queue;
  struct srv_slot slots[SRV_MAX_SLOTS];
  bool stopping, sched_exit, sched_running;
  uint64_t next_id;
  int n_live;                /* requests queued or answered that are not freed yet */
  int n_answering;           /* whole answers made but not yet sent (freed before they are) */
  struct srv_metrics m;
  pthread_t sched;
  struct srv_step *step;     /* scheduler scratch */
  float *logits;
  /* connection deadlines (server_http.c): their own lock, taken without s->mu */
  pthread_mutex_t watch_mu;
  pthread_cond_t watch_wake;
  pthread_t watchdog;
  bool watchdog_running, watchdog_stop;
  struct srv_watch *watches;
};

double srv_now(void);

/* ---- header checks (server_policy.c) ---- */
/* The value for Access-Control-Allow-Origin when origin is in list (comma-separated,
** case-insensitive; "*": any), else NULL (no origin, no list, or not listed). */
const char *srv_allowed_origin(const char *list, const char *origin);
/* Whether origin is the server's own as the browser reached it: "http://" + the Host
** header, where the host is an IP literal or localhost (a DNS name could be an
** attacker's, rebound to this address). */
bool srv_same_origin(const char *origin, const char *host);
/* Whether a Content-Type (NULL: none) declares JSON; if not, msg says what is wrong.
** Browsers send other types, or none, without a preflight: requiring JSON makes them ask. */
bool srv_json_content_type(const char *type, char *msg, size_t cap);
/* Whether an Authorization header carries key (NULL key: none needed). */
bool srv_bearer_ok(const char *authorization, const char *key);
/* What the headers say about where the body ends (RFC 9112 6.1-6.3): fed one header
** at a time. */
struct srv_framing {
  int n_length, n_coding;
  bool lengths_differ, unknown_coding;
  char length[32], coding[64];
};
void srv_framing_add(struct srv_framing *f, const char *key, const char *value);
/* A request whose body boundary the server would have to guess, which is how requests
** are smuggled past a proxy: 400 for Content-Length headers that disagree or that come
** with a Transfer-Encoding, 501 for a transfer coding other than chunked (msg says
** which); else 0. */
int srv_framing_error(const struct srv_framing *f, char *msg, size_t cap);

/* ---- scheduler (server_sched.c) ---- */
tsr_status srv_sched_start(struct srv *s);
void srv_sched_stop(struct srv *s);
/* Queues r (the queue takes a reference). 503 when busy or stopping: returns
** the status and fills msg/code. */
int srv_submit(struct srv *s, struct srv_request *r, const char **code, char *msg, size_t cap);
/* Drops one reference (under the mutex). */
void srv_request_unref(struct srv *s, struct srv_request *r);
/* Cancels every request; the scheduler finishes them as "cancelled". */
void srv_cancel_all(struct srv *s);

/* ---- JSON API (server_api.c) ---- */
/* Parses and validates a generation request of kind k; 0 and *out set, or the
** HTTP status with msg (and param naming the field, or NULL). */
int srv_parse_request(struct srv *s, enum srv_kind k, const char *body, size_t len,
                      struct srv_request **out, char *msg, size_t cap, const char **param,
                      const char **code);
void srv_request_free(struct srv_request *r);
/* Response bodies (malloc'd): the whole answer, a stream chunk for new text,
** the final stream chunks, an error object. */
char *srv_render_result(const struct srv *s, const struct srv_request *r);
char *srv_render_chunk(const struct srv *s, const struct srv_request *r, const char *text,
                       size_t len, bool first);
char *srv_render_final(const struct srv *s, const struct srv_request *r);
char *srv_render_error(int status, const char *msg, const char *param, const char *code);
char *srv_render_models(const struct srv *s);
/* /props: the model, slots, their context and the composition (the chat page shows it) */
char *srv_render_props(const struct srv *s);
/* more: rows appended as they are (the plugins' counters), or NULL */
char *srv_render_metrics(struct srv *s, const char *more);
char *srv_render_slots(struct srv *s);
/* /tokenize and /detokenize: 0 and *out, or a status with msg. */
int srv_tokenize(const struct srv *s, const char *body, size_t len, char **out, char *msg,
                 size_t cap, const char **param);
int srv_detokenize(const struct srv *s, const char *body, size_t len, char **out, char *msg,
                   size_t cap, const char **param);

/* chat.html, compiled in (embed_page.py writes chat_page.c) */
extern const char srv_chat_page[];
extern const size_t srv_chat_page_len;

/* A sampler for p (the request's settings, validated by the sampler itself). */
tsr_status srv_sampler_open(const struct srv *s, const struct srv_sampling *p, tsr_sampler **out);

/* Appends len bytes as valid UTF-8 (an invalid byte or a NUL becomes U+FFFD). */
bool srv_text_append(struct srv_request *r, const char *bytes, size_t len);

#endif
