/*
** HTTP for tessera serve (libmicrohttpd, one thread per connection).
**
** A body is collected up to --max-body (then 413). Generation requests are
** parsed and queued; a non-streaming one waits in its connection thread for
** the result, a streaming one answers with a reader callback that waits for
** new text and writes server-sent events. Both watch the socket while they
** wait, so a client that hangs up cancels its request at the scheduler's
** next step. SIGINT/SIGTERM: stop accepting, cancel everything, drain, free.
*/
#define _GNU_SOURCE /* POLLRDHUP */
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "server_internal.h"
#include "../cli/cli.h"

struct conn {
  char *body;
  size_t len, cap;
  bool too_large;
  bool answering; /* counted in s->n_answering until MHD has sent the answer */
};

/* A streaming response: the request, and the bytes made but not yet sent. */
struct stream {
  struct srv *s;
  struct srv_request *r;
  MHD_socket fd;
  char *out;
  size_t n_out, off;
  size_t sent;    /* bytes of r->text already made into events */
  bool started, ended;
};

/* ---- helpers ---- */


/* The plugins' counters as /metrics rows (a decode policy's per layer kind:
** full.v_rows_skipped, ...); a name that is not label-safe is left out. */
#define SRV_METRICS_MAX_COUNTERS 128
struct metrics_rows {
  char *out;
  size_t len, cap;
  int n;
};

static bool label_safe(const char *s) {
  for (; *s; s++)
    if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '.' || *s == '-')) return false;
  return true;
}

static void metrics_counter(void *ctx, const char *plugin, const char *counter, uint64_t v) {
  struct metrics_rows *m = ctx;
  if (m->n >= SRV_METRICS_MAX_COUNTERS || !label_safe(plugin) || !label_safe(counter)) return;
  m->n++;
  m->len += (size_t)snprintf(m->out + m->len, m->cap - m->len,
                             "tessera_plugin_counter{plugin=\"%s\",counter=\"%s\"} %llu\n",
                             plugin, counter, (unsigned long long)v);
}

static char *plugin_counters(struct srv *s) {
  struct metrics_rows m = {.cap = 512 + 160 * SRV_METRICS_MAX_COUNTERS};
  if (!(m.out = malloc(m.cap))) return NULL;
  m.len = (size_t)snprintf(m.out, m.cap, "# HELP tessera_plugin_counter what each plugin "
                           "counted doing\n# TYPE tessera_plugin_counter counter\n");
  tsr_engine_counters(s->e, metrics_counter, &m);
  return m.out;
}

