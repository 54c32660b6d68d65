/*
** The scheduler: one thread that owns the engine and runs the slots.
**
** Each step: finish cancelled requests, admit queued ones to free slots
** (the slot whose cached tokens share the longest prefix with the prompt),
** then evaluate one batch: the sampled token of every decoding slot, then
** prompt chunks of prefilling slots up to the profile's batch size. Rows
** come back for decoding slots and for a prompt's last token; each slot
** samples with its own sampler, outside the mutex; the tokens are applied
** under it. A slot may hold n_ctx / n_slots positions, so slots never run
** each other out of cache.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "server_internal.h"

double srv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void srv_request_unref(struct srv *s, struct srv_request *r) {
  if (--r->refs > 0) return;
  srv_request_free(r);
  s->n_live--;
  pthread_cond_broadcast(&s->progress);
}

int srv_submit(struct srv *s, struct srv_request *r, const char **code, char *msg, size_t cap) {
  pthread_mutex_lock(&s->mu);
  int busy = 0;
  for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].req != NULL;
  int status = 0;
  if (s->stopping) {
    status = 503, *code = "shutting_down";
    snprintf(msg, cap, "the server is shutting down");
  } else if (busy + s->n_queue >= s->n_slots + s->opt.queue) {
    status = 503, *code = "server_busy";
    snprintf(msg, cap, "server busy: %d requests running and %d waiting (--parallel %d, "
             "--queue %d); retry later", busy, s->n_queue, s->n_slots, s->opt.queue);
  } else {
    r->refs++;
    s->n_live++;
    r->state = SRV_QUEUED;
    r->t_queued = srv_now();
    s->queue[s->n_queue++] = r;
    s->m.requests++;
    pthread_cond_signal(&s->work);
  }
  pthread_mutex_unlock(&s->mu);
  return status;
}

void srv_cancel_all(struct srv *s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  for (int i = 0; i < s->n_queue; i++) s->queue[i]->cancel = true;
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].req) s->slots[i].req->cancel = true;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&s->mu);
}

/* ---- under the mutex ---- */

static void request_done(struct srv *s, struct srv_request *r, const char *finish) {
  r->finish = finish;
  r->state = SRV_DONE;
  r->n_released = r->n_text;
  r->t_end = srv_now();
  if (!r->t_first) r->t_first = r->t_end;
  if (r->err_status) s->m.failed++;
  srv_request_unref(s, r);
  pthread_cond_broadcast(&s->progress);
}

static void slot_finish(struct srv *s, struct srv_slot *sl, const char *finish) {
  struct srv_request *r = sl->req;
  const char *rest;
  size_t n;
  tsr_text_stream_flush(sl->text, &rest, &n);
  if (n && strcmp(finish, "cancelled")) srv_text_append(r, rest, n);
  tsr_sampler_close(sl->smp);
  sl->smp = NULL;
  sl->req = NULL;
  sl->next_token = -1;
  request_done(s, r, finish);
}

static void slot_fail(struct srv *s, struct srv_slot *sl, int status, const char *msg) {
  snprintf(sl->req->err_msg, sizeof sl->req->err_msg, "%s", msg);
  sl->req->err_status = status;
  slot_finish(s, sl, "error");
}

/* The free slot for r: the longest cached prefix, ties to the lowest index. */
static int pick_slot(struct srv *s, const struct srv_request *r, int32_t *k_out) {
  int best = -1;
  int32_t best_k = -1;
  for (int i = 0; i < s->n_slots; i++) {
    if (s->slots[i].req) continue;
    int32_t k = r->p.cache_prompt
                    ? tsr_engine_common_prefix(s->e, i, r->p.prompt, r->p.n_prompt)
                    : 0;
    if (k > best_k) best = i, best_k = k;
  }
  *k_out = best_k;
  return best;
}

static void admit(struct srv *s) {
  while (s->n_queue > 0) {
    struct srv_request *r = s->queue[0];
    int32_t k = 0;
    int slot = r->cancel ? -1 : pick_slot(s, r, &k);
    if (!r->cancel && slot < 0) return; /* every slot busy */
    memmove(s->queue, s->queue + 1, (size_t)--s->n_queue * sizeof *s->queue);
    if (r->cancel) {
      request_done(s, r, "cancelled");
      continue;
    }
    struct srv_slot *sl = &s->slots[slot];
    sl->req = r;
    sl->next_token = -1;
    r->state = SRV_RUNNING;
    r->slot = slot;
    r->t_start = srv_now();
    /* the prompt's last token is evaluated again: its logits start the reply */
    if (k >= r->p.n_prompt) k = r->p.n_prompt - 1;
    if (tsr_engine_seq_rm(s->e, slot, k, -1) != TSR_OK) {
      k = 0; /* recurrent state or a released ring cannot resume mid-way */
      if (tsr_engine_seq_rm(s->e, slot, 0, -1) != TSR_OK) {
        slot_fail(s, sl, 500, tsr_error_message());
        continue;
      }
    }
    sl->n_prompt_done = r->n_cached = k;
    if (srv_sampler_open(s, &r->p.sampling, &sl->smp) != TSR_OK)
      slot_fail(s, sl, 400, tsr_error_message());
  }
}

