/*
** `tessera ruler`: RULER-style tasks (core/quality/ruler.h) at a given context
** length, greedy generation, string_match_all scoring.
**
** Each item is fitted to the context: its haystack grows until the prompt
** (chat template, instruction, haystack, question, answer prefix) fills
** ctx minus the reply budget, measured in the model's own tokens. Items are
** evaluated one at a time from an empty sequence.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/plugin_host.h"
#include "model/chat.h"
#include "cli.h"
#include "cli_quality.h"
#include "common/error.h"
#include "model/json.h"
#include "quality/logprobs.h"
#include "quality/ruler.h"


/* The prompt text of an item: chat-rendered user message then the answer
** prefix, or (no template) the message, a space and the prefix, the raw
** text the reference models were trained on. */
static tsr_status render(const struct tsr_ruler_opts *o, const struct tsr_ruler_item *it,
                         char **out) {
  *out = NULL;
  char *head = NULL;
  if (o->chat) {
    struct tsr_chat_message m = {"user", it->user};
    tsr_status st = tsr_chat_render(o->template, &m, 1, true, &head);
    if (st != TSR_OK) return st;
  }
  const char *first = head ? head : it->user, *sep = head ? "" : " ";
  size_t len = strlen(first) + strlen(sep) + strlen(it->answer_prefix) + 1;
  if ((*out = malloc(len))) snprintf(*out, len, "%s%s%s", first, sep, it->answer_prefix);
  free(head);
  return *out ? TSR_OK : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
}

static tsr_status make_prompt(const struct tsr_ruler_opts *o, const struct tsr_tokenizer *tok,
                              int64_t index, int64_t n_filler, struct tsr_ruler_item *it,
                              int32_t **ids, size_t *n) {
  *ids = NULL;
  tsr_status st = tsr_ruler_make(o->task, o->seed, index, n_filler, it);
  char *text = NULL;
  if (st == TSR_OK) st = render(o, it, &text);
  if (st == TSR_OK) st = tsr_tokenizer_encode(tok, text, strlen(text), true, true, ids, n);
  free(text);
  if (st != TSR_OK) tsr_ruler_item_free(it);
  return st;
}

/* Item `index` with the most filler lines whose prompt fits `target` tokens:
** tokens grow linearly in filler lines, so a few corrections suffice. */
static tsr_status fit_item(const struct tsr_ruler_opts *o, const struct tsr_tokenizer *tok,
                           int64_t index, int64_t target, struct tsr_ruler_item *it,
                           int32_t **ids, size_t *n) {
  size_t n0 = 0, n64 = 0;
  tsr_status st = make_prompt(o, tok, index, 0, it, ids, &n0);
  if (st != TSR_OK) return st;
  if ((int64_t)n0 > target) {
    tsr_ruler_item_free(it);
    free(*ids);
    *ids = NULL;
    return tsr_error_set(TSR_ERR_INVALID_ARG, "--ctx %lld leaves %lld prompt tokens; the task "
                         "needs %zu without any haystack", (long long)o->ctx, (long long)target,
                         n0);
  }
  tsr_ruler_item_free(it);
  free(*ids);
  if ((st = make_prompt(o, tok, index, 64, it, ids, &n64)) != TSR_OK) return st;
  const double per_unit = n64 > n0 ? (double)(n64 - n0) / 64.0 : 1.0;
  int64_t k = (int64_t)((double)(target - (int64_t)n0) / per_unit), best = 0;
  for (int iter = 0; iter < 12; iter++) {
    tsr_ruler_item_free(it);
    free(*ids);
    if ((st = make_prompt(o, tok, index, k, it, ids, n)) != TSR_OK) return st;
    int64_t over = (int64_t)*n - target;
    if (over <= 0 && (-over < per_unit * 2 || k == best)) return TSR_OK;
    if (over <= 0) best = k;
    int64_t step = (int64_t)ceil(fabs((double)over) / per_unit);
    k = over > 0 ? (k - (step > 0 ? step : 1)) : k + (step > 1 ? step - 1 : 1);
    if (k < 0) k = 0;
  }
  /* still not converged: the largest known fit */
  tsr_ruler_item_free(it);
  free(*ids);
  return make_prompt(o, tok, index, best, it, ids, n);
}