static const char *allowed_origin(const struct srv *s, struct MHD_Connection *c) {
  return srv_allowed_origin(s->cfg.cors_origins,
                            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"));
}

static void add_cors_headers(const struct srv *s, struct MHD_Connection *c,
                             struct MHD_Response *r) {
  const char *allow = allowed_origin(s, c);
  if (!allow) return;
  MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
  MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result respond(const struct srv *s, struct MHD_Connection *c, int status,
                               char *body, const char *type) {
  if (!body) {
    status = 500;
    body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    if (!body) return MHD_NO;
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
  add_cors_headers(s, c, r);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result respond_json(const struct srv *s, struct MHD_Connection *c, int status,
                                    char *body) {
  return respond(s, c, status, body, "application/json");
}

static enum MHD_Result respond_error(const struct srv *s, struct MHD_Connection *c, int status,
                                     const char *msg, const char *param, const char *code) {
  return respond_json(s, c, status, srv_render_error(status, msg, param, code));
}

static void count_refused(struct srv *s) {
  pthread_mutex_lock(&s->mu);
  s->m.requests++;
  s->m.failed++;
  pthread_mutex_unlock(&s->mu);
}

/* Whether the client has left. TCP cannot tell a client that closed from one
** that only shut down its sending side (a half-close) until the server writes:
** a closed one then answers with a reset. With eof_is_gone an end of the
** client's data counts as leaving (a request that has written nothing yet);
** without it only a reset or an error does (a stream, whose headers went out). */
static bool client_gone(MHD_socket fd, bool eof_is_gone) {
  if (fd == MHD_INVALID_SOCKET) return false;
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLRDHUP) return eof_is_gone;
  char b;
  ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return eof_is_gone;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static MHD_socket conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return i ? i->connect_fd : MHD_INVALID_SOCKET;
}

/* Waits (under the mutex) up to 100 ms for progress. */
static void wait_progress(struct srv *s) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 100 * 1000 * 1000;
  if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
  pthread_cond_timedwait(&s->progress, &s->mu, &ts);
}

/* ---- streaming ---- */

static bool out_append(struct stream *st, const char *a, const char *b, const char *c) {
  size_t la = strlen(a), lb = b ? strlen(b) : 0, lc = strlen(c);
  char *grown = realloc(st->out, st->n_out + la + lb + lc + 1);
  if (!grown) return false;
  st->out = grown;
  memcpy(st->out + st->n_out, a, la);
  if (lb) memcpy(st->out + st->n_out + la, b, lb);
  memcpy(st->out + st->n_out + la + lb, c, lc);
  st->n_out += la + lb + lc;
  return true;
}

/* Makes the next events (under the mutex): new text, or the end. */
static bool make_events(struct stream *st) {
  struct srv_request *r = st->r;
  bool ok = true;
  if (r->n_released > st->sent || (!st->started && r->p.kind == SRV_CHAT)) {
    char *ev = srv_render_chunk(st->s, r, r->text ? r->text + st->sent : "",
                                r->n_released - st->sent, !st->started);
    ok = ev && out_append(st, "data: ", ev, "\n\n");
    free(ev);
    st->sent = r->n_released;
    st->started = true;
  }
  if (ok && r->state == SRV_DONE) {
    char *fin = srv_render_final(st->s, r);
    ok = fin && out_append(st, "", fin, "");
    free(fin);
    st->ended = true;
  }
  return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  struct stream *st = cls;
  struct srv *s = st->s;
  while (st->off == st->n_out) {
    if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    st->off = st->n_out = 0;
    pthread_mutex_lock(&s->mu);
    while (st->r->state != SRV_DONE && st->r->n_released == st->sent &&
           (st->started || st->r->p.kind != SRV_CHAT)) {
      if (client_gone(st->fd, false)) {
        st->r->cancel = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
      wait_progress(s);
    }
    bool ok = make_events(st);
    pthread_mutex_unlock(&s->mu);
    if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  size_t n = st->n_out - st->off < max ? st->n_out - st->off : max;
  memcpy(buf, st->out + st->off, n);
  st->off += n;
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  struct stream *st = cls;
  pthread_mutex_lock(&st->s->mu);
  if (st->r->state != SRV_DONE) {
    st->r->cancel = true; /* the connection ended before the request did */
    pthread_cond_signal(&st->s->work);
  }
  srv_request_unref(st->s, st->r);
  pthread_mutex_unlock(&st->s->mu);
  free(st->out);
  free(st);
}

static enum MHD_Result respond_stream(struct srv *s, struct MHD_Connection *c,
                                      struct srv_request *r) {
  struct stream *st = calloc(1, sizeof *st);
  if (!st) {
    pthread_mutex_lock(&s->mu);
    r->cancel = true;
    srv_request_unref(s, r);
    pthread_mutex_unlock(&s->mu);
    return respond_error(s, c, 500, "out of memory", NULL, NULL);
  }
  *st = (struct stream){.s = s, .r = r, .fd = conn_fd(c)};
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
  if (!resp) {
    stream_free(st);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", "text/event-stream");
  MHD_add_response_header(resp, "Cache-Control", "no-cache");
  add_cors_headers(s, c, resp);
  enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* ---- generation ---- */

static enum MHD_Result generate(struct srv *s, struct MHD_Connection *c, enum srv_kind k,
                                const struct conn *cn) {
  char msg[1024];
  const char *param = NULL, *code = NULL;
  struct srv_request *r = NULL;
  int status = srv_parse_request(s, k, cn->body ? cn->body : "", cn->len, &r, msg, sizeof msg,
                                 &param, &code);
  if (status) {
    count_refused(s);
    return respond_error(s, c, status, msg, param, code);
  }
  pthread_mutex_lock(&s->mu);
  snprintf(r->id, sizeof r->id, "%s-%llx", k == SRV_CHAT ? "chatcmpl" : "cmpl",
           (unsigned long long)++s->next_id);
  pthread_mutex_unlock(&s->mu);
  status = srv_submit(s, r, &code, msg, sizeof msg);
  if (status) {
    count_refused(s);
    srv_request_free(r);
    return respond_error(s, c, status, msg, NULL, code);
  }
  if (r->p.stream) return respond_stream(s, c, r); /* it takes the connection's reference */
  /* wait here (this connection's own thread), watching the client */
  MHD_socket fd = conn_fd(c);
  bool left = false;
  pthread_mutex_lock(&s->mu);
  while (r->state != SRV_DONE) {
    if (!r->cancel && client_gone(fd, true)) {
      r->cancel = left = true;
      pthread_cond_signal(&s->work);
    }
    wait_progress(s);
  }
  char *body = NULL;
  if (r->err_status) {
    status = r->err_status;
    body = srv_render_error(status, r->err_msg, NULL, NULL);
  } else if (!strcmp(r->finish, "cancelled") && left) {
    /* read only by a client that half-closed: it learns why */
    status = 400;
    body = srv_render_error(400, "the client shut down its sending side before the answer was "
                            "ready, which the server takes as leaving (TCP cannot tell it from "
                            "a close); keep the connection open, or ask for a stream", NULL,
                            "client_closed");
  } else if (!strcmp(r->finish, "cancelled")) {
    status = 503;
    body = srv_render_error(503, "the server is shutting down; the request was cancelled", NULL,
                            "shutting_down");
  } else {
    status = 200;
    body = srv_render_result(s, r);
  }
  srv_request_unref(s, r);
  pthread_mutex_unlock(&s->mu);
  return respond_json(s, c, status, body);
}

/* ---- connection deadlines ----------------------------------------------------- */

/* A connection's deadline for its current phase: its headers (from the connection's
** start, or from the end of its previous answer), then its body. The watchdog thread
** closes a connection past its deadline, so a client trickling bytes holds it for at
** most server.header_timeout + server.body_timeout. No deadline runs while the
** server answers. */
enum watch_phase { WATCH_HEADERS, WATCH_BODY, WATCH_ANSWER, WATCH_CLOSED };

struct srv_watch {
  MHD_socket fd;
  enum watch_phase phase;
  bool kept_alive; /* a request was answered on it before */
  double deadline;
  struct srv_watch *prev, *next;
};

/* Answers 408 where a client is mid-request (the first one on the connection: a
** kept-alive connection that times out idle is closed without a word, since its
** client may be about to reuse it), then shuts the socket; the connection's thread
** sees the end and lets it go. Under watch_mu. */
static void watch_expire(struct srv_watch *w, int header_timeout, int body_timeout) {
  if (w->phase == WATCH_BODY || !w->kept_alive) {
    char body[256], msg[512];
    const int n_body = snprintf(body, sizeof body, "{\"error\":{\"message\":\"the request's %s did "
                                "not arrive within %d s (server.%s)\",\"type\":"
                                "\"invalid_request_error\",\"param\":null,\"code\":"
                                "\"request_timeout\"}}",
                                w->phase == WATCH_BODY ? "body" : "headers",
                                w->phase == WATCH_BODY ? body_timeout : header_timeout,
                                w->phase == WATCH_BODY ? "body_timeout" : "header_timeout");
    const int n = snprintf(msg, sizeof msg, "HTTP/1.1 408 Request Timeout\r\nContent-Type: "
                           "application/json\r\nConnection: close\r\nContent-Length: %d\r\n"
                           "\r\n%s", n_body, body);
    if (send(w->fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { /* best effort */ }
  }
  shutdown(w->fd, SHUT_RDWR);
  w->phase = WATCH_CLOSED;
}

static void *watchdog_main(void *arg) {
  struct srv *s = arg;
  const struct srv_settings *sv = &s->cfg;
  pthread_mutex_lock(&s->watch_mu);
  while (!s->watchdog_stop) {
    const double now = srv_now();
    double next = now + 1;
    uint64_t expired = 0;
    for (struct srv_watch *w = s->watches; w; w = w->next) {
      if (w->phase != WATCH_HEADERS && w->phase != WATCH_BODY) continue;
      if (w->deadline <= now) {
        watch_expire(w, sv->header_timeout, sv->body_timeout);
        expired++;
      } else if (w->deadline < next) {
        next = w->deadline;
      }
    }
    if (expired) { /* nothing takes watch_mu while it holds s->mu */
      pthread_mutex_lock(&s->mu);
      s->m.timeouts += expired;
      pthread_mutex_unlock(&s->mu);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double wait = next - now;
    ts.tv_sec += (time_t)wait;
    ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&s->watch_wake, &s->watch_mu, &ts);
  }
  pthread_mutex_unlock(&s->watch_mu);
  return NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  struct srv *s = cls;
  struct srv_watch *w = *socket_context;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    if (!(w = calloc(1, sizeof *w))) return; /* on_request refuses an unwatched connection */
    const struct srv_settings *sv = &s->cfg;
    *w = (struct srv_watch){.fd = conn_fd(c), .phase = WATCH_HEADERS,
                            .deadline = srv_now() + sv->header_timeout};
    pthread_mutex_lock(&s->watch_mu);
    w->next = s->watches;
    if (w->next) w->next->prev = w;
    s->watches = w;
    pthread_mutex_unlock(&s->watch_mu);
    *socket_context = w;
  } else if (w) { /* closed: MHD closes the socket after this returns */
    pthread_mutex_lock(&s->watch_mu);
    if (w->prev) w->prev->next = w->next;
    else s->watches = w->next;
    if (w->next) w->next->prev = w->prev;
    pthread_mutex_unlock(&s->watch_mu);
    free(w);
    *socket_context = NULL;
  }
}

/* Moves c's deadline to phase; false when the watchdog has closed it already (or it
** has no watch: then nothing bounds it, so it is refused). */
static bool watch_phase(struct srv *s, struct MHD_Connection *c, enum watch_phase phase) {
  const union MHD_ConnectionInfo *i =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  struct srv_watch *w = i ? i->socket_context : NULL;
  if (!w) return false;
  const struct srv_settings *sv = &s->cfg;
  pthread_mutex_lock(&s->watch_mu);
  const bool open = w->phase != WATCH_CLOSED;
  if (open) {
    if (phase == WATCH_HEADERS) w->kept_alive = true;
    w->phase = phase;
    w->deadline = srv_now() + (phase == WATCH_BODY ? sv->body_timeout : sv->header_timeout);
    pthread_cond_signal(&s->watch_wake);
  }
  pthread_mutex_unlock(&s->watch_mu);
  return open;
}

static tsr_status watchdog_start(struct srv *s) {
  if (pthread_create(&s->watchdog, NULL, watchdog_main, s))
    return tsr_error_set(TSR_ERR_INTERNAL, "cannot start the connection watchdog thread");
  s->watchdog_running = true;
  return TSR_OK;
}

static void watchdog_stop(struct srv *s) {
  pthread_mutex_lock(&s->watch_mu);
  s->watchdog_stop = true;
  pthread_cond_signal(&s->watch_wake);
  pthread_mutex_unlock(&s->watch_mu);
  pthread_join(s->watchdog, NULL);
  s->watchdog_running = false;
}

/* ---- routing ---- */

static bool authorized(const struct srv *s, struct MHD_Connection *c) {
  return srv_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                       s->api_key);
}

/* OPTIONS: a browser's preflight, answered for an allowed origin (checked before);
** for a client that is not a browser, which methods the path takes. */
static enum MHD_Result preflight(const struct srv *s, struct MHD_Connection *c,
                                 const char *method) {
  struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  char methods[32];
  snprintf(methods, sizeof methods, "%s%s, OPTIONS", method, strcmp(method, "GET") ? "" : ", HEAD");
  MHD_add_response_header(r, "Allow", methods);
  if (allowed_origin(s, c)) {
    add_cors_headers(s, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
  }
  enum MHD_Result ret = MHD_queue_response(c, 204, r);
  MHD_destroy_response(r);
  return ret;
}

/* GET /health: ok, or 503 while the server stops. */
static enum MHD_Result health(struct srv *s, struct MHD_Connection *c) {
  pthread_mutex_lock(&s->mu);
  const char *state = s->stopping ? "shutting_down" : "ok";
  pthread_mutex_unlock(&s->mu);
  char body[64];
  snprintf(body, sizeof body, "{\"status\":\"%s\"}", state);
  return respond_json(s, c, strcmp(state, "ok") ? 503 : 200, strdup(body));
}

/* The chat page (chat.html, compiled in): static, so served without a key; it asks for
** one when the server wants it. Framing and inline scripts are its own only. */
static enum MHD_Result chat_page(struct MHD_Connection *c) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      srv_chat_page_len, (void *)srv_chat_page, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'self'; script-src 'unsafe-inline'; style-src "
                          "'unsafe-inline'; frame-ancestors 'none'");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result route(struct srv *s, struct MHD_Connection *c, const char *url,
                             const char *method, const struct conn *cn) {
  static const struct { const char *path, *method; } routes[] = {
      {"/health", "GET"},         {"/v1/models", "GET"},  {"/metrics", "GET"},
      {"/slots", "GET"},          {"/tokenize", "POST"}, {"/detokenize", "POST"},
      {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/completion", "POST"},
      {"/props", "GET"},          {"/", "GET"}};
  enum { ROUTE_PROPS = 9, ROUTE_PAGE = 10 };
  int found = -1;
  for (size_t i = 0; i < sizeof routes / sizeof *routes && found < 0; i++)
    if (!strcmp(url, routes[i].path)) found = (int)i;
  char msg[1024];
  if (found < 0 || (found == ROUTE_PAGE && !s->opt.chat_page)) {
    snprintf(msg, sizeof msg, "no endpoint %s %s%s", method, url,
             found == ROUTE_PAGE ? " (the chat page is off: --no-chat-page)" : "");
    return respond_error(s, c, 404, msg, NULL, NULL);
  }
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  /* the chat page calls from the server's own origin */
  const bool own = s->opt.chat_page &&
                   srv_same_origin(origin, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"));
  if (origin && !own && !allowed_origin(s, c)) {
    /* a web page may not drive the server unless the profile names its origin */
    snprintf(msg, sizeof msg, "requests from origin '%s' are not allowed (server.cors_origins "
             "lists the origins a browser may call from)", origin);
    return respond_error(s, c, 403, msg, NULL, "origin_not_allowed");
  }
  if (!strcmp(method, "OPTIONS")) return preflight(s, c, routes[found].method);
  /* HEAD is GET without the body (MHD leaves it out) */
  const bool head = !strcmp(method, "HEAD") && !strcmp(routes[found].method, "GET");
  if (!head && strcmp(method, routes[found].method)) {
    snprintf(msg, sizeof msg, "%s takes %s, not %s", url, routes[found].method, method);
    return respond_error(s, c, 405, msg, NULL, "method_not_allowed");
  }
  if (found == 0) return health(s, c);
  if (found == ROUTE_PAGE) return chat_page(c);
  if (!authorized(s, c))
    return respond_error(s, c, 401, "invalid or missing API key (Authorization: Bearer KEY)", NULL,
                         "invalid_api_key");
  if (!strcmp(method, "POST") &&
      !srv_json_content_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
                             msg, sizeof msg))
    return respond_error(s, c, 415, msg, NULL, "unsupported_media_type");
  if (cn->too_large) {
    snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes",
             s->opt.max_body);
    return respond_error(s, c, 413, msg, NULL, "request_too_large");
  }
  const char *param = NULL;
  char *out = NULL;
  int st;
  switch (found) {
    case 1: return respond_json(s, c, 200, srv_render_models(s));
    case 2: {
      char *counters = plugin_counters(s);
      char *body = srv_render_metrics(s, counters);
      free(counters);
      return respond(s, c, 200, body, "text/plain; version=0.0.4");
    }
    case 3: return respond_json(s, c, 200, srv_render_slots(s));
    case ROUTE_PROPS: return respond_json(s, c, 200, srv_render_props(s));
    case 4:
    case 5:
      st = (found == 4 ? srv_tokenize : srv_detokenize)(s, cn->body ? cn->body : "", cn->len,
                                                         &out, msg, sizeof msg, &param);
      return st ? respond_error(s, c, st, st == 500 ? "out of memory" : msg, param, NULL)
                : respond_json(s, c, 200, out);
    default:
      return generate(s, c, found == 6 ? SRV_CHAT : found == 7 ? SRV_COMPLETION : SRV_LLAMA, cn);
  }
}

/* ---- request framing --------------------------------------------------------- */

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
  (void)kind;
  srv_framing_add(cls, key, value);
  return MHD_YES;
}

static int framing_error(struct MHD_Connection *c, char *msg, size_t cap) {
  struct srv_framing f = {0};
  MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
  return srv_framing_error(&f, msg, cap);
}

static void count_answering(struct srv *s, struct conn *cn) {
  pthread_mutex_lock(&s->mu);
  s->n_answering++;
  cn->answering = true;
  pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *size, void **con_cls) {
  (void)version;
  struct srv *s = cls;
  struct conn *cn = *con_cls;
  if (!cn) { /* headers only so far */
    if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
    *con_cls = cn;
    if (!watch_phase(s, c, WATCH_BODY)) return MHD_NO; /* past its header deadline */
    char msg[160];
    const int status = framing_error(c, msg, sizeof msg);
    if (!status) return MHD_YES;
    watch_phase(s, c, WATCH_ANSWER);
    /* answered before any body is read; the connection closes after it */
    count_refused(s);
    count_answering(s, cn);
    return respond_error(s, c, status, msg, NULL, status == 501 ? "not_implemented" : NULL);
  }
  if (*size) { /* a piece of the body */
    if (!cn->too_large && cn->len + *size > s->opt.max_body) {
      cn->too_large = true;
      free(cn->body);
      cn->body = NULL;
      cn->len = cn->cap = 0;
    }
    if (!cn->too_large) {
      if (cn->len + *size + 1 > cn->cap) {
        size_t cap = cn->cap ? cn->cap : 4096;
        while (cap < cn->len + *size + 1) cap *= 2;
        char *grown = realloc(cn->body, cap);
        if (!grown) return MHD_NO;
        cn->body = grown;
        cn->cap = cap;
      }
      memcpy(cn->body + cn->len, data, *size);
      cn->len += *size;
      cn->body[cn->len] = 0;
    }
    *size = 0;
    return MHD_YES;
  }
  /* every answer, errors and streams too, is counted until MHD has sent it
  ** (on_completed): a shutdown waits for it, where stopping the daemon first would
  ** close the connection unanswered */
  if (!watch_phase(s, c, WATCH_ANSWER)) return MHD_NO; /* past its body deadline */
  count_answering(s, cn);
  return route(s, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)toe;
  struct conn *cn = *con_cls;
  if (!cn) return;
  watch_phase(cls, c, WATCH_HEADERS); /* a next request on this connection, or its idle end */
  if (cn->answering) {
    struct srv *s = cls;
    pthread_mutex_lock(&s->mu);
    s->n_answering--;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
  }
  free(cn->body);
  free(cn);
  *con_cls = NULL;
}

/* ---- the server ---- */

static void model_id(struct srv *s, const char *path) {
  const char *base = strrchr(path, '/');
  const char *id = s->opt.alias ? s->opt.alias : base ? base + 1 : path;
  size_t n = strlen(id) < sizeof s->model_id - 1 ? strlen(id) : sizeof s->model_id - 1;
  memcpy(s->model_id, id, n);
  s->model_id[n] = 0;
}

/* The profile's value of key: text into buf, or parsed into *i (i != NULL) or *d. */
static tsr_status setting(struct srv *s, const char *key, char *buf, size_t cap, int64_t *i,
                          double *d) {
  char *v = NULL;
  tsr_status st = tsr_engine_setting(s->e, key, &v, NULL);
  if (st != TSR_OK) return st;
  if (buf) snprintf(buf, cap, "%s", v);
  char *end = v;
  if (i) *i = strtoll(v, &end, 10);
  if (d) *d = strtod(v, &end);
  const bool bad = (i || d) && (end == v || *end);
  tsr_free(v);
  return bad ? tsr_error_set(TSR_ERR_INTERNAL, "setting %s is not a number", key) : TSR_OK;
}

static tsr_status read_settings(struct srv *s) {
  struct srv_settings *c = &s->cfg;
  struct {
    const char *key;
    int64_t *i64;
    int32_t *i32;
    double *d;
  } nums[] = {{"context", &c->context, NULL, NULL}, {"batch", &c->batch, NULL, NULL},
              {"server.parallel", NULL, &c->parallel, NULL},
              {"server.port", NULL, &c->port, NULL},
              {"server.header_timeout", NULL, &c->header_timeout, NULL},
              {"server.body_timeout", NULL, &c->body_timeout, NULL},
              {"server.client_connections", NULL, &c->client_connections, NULL},
              {"sampling.temperature", NULL, NULL, &c->sampling.temperature},
              {"sampling.top_p", NULL, NULL, &c->sampling.top_p},
              {"sampling.min_p", NULL, NULL, &c->sampling.min_p},
              {"sampling.top_k", NULL, &c->sampling.top_k, NULL},
              {"sampling.max_tokens", NULL, &c->max_tokens, NULL}};
  tsr_status st = TSR_OK;
  for (size_t k = 0; k < sizeof nums / sizeof *nums && st == TSR_OK; k++) {
    int64_t v = 0;
    st = setting(s, nums[k].key, NULL, 0, nums[k].d ? NULL : &v, nums[k].d);
    if (nums[k].i64) *nums[k].i64 = v;
    if (nums[k].i32) *nums[k].i32 = (int32_t)v;
  }
  char cors[4096];
  if (st == TSR_OK) st = setting(s, "sampling.seed", NULL, 0, &c->seed, NULL);
  if (st == TSR_OK) st = setting(s, "server.host", c->host, sizeof c->host, NULL, NULL);
  char *key_env = NULL; /* and where it was set, for the message when it is not in the env */
  if (st == TSR_OK &&
      (st = tsr_engine_setting(s->e, "server.api_key_env", &key_env, &c->api_key_env_where)) ==
          TSR_OK)
    snprintf(c->api_key_env, sizeof c->api_key_env, "%s", key_env);
  tsr_free(key_env);
  if (st == TSR_OK) st = setting(s, "server.cors_origins", cors, sizeof cors, NULL, NULL);
  if (st == TSR_OK && cors[0] && !(c->cors_origins = strdup(cors)))
    st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  return st;
}

static tsr_status open_engine(struct srv *s) {
  tsr_status st = tsr_engine_open(s->opt.profile, s->opt.model, s->opt.sets, s->opt.n_sets, &s->e);
  if (st == TSR_OK) st = read_settings(s);
  if (st != TSR_OK) return st;
  const struct srv_settings *c = &s->cfg;
  s->n_vocab = tsr_engine_n_vocab(s->e);
  s->n_slots = c->parallel > 0 ? c->parallel : 1;
  if (s->n_slots > SRV_MAX_SLOTS)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%d slots: at most %d", s->n_slots, SRV_MAX_SLOTS);
  s->n_ctx_slot = (int32_t)(c->context / s->n_slots);
  s->n_batch = c->batch > 0 ? (int32_t)c->batch : 512;
  s->max_draft = tsr_engine_max_draft(s->e);
  if (s->max_draft > SRV_MAX_DRAFT) s->max_draft = SRV_MAX_DRAFT;
  s->m.kv_total = (uint64_t)c->context;
  if (s->n_ctx_slot < 2)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "context %lld over %d slots leaves %d positions "
                         "per slot", (long long)c->context, s->n_slots, s->n_ctx_slot);
  const char *tmpl = NULL, *source = NULL;
  st = tsr_chat_template_choose(s->e, s->opt.chat_template, &tmpl, &source);
  if (st != TSR_OK)
    return tsr_error_set(st, "%s (choose one with --chat-template chatml|gemma|gemma4)",
                         tsr_error_message());
  for (int i = 0; i < s->n_slots && st == TSR_OK; i++)
    st = tsr_text_stream_open(s->e, &s->slots[i].text);
  if (st != TSR_OK) return st;
  if (!s->opt.host) s->opt.host = c->host;
  if (s->opt.port < 0) s->opt.port = c->port;
  if (!s->opt.api_key && c->api_key_env[0]) {
    s->api_key = getenv(c->api_key_env);
    if (!s->api_key || !*s->api_key)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: server.api_key_env names %s, which is not "
                           "set", c->api_key_env_where, c->api_key_env);
  } else {
    s->api_key = s->opt.api_key;
  }
  model_id(s, tsr_engine_model_path(s->e));
  if ((st = tsr_engine_describe(s->e, &s->composition)) != TSR_OK) return st;
  fprintf(stderr, "tessera serve: %s (%s), %d slots of %d positions, batch %d, chat template "
          "%s (%s)\n", tsr_engine_model_path(s->e), tsr_engine_arch(s->e), s->n_slots,
          s->n_ctx_slot, s->n_batch, tmpl, source);
  return TSR_OK;
}

/* NULL with the error set and *st its status. */
static struct MHD_Daemon *listen_on(struct srv *s, struct sockaddr_storage *addr,
                                    tsr_status *st) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", s->opt.port);
  int rc = getaddrinfo(s->opt.host, port, &hints, &ai);
  if (rc || !ai) {
    *st = tsr_error_set(TSR_ERR_INVALID_ARG, "host %s: %s", s->opt.host, gai_strerror(rc));
    return NULL;
  }
  memcpy(addr, ai->ai_addr, ai->ai_addrlen);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                   MHD_USE_POLL | MHD_USE_ITC;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  freeaddrinfo(ai);
  const unsigned limit = (unsigned)(s->n_slots + s->opt.queue + 32);
  const int32_t per_client_set = s->cfg.client_connections;
  const unsigned per_client = per_client_set > 0 ? (unsigned)per_client_set : (limit + 1) / 2;
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)addr,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
      s, MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,
      MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
  if (!d)
    *st = tsr_error_set(TSR_ERR_IO, "cannot listen on %s port %d: %s", s->opt.host, s->opt.port,
                  errno ? strerror(errno) : "libmicrohttpd refused");
  return d;
}

int tsr_server_run(const struct tsr_server_options *opt) {
  /* signals are taken by sigwait here, never delivered to another thread */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);

  struct srv *s = calloc(1, sizeof *s);
  if (!s) {
    fprintf(stderr, "tessera serve: out of memory\n");
    return TSR_EXIT_RUNTIME;
  }
  s->opt = *opt;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work, NULL);
  pthread_cond_init(&s->progress, NULL);
  pthread_mutex_init(&s->watch_mu, NULL);
  pthread_condattr_t monotonic;
  pthread_condattr_init(&monotonic);
  pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
  pthread_cond_init(&s->watch_wake, &monotonic);
  pthread_condattr_destroy(&monotonic);
  int code = TSR_EXIT_OK;
  struct MHD_Daemon *d = NULL;
  tsr_status st = open_engine(s);
  if (st == TSR_OK) st = srv_sched_start(s);
  if (st == TSR_OK) st = watchdog_start(s);
  struct sockaddr_storage addr;
  if (st == TSR_OK) d = listen_on(s, &addr, &st);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera serve: %s\n", tsr_error_message());
    code = st == TSR_ERR_INVALID_ARG || st == TSR_ERR_FORMAT || st == TSR_ERR_UNSUPPORTED
               ? TSR_EXIT_USAGE
               : TSR_EXIT_RUNTIME;
  } else {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "tessera serve: listening on http://%s:%u\n", s->opt.host,
            info ? info->port : (unsigned)s->opt.port);
    int sig = 0;
    while (sigwait(&sigs, &sig) == 0 && sig == SIGPIPE) continue;
    fprintf(stderr, "tessera serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    MHD_socket listener = MHD_quiesce_daemon(d); /* no new connections */
    srv_cancel_all(s);
    /* the scheduler finishes what was in flight as cancelled and each
    ** connection writes its last bytes; a client that reads nothing more
    ** is not waited for longer than 10 s */
    pthread_mutex_lock(&s->mu);
    for (double t0 = srv_now(); (s->n_live > 0 || s->n_answering > 0) && srv_now() - t0 < 10;)
      wait_progress(s);
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(d); /* joins the connection threads */
    if (listener != MHD_INVALID_SOCKET) close(listener);
    d = NULL;
  }
  if (d) MHD_stop_daemon(d);
  if (s->watchdog_running) watchdog_stop(s);
  if (s->sched_running) srv_sched_stop(s);
  for (int i = 0; i < SRV_MAX_SLOTS; i++) tsr_text_stream_close(s->slots[i].text);
  free(s->cfg.cors_origins);
  tsr_free(s->composition);
  tsr_engine_close(s->e);
  pthread_cond_destroy(&s->watch_wake);
  pthread_mutex_destroy(&s->watch_mu);
  pthread_cond_destroy(&s->progress);
  pthread_cond_destroy(&s->work);
  pthread_mutex_destroy(&s->mu);
  free(s);
  if (code == TSR_EXIT_OK) fprintf(stderr, "tessera serve: stopped\n");
  return code;
}
