/*
** The embedding API (tessera/tessera.h) through libtessera.so, on the embedded
** default model: built with the public header only (no core include path), so
** it also proves the library exports what the header declares.
*/
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include <tessera/tessera.h>

#include "harness.h"

static tsr_engine *g_e; /* two sequences: seq copies and log-probs against eval */

static tsr_engine *open_default(void) {
  const char *sets[] = {"server.parallel=2", "context=1024"};
  tsr_engine *e = NULL;
  CHECK_OK(tsr_engine_open(NULL, NULL, sets, 2, &e));
  return e;
}

static int32_t argmax(const float *v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

static int32_t *tokens_of(const char *text, size_t *n) {
  int32_t *t = NULL;
  CHECK_OK(tsr_tokenize(g_e, text, strlen(text), TSR_TOKENIZE_ADD_SPECIAL, &t, n));
  return t;
}

static void test_open_describe_and_settings(void) {
  char *text = NULL;
  CHECK_OK(tsr_engine_describe(g_e, &text));
  CHECK(text && strstr(text, "# resolved profile") && strstr(text, "\nmodel: ") &&
        strstr(text, "context: 1024"));
  tsr_free(text);
  CHECK(tsr_engine_n_vocab(g_e) > 1000 && tsr_engine_n_ctx(g_e) == 1024 &&
        tsr_engine_n_seq(g_e) == 2);
  CHECK(!strcmp(tsr_engine_arch(g_e), "qwen3") && strstr(tsr_engine_model_path(g_e), ".gguf"));
  CHECK(tsr_engine_has_plugin(g_e, "arch_qwen") && !tsr_engine_has_plugin(g_e, "no_such"));
  char *v = NULL;
  const char *where = NULL;
  CHECK_OK(tsr_engine_setting(g_e, "context", &v, &where));
  CHECK(v && !strcmp(v, "1024") && where && strstr(where, "--set"));
  tsr_free(v);
  CHECK_OK(tsr_engine_setting(g_e, "server.api_key_env", &v, NULL));
  CHECK(v && !strcmp(v, "")); /* unset optional string */
  tsr_free(v);
  CHECK_ERR_HAS(tsr_engine_setting(g_e, "kv", &v, NULL), "'kv'");  /* a section */
  CHECK_ERR_HAS(tsr_engine_setting(g_e, "sampling.nope", &v, NULL), "sampling.nope");
  CHECK(v == NULL);
}

static void test_open_refusals_name_what_is_wrong(void) {
  tsr_engine *e = (tsr_engine *)1;
  CHECK_ERR_HAS(tsr_engine_open("/nonexistent/profile.yaml", NULL, NULL, 0, &e), "profile.yaml");
  CHECK(e == NULL);
  const char *bad[] = {"context=abc"};
  CHECK_ERR_HAS(tsr_engine_open(NULL, NULL, bad, 1, &e), "context");
  CHECK_ERR_HAS(tsr_engine_open(NULL, "/nonexistent/model.gguf", NULL, 0, &e), "model.gguf");
  const char *null_set[] = {NULL};
  CHECK_ERR_HAS(tsr_engine_open(NULL, NULL, null_set, 1, &e), "override 0");
}

static void test_tokens_round_trip_and_special_parsing(void) {
  const char *text = "Hello world, caf\xc3\xa9 \xe2\x98\x95 <|im_end|>";
  int32_t *plain = NULL, *special = NULL;
  size_t n_plain = 0, n_special = 0;
  CHECK_OK(tsr_tokenize(g_e, text, strlen(text), 0, &plain, &n_plain));
  CHECK_OK(tsr_tokenize(g_e, text, strlen(text), TSR_TOKENIZE_PARSE_SPECIAL, &special, &n_special));
  CHECK(n_special < n_plain); /* <|im_end|> is one token only when parsed */
  CHECK(n_special > 0 && tsr_token_is_eog(g_e, special[n_special - 1]));
  CHECK(!tsr_token_is_eog(g_e, plain[n_plain - 1]));
  char *back = NULL;
  size_t len = 0;
  CHECK_OK(tsr_detokenize(g_e, plain, n_plain, &back, &len));
  CHECK(back && len == strlen(text) && !strcmp(back, text));
  tsr_free(back);
  /* streamed, token by token, the text comes back in whole characters */
  tsr_text_stream *ts = NULL;
  CHECK_OK(tsr_text_stream_open(g_e, &ts));
  char joined[256] = "";
  for (size_t i = 0; ts && i < n_plain; i++) {
    const char *piece;
    size_t m;
    CHECK_OK(tsr_text_stream_push(ts, plain[i], &piece, &m));
    strncat(joined, piece, m);
  }
  if (ts) {
    const char *rest;
    size_t m;
    tsr_text_stream_flush(ts, &rest, &m);
    CHECK(m == 0);
    CHECK_ERR_HAS(tsr_text_stream_push(ts, -5, &rest, &m), "-5");
  }
  CHECK(!strcmp(joined, text));
  tsr_text_stream_close(ts);
  tsr_free(plain);
  tsr_free(special);
  CHECK_ERR_HAS(tsr_tokenize(g_e, "x", 1, 64, &plain, &n_plain), "flags");
  int32_t out_of_range = 1 << 30;
  CHECK_ERR_HAS(tsr_detokenize(g_e, &out_of_range, 1, &back, &len), "1073741824");
}

/* Bytes a client may send: NULs inside, invalid UTF-8 (a lone continuation byte, an
** overlong form, a truncated sequence at the end). Tokens hold them as they are, and a
** text stream passes bytes that can never complete a character through unchanged. */
static void test_nul_bytes_and_invalid_utf8_survive_the_round_trip(void) {
  static const char text[] = "a\0b \x80 \xc0\xaf \xff\xfe x\0\xe2\x98";
  const size_t len = sizeof text - 1;
  int32_t *t = NULL;
  size_t n = 0;
  CHECK_OK(tsr_tokenize(g_e, text, len, TSR_TOKENIZE_PARSE_SPECIAL, &t, &n));
  char *back = NULL;
  size_t back_len = 0;
  CHECK_OK(tsr_detokenize(g_e, t, n, &back, &back_len));
  CHECK(back && back_len == len && !memcmp(back, text, len));
  tsr_free(back);
  tsr_text_stream *ts = NULL;
  CHECK_OK(tsr_text_stream_open(g_e, &ts));
  char joined[64];
  size_t used = 0;
  for (size_t i = 0; ts && i < n; i++) {
    const char *piece;
    size_t m;
    CHECK_OK(tsr_text_stream_push(ts, t[i], &piece, &m));
    if (used + m <= sizeof joined) memcpy(joined + used, piece, m), used += m;
  }
  const char *rest;
  size_t m = 0;
  if (ts) tsr_text_stream_flush(ts, &rest, &m);
  CHECK(m == 2); /* the unfinished character at the end comes out only when flushed */
  if (ts && used + m <= sizeof joined) memcpy(joined + used, rest, m), used += m;
  CHECK(used == len && !memcmp(joined, text, len));
  tsr_text_stream_close(ts);
  tsr_free(t);
}

/* A prompt longer than the context, or longer than what the other sequences leave, fails
** naming the context, and the sequence is as before. */
static void test_a_prompt_past_the_context_is_refused(void) {
  const int32_t n = tsr_engine_n_ctx(g_e) + 10;
  int32_t *t = malloc((size_t)n * sizeof *t);
  for (int32_t i = 0; i < n; i++) t[i] = 100 + i % 500;
  const char *greedy[] = {"temperature=0"};
  tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_open(g_e, greedy, 1, &s));
  CHECK_OK(tsr_engine_seq_rm(g_e, 0, 0, -1));
  enum tsr_stop stop;
  CHECK_OK(tsr_engine_eval(g_e, 0, t, 3, NULL, NULL));
  CHECK_ERR_HAS(tsr_generate(g_e, 0, s, t, (size_t)n, 4, 4, NULL, NULL, &stop), "context");
  CHECK(tsr_engine_seq_len(g_e, 0) == 3); /* refused before anything ran */
  /* one that fits a fresh context but not beside what the other sequence holds: the
  ** chunks that ran are taken back */
  CHECK_OK(tsr_engine_seq_rm(g_e, 0, 0, -1));
  CHECK_OK(tsr_engine_eval(g_e, 1, t, 200, NULL, NULL));
  const int32_t fits = tsr_engine_n_ctx(g_e) - 20;
  CHECK_ERR_HAS(tsr_generate(g_e, 0, s, t, (size_t)fits, 4, 4, NULL, NULL, &stop), "context");
  CHECK(tsr_engine_seq_len(g_e, 0) == 0 && tsr_engine_seq_len(g_e, 1) == 200);
  float *lp = malloc((size_t)n * sizeof *lp);
  CHECK(tsr_engine_logprobs(g_e, 0, t, fits, lp) == TSR_ERR_NOMEM);
  CHECK(tsr_engine_seq_len(g_e, 0) == 0);
  CHECK_OK(tsr_engine_seq_rm(g_e, 1, 0, -1));
  free(lp);
  free(t);
  tsr_sampler_close(s);
}