/* Greedy reply to ids, at most max_new tokens, up to an end-of-generation token. */
static tsr_status generate(struct tsr_engine *e, const struct tsr_tokenizer *tok,
                           const int32_t *ids, int32_t n, int32_t max_new, float *logits,
                           char **reply, struct tsr_ruler_result *r) {
  *reply = NULL;
  double t0 = tsr_now_s();
  tsr_status st = tsr_engine_seq_rm(e, 0, 0, -1);
  if (st == TSR_OK) st = tsr_engine_eval(e, 0, ids, n, logits, NULL);
  if (st != TSR_OK) return st;
  double t1 = tsr_now_s();
  r->prefill_tokens += n, r->prefill_s += t1 - t0;
  size_t cap = 256, len = 0;
  char *text = malloc(cap);
  struct tsr_utf8_stream u8 = TSR_UTF8_STREAM_INIT;
  int32_t made = 0;
  const int32_t V = tsr_engine_n_vocab(e);
  while (text && made < max_new) {
    int32_t t = (int32_t)tsr_logits_argmax(logits, V);
    if (tsr_tokenizer_is_eog(tok, t)) break;
    size_t plen = 0;
    const char *piece = tsr_tokenizer_piece(tok, t, &plen);
    if (len + plen + 8 > cap) {
      while (len + plen + 8 > cap) cap *= 2;
      char *grown = realloc(text, cap);
      if (!grown) break;
      text = grown;
    }
    len += tsr_utf8_stream_push(&u8, piece ? piece : "", piece ? plen : 0, text + len);
    if (++made == max_new) break;
    if ((st = tsr_engine_eval(e, 0, &t, 1, logits, NULL)) != TSR_OK) break;
  }
  if (text) {
    len += tsr_utf8_stream_flush(&u8, text + len);
    text[len] = 0;
  } else if (st == TSR_OK) {
    st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  r->decode_tokens += made, r->decode_s += tsr_now_s() - t1;
  *reply = text;
  return st;
}

tsr_status tsr_ruler_run(struct tsr_engine *e, const struct tsr_tokenizer *tok,
                         const struct tsr_ruler_opts *o, struct tsr_ruler_result *r) {
  memset(r, 0, sizeof *r);
  const int32_t max_new = tsr_ruler_max_new_tokens(o->task);
  const int64_t target = o->ctx - max_new;
  r->scores = calloc((size_t)o->n, sizeof *r->scores);
  float *logits = malloc((size_t)tsr_engine_n_vocab(e) * sizeof *logits);
  if (!r->scores || !logits) {
    free(logits);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  if (o->json_items) r->items = cJSON_CreateArray();
  const bool progress = isatty(STDERR_FILENO);
  tsr_status st = TSR_OK;
  for (int64_t i = 0; i < o->n && st == TSR_OK; i++) {
    struct tsr_ruler_item it;
    int32_t *ids = NULL;
    size_t n = 0;
    char *reply = NULL;
    st = fit_item(o, tok, i, target, &it, &ids, &n);
    if (st == TSR_OK) st = generate(e, tok, ids, (int32_t)n, max_new, logits, &reply, r);
    if (st == TSR_OK) {
      const double score = tsr_ruler_score(&it, reply);
      r->scores[i] = score;
      r->sum += score;
      r->n++;
      if (o->verbose)
        printf("  item %lld: %zu prompt tokens, needle at %.2f, expected %s%s, score %.2f, "
               "reply: %s\n", (long long)i, n, it.depth, it.refs[0], it.n_refs > 1 ? ", ..." : "",
               score, reply);
      if (r->items) {
        cJSON *x = cJSON_CreateObject(), *refs = cJSON_AddArrayToObject(x, "expected");
        cJSON_AddNumberToObject(x, "index", (double)i);
        cJSON_AddNumberToObject(x, "prompt_tokens", (double)n);
        cJSON_AddNumberToObject(x, "depth", it.depth);
        for (int j = 0; j < it.n_refs; j++) cJSON_AddItemToArray(refs, cJSON_CreateString(it.refs[j]));
        cJSON_AddStringToObject(x, "reply", reply);
        cJSON_AddNumberToObject(x, "score", score);
        cJSON_AddItemToArray(r->items, x);
      }
      if (progress)
        fprintf(stderr, "\r[%lld/%lld] accuracy %.1f%%", (long long)i + 1, (long long)o->n,
                100.0 * r->sum / (double)r->n);
    } else {
      tsr_error_prefix("item %lld", (long long)i);
    }
    free(reply);
    free(ids);
    tsr_ruler_item_free(&it); /* zeroed when making it failed */
  }
  if (progress) fprintf(stderr, "\r\033[K");
  free(logits);
  return st;
}

void tsr_ruler_result_free(struct tsr_ruler_result *r) {
  free(r->scores);
  cJSON_Delete(r->items);
  memset(r, 0, sizeof *r);
}

/* ---- the command ---- */

static void ruler_usage(FILE *f) {
  fprintf(f,
          "usage: tessera ruler --task passkey|niah_single|niah_multi|vt --ctx N --n K\n"
          "                     (-m MODEL.gguf | --profile P) [--set key=value]...\n"
          "                     [--seed S] [--json OUT] [--no-chat]\n"
          "                     [--chat-template chatml|gemma|gemma4] [--threads N] [-v]\n"
          "Generates K items of the task (seeded: the same seed gives the same items), each\n"
          "filling a prompt of --ctx tokens less the reply budget in the model's tokens, with\n"
          "its chat template (--no-chat: the raw text), answers greedily and scores like\n"
          "RULER's string_match_all. Prints the accuracy; --json writes every item. The\n"
          "profile's context is set to --ctx. -v prints each item.\n");
}

struct ruler_args {
  struct tsr_cli_engine_args eng;
  const char *json, *chat_template;
  char ctx_set[32];
  struct tsr_ruler_opts o;
  bool has_task;
};

static int usage_error(const char *what, const char *arg) {
  fprintf(stderr, "tessera ruler: %s%s\n(tessera ruler --help for usage)\n", what, arg);
  return TSR_EXIT_USAGE;
}

static int parse_args(int argc, char **argv, struct ruler_args *a) {
  a->o.chat = true;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      ruler_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (!strcmp(f, "--no-chat")) { a->o.chat = false; continue; }
    if (!strcmp(f, "-v") || !strcmp(f, "--verbose")) { a->o.verbose = true; continue; }
    if (f[0] != '-') return usage_error("unexpected argument ", f);
    if (i + 1 >= argc) return usage_error("a value is missing after ", f);
    const char *v = argv[++i];
    const int common = tsr_cli_engine_flag(&a->eng, f, v);
    if (common < 0) return usage_error("not a valid value for ", f);
    if (common) continue;
    int64_t n = 0;
    bool ok = true;
    if (!strcmp(f, "--task")) {
      if (tsr_ruler_task_parse(v, &a->o.task) != TSR_OK) return usage_error(tsr_error_message(), "");
      a->has_task = true;
    } else if (!strcmp(f, "--ctx")) ok = tsr_cli_parse_i64(v, 16, 1 << 24, &a->o.ctx);
    else if (!strcmp(f, "--n")) ok = tsr_cli_parse_i64(v, 1, 1 << 20, &a->o.n);
    else if (!strcmp(f, "--seed")) ok = tsr_cli_parse_i64(v, 0, INT64_MAX, &n), a->o.seed = (uint64_t)n;
    else if (!strcmp(f, "--json")) a->json = v;
    else if (!strcmp(f, "--chat-template")) a->chat_template = v;
    else return usage_error("unknown option ", f);
    if (!ok) return usage_error("not a valid value for ", f);
  }
  if (!a->has_task || !a->o.ctx || !a->o.n) return usage_error("give --task, --ctx and --n", "");
  if (!a->eng.model && !a->eng.profile)
    return usage_error("give -m MODEL.gguf or --profile P", "");
  if (!a->o.chat && a->chat_template) return usage_error("--chat-template with --no-chat", "");
  snprintf(a->ctx_set, sizeof a->ctx_set, "context=%lld", (long long)a->o.ctx);
  tsr_cli_engine_preset(&a->eng, a->ctx_set);
  return -1;
}

/* The engine, tokenizer and template a ruler run needs. */
tsr_status tsr_ruler_open(const struct tsr_engine_options *eo, const char *chat_template,
                          struct tsr_ruler_opts *o, struct tsr_engine **e,
                          struct tsr_tokenizer **tok) {
  *e = NULL, *tok = NULL;
  tsr_status st = tsr_engine_new(eo, e);
  if (st == TSR_OK) st = tsr_tokenizer_load(tsr_engine_setup(*e)->model, tok);
  const char *source = NULL;
  if (st == TSR_OK && o->chat)
    st = tsr_setup_chat_template(tsr_engine_setup(*e), chat_template,
                                 tsr_tokenizer_chat_template(*tok), &o->template, &source);
  if (st == TSR_OK && tsr_engine_setup(*e)->profile->context < o->ctx)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "the profile's context (%lld) is below --ctx %lld",
                       (long long)tsr_engine_setup(*e)->profile->context, (long long)o->ctx);
  return st;
}