/* ---- one step ---- */

struct srv_step {
  int32_t n;
  int32_t *tok, *seq, *slot_of_row;
  unsigned char *want;
  int32_t n_rows, n_prompt_tokens;
  int32_t *row_token; /* sampled per row */
  int32_t prefill_take[SRV_MAX_SLOTS];
  bool in_batch[SRV_MAX_SLOTS];
  /* with a speculator: the decoding slots, which take one shared speculative step
  ** (their tokens and drafts in one verify batch) instead of a row of the batch */
  int32_t n_spec, spec_slots[SRV_MAX_SLOTS];
};

/* Fills the batch; returns false when there is nothing to run. */
static bool plan_step(struct srv *s, struct srv_step *st) {
  st->n = st->n_rows = st->n_prompt_tokens = st->n_spec = 0;
  for (int i = 0; i < s->n_slots; i++) {
    struct srv_slot *sl = &s->slots[i];
    st->prefill_take[i] = 0;
    st->in_batch[i] = false;
    if (!sl->req || sl->next_token < 0) continue;
    if (s->max_draft > 0) {
      st->spec_slots[st->n_spec++] = i;
      continue;
    }
    st->in_batch[i] = true;
    st->tok[st->n] = sl->next_token, st->seq[st->n] = i, st->want[st->n] = true;
    st->slot_of_row[st->n_rows++] = i;
    st->n++;
  }
  int32_t budget = s->n_batch - st->n;
  for (int i = 0; i < s->n_slots && budget > 0; i++) {
    struct srv_slot *sl = &s->slots[i];
    if (!sl->req || sl->next_token >= 0) continue;
    const struct srv_request *r = sl->req;
    int32_t left = r->p.n_prompt - sl->n_prompt_done;
    int32_t take = left < budget ? left : budget;
    for (int32_t j = 0; j < take; j++) {
      st->tok[st->n] = r->p.prompt[sl->n_prompt_done + j];
      st->seq[st->n] = i;
      st->want[st->n] = j == left - 1;
      st->n++;
    }
    if (take == left) st->slot_of_row[st->n_rows++] = i;
    st->prefill_take[i] = take;
    st->in_batch[i] = true;
    st->n_prompt_tokens += take;
    budget -= take;
  }
  return st->n > 0 || st->n_spec > 0;
}

/* Applies the sampled token t to slot i (under the mutex). */
static void apply_token(struct srv *s, int i, int32_t t) {
  struct srv_slot *sl = &s->slots[i];
  struct srv_request *r = sl->req;
  if (!r->t_first) r->t_first = srv_now();
  if (tsr_token_is_eog(s->e, t)) {
    r->stop_type = "eos";
    slot_finish(s, sl, "stop");
    return;
  }
  const char *text;
  size_t len = 0;
  const size_t before = r->n_text;
  if (tsr_text_stream_push(sl->text, t, &text, &len) != TSR_OK) {
    slot_fail(s, sl, 500, tsr_error_message());
    return;
  }
  if (!srv_text_append(r, text, len)) {
    slot_fail(s, sl, 500, "out of memory");
    return;
  }
  r->n_gen++;
  s->m.generated_tokens++;
  /* the earliest stop string in the new text (it may start in held-back bytes) */
  size_t cut = (size_t)-1;
  int which = -1;
  for (int k = 0; k < r->p.n_stop; k++) {
    size_t sl_len = strlen(r->p.stop[k]);
    size_t from = before >= sl_len ? before - sl_len + 1 : 0;
    for (size_t p = from; p + sl_len <= r->n_text && p < cut; p++)
      if (!memcmp(r->text + p, r->p.stop[k], sl_len)) {
        cut = p, which = k;
        break;
      }
  }
  if (which >= 0) {
    r->n_text = cut;
    r->stop_type = "word";
    snprintf(r->stopping_word, sizeof r->stopping_word, "%s", r->p.stop[which]);
    slot_finish(s, sl, "stop");
    return;
  }
  /* hold back a tail that may still become a stop string */
  size_t hold = 0;
  for (int k = 0; k < r->p.n_stop; k++) {
    size_t sl_len = strlen(r->p.stop[k]);
    for (size_t m = sl_len - 1 < r->n_text ? sl_len - 1 : r->n_text; m > hold; m--)
      if (!memcmp(r->text + r->n_text - m, r->p.stop[k], m)) {
        hold = m;
        break;
      }
  }
  r->n_released = r->n_text - hold;
  /* prompt and reply together fit the slot, as OpenAI counts a context */
  if ((r->p.max_tokens > 0 && r->n_gen >= r->p.max_tokens) ||
      r->p.n_prompt + r->n_gen >= s->n_ctx_slot) {
    r->stop_type = "limit";
    slot_finish(s, sl, "length");
    return;
  }
  sl->next_token = t;
  pthread_cond_broadcast(&s->progress);
}