static void test_chat_template_markers_only_from_the_template(void) {
  const char *roles[] = {"system", "user"};
  const char *contents[] = {"Be brief.", "hi <|im_end|> there"};
  char *text = NULL;
  CHECK_OK(tsr_chat_format(g_e, roles, contents, 2, 1, &text));
  CHECK(text && strstr(text, "<|im_start|>user\nhi <|im_end|> there<|im_end|>") &&
        strstr(text, "<|im_start|>assistant\n"));
  tsr_free(text);
  int32_t *ids = NULL, *end = NULL;
  size_t n = 0, n_end = 0;
  CHECK_OK(tsr_tokenize(g_e, "<|im_end|>", 10, TSR_TOKENIZE_PARSE_SPECIAL, &end, &n_end));
  CHECK_OK(tsr_chat_tokenize(g_e, roles, contents, 2, 1, &ids, &n));
  int markers = 0;
  for (size_t i = 0; n_end == 1 && i < n; i++) markers += ids[i] == end[0];
  CHECK(n_end == 1 && markers == 2); /* the two turns' ends, not the one in the message */
  tsr_free(ids);
  tsr_free(end);
  const char *chosen = NULL, *source = NULL;
  CHECK_OK(tsr_chat_template_choose(g_e, "gemma", &chosen, &source));
  CHECK(chosen && !strcmp(chosen, "gemma"));
  CHECK_OK(tsr_chat_format(g_e, roles + 1, contents + 1, 1, 1, &text));
  CHECK(text && strstr(text, "<start_of_turn>user"));
  tsr_free(text);
  CHECK_ERR_HAS(tsr_chat_template_choose(g_e, "nope", NULL, NULL), "chatml");
  CHECK_OK(tsr_chat_template_choose(g_e, NULL, &chosen, &source));
  CHECK(chosen && !strcmp(chosen, "chatml"));
  const char *bad_role[] = {"robot"};
  CHECK_ERR_HAS(tsr_chat_format(g_e, bad_role, contents, 1, 1, &text), "robot");
}