int tsr_cli_ruler(int argc, char **argv) {
  struct ruler_args a = {0};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  code = TSR_EXIT_OK;
  a.o.json_items = a.json != NULL;
  struct tsr_engine_options eo = {.profile_path = a.eng.profile, .sets = a.eng.sets,
                                  .n_sets = a.eng.n_sets, .model_path = a.eng.model,
                                  .n_threads = a.eng.threads};
  struct tsr_engine *e = NULL;
  struct tsr_tokenizer *tok = NULL;
  struct tsr_ruler_result r = {0};
  tsr_status st = tsr_ruler_open(&eo, a.chat_template, &a.o, &e, &tok);
  if (st == TSR_OK) st = tsr_ruler_run(e, tok, &a.o, &r);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera ruler: %s\n", tsr_error_message());
    code = st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
  } else {
    const struct tsr_setup *s = tsr_engine_setup(e);
    const double acc = r.n ? 100.0 * r.sum / (double)r.n : 0;
    printf("ruler: %s, ctx %lld, n %lld, seed %llu, %s, %s\n", tsr_ruler_task_name(a.o.task),
           (long long)a.o.ctx, (long long)a.o.n, (unsigned long long)a.o.seed, s->model_path,
           a.o.chat ? tsr_chat_template_name(a.o.template) : "no chat template");
    printf("accuracy %.1f%% (%.1f of %lld)\n", acc, r.sum, (long long)r.n);
    printf("prefill %.1f tok/s, decode %.1f tok/s\n",
           r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0,
           r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0);
    tsr_plugin_host_print_decode_counters(s->host, stdout);
    if (a.json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "task", tsr_ruler_task_name(a.o.task));
      cJSON_AddNumberToObject(o, "ctx", (double)a.o.ctx);
      cJSON_AddNumberToObject(o, "n", (double)r.n);
      cJSON_AddNumberToObject(o, "seed", (double)a.o.seed);
      cJSON_AddStringToObject(o, "model", s->model_path);
      if (a.eng.profile) cJSON_AddStringToObject(o, "profile", a.eng.profile);
      cJSON_AddBoolToObject(o, "chat", a.o.chat);
      cJSON_AddNumberToObject(o, "accuracy", acc);
      cJSON_AddNumberToObject(o, "prefill_tokens_per_second",
                              r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0);
      cJSON_AddNumberToObject(o, "decode_tokens_per_second",
                              r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0);
      cJSON_AddItemToObject(o, "items", r.items);
      r.items = NULL;
      char *text = cJSON_Print(o);
      cJSON_Delete(o);
      FILE *f = text ? fopen(a.json, "w") : NULL;
      bool written = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
      if (f && fclose(f)) written = false;
      if (!written) {
        fprintf(stderr, "tessera ruler: cannot write %s\n", a.json);
        code = TSR_EXIT_RUNTIME;
      }
      free(text);
    }
  }
  tsr_ruler_result_free(&r);
  tsr_tokenizer_free(tok);
  tsr_engine_free(e);
  return code;
}