/* What each slot's sequence holds after a step (under the mutex). */
static void note_cached(struct srv *s) {
  s->m.kv_used = 0;
  for (int i = 0; i < s->n_slots; i++) {
    s->slots[i].n_cached = tsr_engine_seq_len(s->e, i);
    s->m.kv_used += (uint64_t)s->slots[i].n_cached;
  }
}

/* The decoding slots' speculative step: each one's next token and drafts in one shared
** verify batch; every token a slot gets goes out in order (the last is its new next token).
** A slot's drafts stop where its context or max_tokens would end the reply anyway. */
static void run_spec_step(struct srv *s, struct srv_step *st) {
  int32_t next[SRV_MAX_SLOTS], drafts[SRV_MAX_SLOTS], n_out[SRV_MAX_SLOTS];
  int32_t out[SRV_MAX_SLOTS][TSR_MAX_DRAFT + 1];
  tsr_sampler *smp[SRV_MAX_SLOTS];
  const struct srv_request *req[SRV_MAX_SLOTS];
  for (int32_t k = 0; k < st->n_spec; k++) {
    const struct srv_slot *sl = &s->slots[st->spec_slots[k]];
    const struct srv_request *r = req[k] = sl->req;
    int32_t d = s->max_draft;
    const int32_t room = s->n_ctx_slot - (r->p.n_prompt + r->n_gen) - 1;
    const int32_t left = r->p.max_tokens - r->n_gen - 1; /* tokens after the next one */
    if (d > room) d = room;
    if (r->p.max_tokens > 0 && d > left) d = left;
    next[k] = sl->next_token, smp[k] = sl->smp, drafts[k] = d > 0 ? d : 0;
  }
  const double t0 = srv_now();
  tsr_status rc = tsr_speculate_multi(s->e, st->n_spec, st->spec_slots, next, smp, drafts,
                                      &out[0][0], n_out);
  const double dt = srv_now() - t0;
  char err[512] = "";
  if (rc != TSR_OK) snprintf(err, sizeof err, "%s", tsr_error_message());
  pthread_mutex_lock(&s->mu);
  s->m.decode_seconds += dt;
  for (int32_t k = 0; k < st->n_spec; k++) {
    const int i = st->spec_slots[k];
    struct srv_slot *sl = &s->slots[i];
    if (sl->req != req[k]) continue;
    if (rc != TSR_OK) {
      slot_fail(s, sl, 500, err);
      continue;
    }
    sl->next_token = -1;
    for (int32_t j = 0; j < n_out[k] && sl->req == req[k]; j++) apply_token(s, i, out[k][j]);
  }
  note_cached(s);
  pthread_mutex_unlock(&s->mu);
}