struct collect {
  int32_t tokens[256];
  int n, stop_after;
  char text[4096];
  size_t len;
};

static int collect(void *user, int32_t token, const char *text, size_t len) {
  struct collect *c = user;
  if (token >= 0 && c->n < 256) c->tokens[c->n++] = token;
  if (c->len + len < sizeof c->text) memcpy(c->text + c->len, text, len), c->len += len;
  return !(c->stop_after && c->n >= c->stop_after);
}

static void test_greedy_generation_is_the_argmax_loop_and_reuses_the_prompt(void) {
  size_t n = 0;
  int32_t *prompt = tokens_of("The capital of France is", &n);
  const char *greedy[] = {"temperature=0"};
  tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_open(g_e, greedy, 1, &s));
  struct collect a = {0}, b = {0};
  enum tsr_stop stop = TSR_STOP_NONE;
  CHECK_OK(tsr_engine_seq_rm(g_e, 0, 0, -1));
  CHECK_OK(tsr_generate(g_e, 0, s, prompt, n, 24, -1, collect, &a, &stop));
  CHECK(stop == TSR_STOP_LIMIT || stop == TSR_STOP_EOG);
  CHECK(tsr_engine_stat(g_e, TSR_STAT_GENERATED) == a.n && a.n > 0);
  CHECK(tsr_engine_stat(g_e, TSR_STAT_PROMPT_TOKENS) == (double)n);
  CHECK_OK(tsr_generate(g_e, 0, s, prompt, n, 24, -1, collect, &b, &stop));
  CHECK(tsr_engine_stat(g_e, TSR_STAT_PROMPT_REUSED) == (double)(n - 1)); /* prefix reuse */
  CHECK(a.n == b.n && !memcmp(a.tokens, b.tokens, (size_t)a.n * sizeof *a.tokens));
  /* the same tokens from eval and an argmax, by hand, on the other sequence */
  const int32_t V = tsr_engine_n_vocab(g_e);
  float *logits = malloc((size_t)V * sizeof *logits);
  CHECK_OK(tsr_engine_seq_rm(g_e, 1, 0, -1));
  CHECK_OK(tsr_engine_eval(g_e, 1, prompt, (int32_t)n, logits, NULL));
  for (int i = 0; i < a.n; i++) {
    int32_t t = argmax(logits, V);
    CHECK_MSG(t == a.tokens[i], "token %d: %d by hand, %d generated", i, t, a.tokens[i]);
    if (t != a.tokens[i]) break;
    CHECK_OK(tsr_engine_eval(g_e, 1, &t, 1, logits, NULL));
  }
  /* the streamed text is the tokens' text */
  char *text = NULL;
  size_t len = 0;
  CHECK_OK(tsr_detokenize(g_e, a.tokens, (size_t)a.n, &text, &len));
  CHECK(text && len == a.len && !memcmp(text, a.text, len));
  tsr_free(text);
  free(logits);
  tsr_sampler_close(s);
  tsr_free(prompt);
}

static void test_callback_stops_the_generation(void) {
  size_t n = 0;
  int32_t *prompt = tokens_of("Once upon a time", &n);
  const char *greedy[] = {"temperature=0"};
  tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_open(g_e, greedy, 1, &s));
  struct collect c = {.stop_after = 3};
  enum tsr_stop stop = TSR_STOP_NONE;
  CHECK_OK(tsr_generate(g_e, 0, s, prompt, n, -1, -1, collect, &c, &stop));
  CHECK(stop == TSR_STOP_CANCELLED && c.n == 3 && tsr_engine_stat(g_e, TSR_STAT_GENERATED) == 3);
  tsr_sampler_close(s);
  tsr_free(prompt);
}

/* The callback holds the first token until another thread has called tsr_engine_cancel. */
struct canceller {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool started, cancelled;
  int n;
};

static void *cancel_thread(void *arg) {
  struct canceller *c = arg;
  pthread_mutex_lock(&c->mu);
  while (!c->started) pthread_cond_wait(&c->cv, &c->mu);
  tsr_engine_cancel(g_e);
  c->cancelled = true;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static int wait_for_cancel(void *user, int32_t token, const char *text, size_t len) {
  (void)token, (void)text, (void)len;
  struct canceller *c = user;
  pthread_mutex_lock(&c->mu);
  c->n++;
  c->started = true;
  pthread_cond_broadcast(&c->cv);
  while (!c->cancelled) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  return 1;
}

static void test_cancel_from_another_thread(void) {
  size_t n = 0;
  int32_t *prompt = tokens_of("Count with me: one, two,", &n);
  const char *greedy[] = {"temperature=0"};
  tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_open(g_e, greedy, 1, &s));
  struct canceller c = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, cancel_thread, &c) == 0);
  enum tsr_stop stop = TSR_STOP_NONE;
  CHECK_OK(tsr_generate(g_e, 0, s, prompt, n, 200, -1, wait_for_cancel, &c, &stop));
  pthread_join(th, NULL);
  CHECK(stop == TSR_STOP_CANCELLED && c.n == 1);
  /* a cancel is not left behind for the next generation, nor is one made while none runs */
  tsr_engine_cancel(g_e);
  struct collect more = {0};
  CHECK_OK(tsr_generate(g_e, 0, s, prompt, n, 4, -1, collect, &more, &stop));
  CHECK(more.n > 0 && stop != TSR_STOP_CANCELLED);
  tsr_sampler_close(s);
  tsr_free(prompt);
}