static void run_step(struct srv *s, struct srv_step *st) {
  if (st->n_spec) run_spec_step(s, st);
  if (!st->n) return;
  const double t0 = srv_now();
  tsr_status rc = tsr_engine_eval_multi(s->e, st->n, st->tok, st->seq, st->want, s->logits);
  const double dt = srv_now() - t0;
  char err[512] = "";
  if (rc != TSR_OK) snprintf(err, sizeof err, "%s", tsr_error_message());
  /* sampling needs no lock: samplers and logits are the scheduler's */
  for (int32_t row = 0; rc == TSR_OK && row < st->n_rows; row++) {
    struct srv_slot *sl = &s->slots[st->slot_of_row[row]];
    if (tsr_sampler_sample(sl->smp, s->logits + (size_t)row * s->n_vocab, &st->row_token[row]) !=
        TSR_OK)
      st->row_token[row] = -1;
  }
  pthread_mutex_lock(&s->mu);
  const int32_t n_decode = st->n - st->n_prompt_tokens;
  s->m.prompt_seconds += dt * st->n_prompt_tokens / st->n;
  s->m.decode_seconds += dt * n_decode / st->n;
  s->m.prompt_tokens += (uint64_t)st->n_prompt_tokens;
  for (int i = 0; i < s->n_slots; i++) {
    struct srv_slot *sl = &s->slots[i];
    if (!sl->req || !st->in_batch[i]) continue;
    if (rc != TSR_OK) {
      slot_fail(s, sl, 500, err);
      continue;
    }
    sl->n_prompt_done += st->prefill_take[i];
    sl->next_token = -1;
  }
  for (int32_t row = 0; rc == TSR_OK && row < st->n_rows; row++) {
    struct srv_slot *sl = &s->slots[st->slot_of_row[row]];
    if (!sl->req) continue;
    if (st->row_token[row] < 0)
      slot_fail(s, sl, 500, tsr_error_message());
    else
      apply_token(s, st->slot_of_row[row], st->row_token[row]);
  }
  note_cached(s);
  pthread_mutex_unlock(&s->mu);
}

static void *sched_main(void *arg) {
  struct srv *s = arg;
  struct srv_step *st = s->step;
  pthread_mutex_lock(&s->mu);
  while (!s->sched_exit) {
    for (int i = 0; i < s->n_slots; i++)
      if (s->slots[i].req && s->slots[i].req->cancel) slot_finish(s, &s->slots[i], "cancelled");
    admit(s);
    if (!plan_step(s, st)) {
      pthread_cond_wait(&s->work, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    run_step(s, st);
    pthread_mutex_lock(&s->mu);
  }
  /* leaving: nothing stays in flight */
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].req) slot_finish(s, &s->slots[i], "cancelled");
  while (s->n_queue > 0) request_done(s, s->queue[--s->n_queue], "cancelled");
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void step_free(struct srv_step *st) {
  if (!st) return;
  free(st->tok), free(st->seq), free(st->slot_of_row), free(st->row_token), free(st->want);
  free(st);
}

static void sched_free(struct srv *s) {
  step_free(s->step);
  free(s->logits);
  free(s->queue);
  s->step = NULL;
  s->logits = NULL;
  s->queue = NULL;
}

/* Everything the scheduler needs is allocated here, before the server listens: the
** scheduler thread itself cannot fail, so the server never listens without one. */
tsr_status srv_sched_start(struct srv *s) {
  const size_t cap = (size_t)s->n_batch + SRV_MAX_SLOTS;
  const size_t n_logits = ((size_t)s->n_slots + 1) * (size_t)s->n_vocab;
  struct srv_step *st = s->step = calloc(1, sizeof *st);
  if (st) {
    st->tok = malloc(cap * sizeof *st->tok);
    st->seq = malloc(cap * sizeof *st->seq);
    st->slot_of_row = malloc(cap * sizeof *st->slot_of_row);
    st->row_token = malloc(cap * sizeof *st->row_token);
    st->want = malloc(cap * sizeof *st->want);
  }
  s->logits = malloc(n_logits * sizeof *s->logits);
  s->queue = calloc((size_t)s->opt.queue + SRV_MAX_SLOTS, sizeof *s->queue);
  if (!st || !st->tok || !st->seq || !st->slot_of_row || !st->row_token || !st->want ||
      !s->logits || !s->queue) {
    sched_free(s);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory for the scheduler's buffers: a step of "
                         "up to %zu tokens (the profile's batch %d plus one per slot) and the "
                         "logits of %d slots, %.1f MiB in all; lower batch", cap, s->n_batch,
                         s->n_slots, (double)(cap * (4 * sizeof(int32_t) + sizeof(unsigned char)) +
                                   n_logits * sizeof(float)) / 1048576.0);
  }
  for (int i = 0; i < SRV_MAX_SLOTS; i++) s->slots[i].next_token = -1;
  if (pthread_create(&s->sched, NULL, sched_main, s)) {
    sched_free(s);
    return tsr_error_set(TSR_ERR_INTERNAL, "cannot start the scheduler thread");
  }
  s->sched_running = true;
  return TSR_OK;
}

void srv_sched_stop(struct srv *s) {
  pthread_mutex_lock(&s->mu);
  s->sched_exit = true;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->sched, NULL);
  sched_free(s);
}