static void test_logprobs_are_the_log_softmax_of_eval(void) {
  size_t n = 0;
  int32_t *t = tokens_of("A quick brown fox jumps over the lazy dog.", &n);
  float *lp = malloc(n * sizeof *lp);
  const int32_t V = tsr_engine_n_vocab(g_e);
  float *rows = malloc(n * (size_t)V * sizeof *rows);
  CHECK_OK(tsr_engine_seq_rm(g_e, 0, 0, -1));
  CHECK_OK(tsr_engine_seq_rm(g_e, 1, 0, -1));
  CHECK_OK(tsr_engine_logprobs(g_e, 0, t, (int32_t)n, lp));
  CHECK_OK(tsr_engine_eval(g_e, 1, t, (int32_t)n, NULL, rows));
  for (size_t i = 0; i + 1 < n; i++) {
    const float *r = rows + i * (size_t)V;
    double mx = r[0], sum = 0;
    for (int32_t j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
    for (int32_t j = 0; j < V; j++) sum += exp(r[j] - mx);
    CHECK_CLOSE(lp[i], r[t[i + 1]] - mx - log(sum), 1e-4, 1e-5);
    CHECK(lp[i] <= 0);
  }
  CHECK(tsr_engine_seq_len(g_e, 0) == (int32_t)n);
  CHECK_ERR_HAS(tsr_engine_logprobs(g_e, 0, t, 0, lp), "0 tokens");
  free(rows);
  free(lp);
  tsr_free(t);
}

static void test_sequence_copy_keep_and_refusals(void) {
  size_t n = 0;
  int32_t *t = tokens_of("Sequences share their prefix", &n);
  const int32_t V = tsr_engine_n_vocab(g_e);
  float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
  CHECK_OK(tsr_engine_seq_rm(g_e, 0, 0, -1));
  CHECK_OK(tsr_engine_eval(g_e, 0, t, (int32_t)n, a, NULL));
  CHECK_OK(tsr_engine_seq_cp(g_e, 0, 1));
  CHECK(tsr_engine_seq_len(g_e, 1) == (int32_t)n);
  CHECK(tsr_engine_common_prefix(g_e, 1, t, (int32_t)n) == (int32_t)n);
  int32_t next = 42;
  CHECK_OK(tsr_engine_eval(g_e, 0, &next, 1, a, NULL));
  CHECK_OK(tsr_engine_eval(g_e, 1, &next, 1, b, NULL));
  CHECK(!memcmp(a, b, (size_t)V * sizeof *a)); /* the copy continues as the original */
  CHECK_OK(tsr_engine_seq_keep(g_e, 1));
  CHECK(tsr_engine_seq_len(g_e, 0) == 0 && tsr_engine_seq_len(g_e, 1) == (int32_t)n + 1);
  CHECK_ERR_HAS(tsr_engine_seq_cp(g_e, 0, 7), "sequence 7");
  CHECK_ERR_HAS(tsr_engine_seq_keep(g_e, -1), "sequence -1");
  int32_t bad = V + 5;
  CHECK(tsr_engine_eval(g_e, 0, &bad, 1, a, NULL) != TSR_OK && tsr_error_message()[0]);
  CHECK(tsr_engine_seq_len(g_e, 0) == 0);
  CHECK_OK(tsr_engine_seq_rm(g_e, 1, 0, -1));
  free(a), free(b);
  tsr_free(t);
}

static void test_samplers_validate_and_reproduce(void) {
  tsr_sampler *s = NULL, *s2 = NULL;
  const char *bad_key[] = {"temprature=1"};
  CHECK_ERR_HAS(tsr_sampler_open(g_e, bad_key, 1, &s), "temprature");
  const char *bad_value[] = {"top_p=abc"};
  CHECK_ERR_HAS(tsr_sampler_open(g_e, bad_value, 1, &s), "top_p");
  const char *bad_range[] = {"top_k=-1"};
  CHECK_ERR_HAS(tsr_sampler_open(g_e, bad_range, 1, &s), "top_k");
  const char *random[] = {"seed=-1"};
  CHECK_OK(tsr_sampler_open(g_e, random, 1, &s));
  CHECK(s && strstr(tsr_sampler_describe(s), "(random)"));
  tsr_sampler_close(s);
  const char *seeded[] = {"temperature=1.5", "seed=18446744073709551615"};
  CHECK_OK(tsr_sampler_open(g_e, seeded, 2, &s));
  CHECK_OK(tsr_sampler_open(g_e, seeded, 2, &s2));
  CHECK(s && tsr_sampler_seed(s) == UINT64_MAX); /* 64-bit seeds read exactly */
  const int32_t V = tsr_engine_n_vocab(g_e);
  float *flat = calloc((size_t)V, sizeof *flat);
  for (int i = 0; s && s2 && i < 32; i++) {
    int32_t x, y;
    CHECK_OK(tsr_sampler_sample(s, flat, &x));
    CHECK_OK(tsr_sampler_sample(s2, flat, &y));
    CHECK(x == y && x >= 0 && x < V);
  }
  free(flat);
  tsr_sampler_close(s);
  tsr_sampler_close(s2);
}

/* Without a speculator in the profile there is nothing to speculate with: said by name. */
static void test_speculation_without_a_speculator_is_refused(void) {
  CHECK(tsr_engine_max_draft(g_e) == 0);
  tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_open(g_e, NULL, 0, &s));
  int32_t out[TSR_MAX_DRAFT + 1], n_out = -1, seq = 0, next = 1, draft = 0;
  CHECK_ERR_HAS(tsr_speculate(g_e, 0, 1, s, 0, out, &n_out), "names no speculator");
  CHECK(n_out == 0);
  CHECK_ERR_HAS(tsr_speculate(g_e, 0, -5, s, 0, out, &n_out), "outside the vocabulary");
  CHECK_ERR_HAS(tsr_speculate(g_e, 0, 1, s, 3, out, &n_out), "allows 0");
  CHECK_ERR_HAS(tsr_speculate_multi(g_e, 0, &seq, &next, &s, &draft, out, &n_out), "0 sequences");
  CHECK_ERR_HAS(tsr_speculate_multi(g_e, 1, &seq, &next, &s, &draft, NULL, &n_out), "missing");
  tsr_sampler_close(s);
}

static void count(void *user, const char *plugin, const char *counter, uint64_t value) {
  if (!strcmp(plugin, "arch_qwen") && !strcmp(counter, "forward_graphs")) *(uint64_t *)user = value;
}

static void test_counters_reports_and_engagement(void) {
  tsr_engine_reset_counters(g_e);
  uint64_t graphs = 0;
  tsr_engine_counters(g_e, count, &graphs);
  CHECK(graphs == 0);
  int32_t t = 11;
  float *logits = malloc((size_t)tsr_engine_n_vocab(g_e) * sizeof *logits);
  CHECK_OK(tsr_engine_eval(g_e, 0, &t, 1, logits, NULL));
  free(logits);
  tsr_engine_counters(g_e, count, &graphs);
  CHECK(graphs >= 1);
  const char *engaged[] = {"arch_qwen"}, *idle[] = {"arch_gemma4"}, *absent[] = {"no_such"};
  CHECK_OK(tsr_engine_require_engaged(g_e, engaged, 1));
  CHECK_ERR_HAS(tsr_engine_require_engaged(g_e, idle, 1), "arch_gemma4");
  CHECK_ERR_HAS(tsr_engine_require_engaged(g_e, absent, 1), "no_such");
  char *text = NULL;
  CHECK_OK(tsr_engine_report(g_e, TSR_REPORT_ENGAGEMENT, &text));
  CHECK(text && strstr(text, "arch_qwen") && strstr(text, "forward_graphs"));
  tsr_free(text);
  CHECK_ERR_HAS(tsr_engine_report(g_e, 64, &text), "report");
  CHECK_OK(tsr_engine_seq_rm(g_e, 0, 0, -1));
}

static void test_a_full_context_shifts_or_stops(void) {
  const char *sets[] = {"context=48"};
  tsr_engine *e = NULL;
  CHECK_OK(tsr_engine_open(NULL, NULL, sets, 1, &e));
  if (!e) return;
  int32_t *p = NULL;
  size_t n = 0;
  CHECK_OK(tsr_tokenize(e, "Hello there", 11, TSR_TOKENIZE_ADD_SPECIAL, &p, &n));
  const char *greedy[] = {"temperature=0"};
  tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_open(e, greedy, 1, &s));
  /* the default model never ends a turn mid-way here: 100 tokens need shifts */
  struct collect c = {0};
  enum tsr_stop stop = TSR_STOP_NONE;
  CHECK_OK(tsr_generate(e, 0, s, p, n, 100, 4, collect, &c, &stop));
  CHECK(stop == TSR_STOP_LIMIT && c.n == 100 && tsr_engine_stat(e, TSR_STAT_SHIFTS) >= 1);
  /* without shifting: a fixed limit fails naming the full context, no limit stops */
  CHECK_OK(tsr_engine_seq_rm(e, 0, 0, -1));
  CHECK_ERR_HAS(tsr_generate(e, 0, s, p, n, 100, -1, collect, &(struct collect){0}, &stop),
                "context");
  CHECK(tsr_engine_seq_len(e, 0) == 48);
  CHECK_OK(tsr_engine_seq_rm(e, 0, 0, -1));
  CHECK_OK(tsr_generate(e, 0, s, p, n, -1, -1, NULL, NULL, &stop));
  CHECK(stop == TSR_STOP_CONTEXT_FULL && strstr(tsr_error_message(), "context"));
  CHECK_ERR_HAS(tsr_generate(e, 3, s, p, n, 4, -1, NULL, NULL, &stop), "sequence 3");
  CHECK_ERR_HAS(tsr_generate(e, 0, s, p, 0, 4, -1, NULL, NULL, &stop), "empty");
  tsr_sampler_close(s);
  tsr_free(p);
  tsr_engine_close(e);
}

int main(void) {
  printf("tessera %s\n", tsr_version());
  g_e = open_default();
  if (!g_e) return 1;
  TSR_RUN(test_open_describe_and_settings);
  TSR_RUN(test_open_refusals_name_what_is_wrong);
  TSR_RUN(test_tokens_round_trip_and_special_parsing);
  TSR_RUN(test_nul_bytes_and_invalid_utf8_survive_the_round_trip);
  TSR_RUN(test_a_prompt_past_the_context_is_refused);
  TSR_RUN(test_chat_template_markers_only_from_the_template);
  TSR_RUN(test_greedy_generation_is_the_argmax_loop_and_reuses_the_prompt);
  TSR_RUN(test_callback_stops_the_generation);
  TSR_RUN(test_cancel_from_another_thread);
  TSR_RUN(test_logprobs_are_the_log_softmax_of_eval);
  TSR_RUN(test_sequence_copy_keep_and_refusals);
  TSR_RUN(test_samplers_validate_and_reproduce);
  TSR_RUN(test_speculation_without_a_speculator_is_refused);
  TSR_RUN(test_counters_reports_and_engagement);
  TSR_RUN(test_a_full_context_shifts_or_stops);
  tsr_engine_close(g_e);
  return TSR_TEST_EXIT();
}
