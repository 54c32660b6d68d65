/*
** RULER-style tasks (ruler.h): generation from a seed, and scoring. The
** format and the generator are tests/reference/train/tasks.py's, line for
** line, so the project's trained models are scored on what they learned;
** tests/cli/test_ruler_format.py checks the two agree byte for byte.
*/
#include "quality/ruler.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static const char *const k_names[] = {"passkey", "niah_single", "niah_multi", "vt"};

/* RULER's "noise" haystack: one filler line. */
static const char k_noise[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

static const char *const k_intro[] = {
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about the pass key.",
    "Some special magic numbers are hidden within the following text. Make sure to memorize "
    "them. I will quiz you about the numbers afterwards.",
    "Some special magic numbers are hidden within the following text. Make sure to memorize "
    "them. I will quiz you about the numbers afterwards.",
    "Memorize and track the chain of variable assignments hidden in the following text.",
};

static const char *const k_adjectives[] = {
    "able", "ancient", "angry", "bold", "brave", "bright", "broad", "calm", "careful", "cheap",
    "clean", "clever", "cold", "cool", "curious", "damp", "dark", "deep", "eager", "early",
    "empty", "fair", "famous", "fancy", "fast", "fierce", "flat", "fresh", "gentle", "giant",
    "glad", "golden", "green", "happy", "heavy", "hollow", "honest", "huge", "icy", "jolly",
    "kind", "large", "lazy", "little", "lively", "loud", "lucky", "mighty", "modern", "narrow",
    "noisy", "odd", "old", "pale", "plain", "polite", "proud", "quick", "quiet", "rapid",
    "rare", "rich", "round", "rusty", "shiny", "short", "silent", "silly", "simple", "slow",
    "small", "smooth", "soft", "solid", "sour", "steep", "still", "strange", "strong", "sweet",
    "tall", "tame", "thick", "thin", "tiny", "tired", "vast", "warm", "wet", "wild", "wise",
    "young",
};
static const char *const k_nouns[] = {
    "anchor", "apple", "arrow", "badger", "basket", "beacon", "bell", "bicycle", "bird",
    "blanket", "bottle", "bridge", "bucket", "button", "cabin", "camel", "candle", "canyon",
    "castle", "cat", "cloud", "comet", "compass", "cookie", "crane", "crystal", "desert",
    "dolphin", "dragon", "drum", "eagle", "engine", "falcon", "feather", "forest", "fox",
    "garden", "giraffe", "glacier", "hammer", "harbor", "helmet", "island", "jacket", "kettle",
    "ladder", "lantern", "lemon", "lion", "magnet", "meadow", "mirror", "monkey", "mountain",
    "needle", "ocean", "orchard", "otter", "owl", "paddle", "parrot", "pebble", "pencil",
    "piano", "pillow", "planet", "pocket", "puzzle", "rabbit", "river", "rocket", "saddle",
    "sheep", "shell", "signal", "spoon", "squirrel", "statue", "tiger", "tower", "trumpet",
    "tunnel", "turtle", "umbrella", "valley", "violin", "wagon", "whale", "window", "wolf",
};
#define N_ADJ (sizeof k_adjectives / sizeof *k_adjectives)
#define N_NOUN (sizeof k_nouns / sizeof *k_nouns)
#define NIAH_MULTI_KEYS 4
#define VT_HOPS 4
#define GOLDEN 0x9e3779b97f4a7c15ull

tsr_status tsr_ruler_task_parse(const char *name, enum tsr_ruler_task *out) {
  for (int i = 0; i < 4; i++)
    if (name && !strcmp(name, k_names[i])) {
      *out = (enum tsr_ruler_task)i;
      return TSR_OK;
    }
  return tsr_error_set(TSR_ERR_INVALID_ARG, "unknown task '%s' (passkey, niah_single, "
                       "niah_multi, vt)", name ? name : "");
}

const char *tsr_ruler_task_name(enum tsr_ruler_task t) {
  return (unsigned)t < 4 ? k_names[t] : "?";
}

int32_t tsr_ruler_max_new_tokens(enum tsr_ruler_task t) {
  return t == TSR_RULER_PASSKEY ? 16 : t == TSR_RULER_VT ? 64 : 32;
}

/* SplitMix64 as tasks.py runs it: state = seed + index * GOLDEN. */
struct rng {
  uint64_t state;
};

static uint64_t next(struct rng *r) {
  uint64_t z = (r->state += GOLDEN);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t below(struct rng *r, uint64_t n) { return next(r) % n; }

/* A decimal number of `digits` digits without a leading zero. */
static void number(struct rng *r, int digits, char *out) {
  out[0] = (char)('1' + below(r, 9));
  for (int i = 1; i < digits; i++) out[i] = (char)('0' + below(r, 10));
  out[digits] = 0;
}

/* A growing string; on failure it stays NULL-safe and ok turns false. */
struct sbuf {
  char *p;
  size_t n, cap;
  bool ok;
};

static void put(struct sbuf *b, const char *s) {
  size_t len = strlen(s);
  if (!b->ok) return;
  if (b->n + len + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + len + 1) cap *= 2;
    char *grown = realloc(b->p, cap);
    if (!grown) {
      b->ok = false;
      return;
    }
    b->p = grown;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, len + 1);
  b->n += len;
}

static bool taken(char (*list)[64], int n, const char *s) {
  for (int i = 0; i < n; i++)
    if (!strcmp(list[i], s)) return true;
  return false;
}

struct needles {
  int n;
  char line[5][256];
  char question[384], prefix[384];
};

/* tasks.needles(): the needle lines in chain order, the question, the
** answer prefix and the expected strings (into it->refs). */
static void make_needles(enum tsr_ruler_task t, struct rng *r, struct needles *nd,
                         struct tsr_ruler_item *it, bool *ok) {
  char val[16], names[5][64];
  if (t == TSR_RULER_PASSKEY) {
    number(r, 5, val);
    nd->n = 1;
    snprintf(nd->line[0], sizeof nd->line[0], "The pass key is %s. Remember it. %s is the pass key.",
             val, val);
    snprintf(nd->question, sizeof nd->question, "What is the pass key?");
    snprintf(nd->prefix, sizeof nd->prefix, "The pass key is");
    if (!(it->refs[it->n_refs++] = strdup(val))) *ok = false;
  } else if (t == TSR_RULER_NIAH_SINGLE || t == TSR_RULER_NIAH_MULTI) {
    char vals[NIAH_MULTI_KEYS][16];
    nd->n = t == TSR_RULER_NIAH_SINGLE ? 1 : NIAH_MULTI_KEYS;
    for (int j = 0; j < nd->n; j++) {
      do { /* distinct keys: the question must have one answer */
        const char *adj = k_adjectives[below(r, N_ADJ)];
        snprintf(names[j], sizeof names[j], "%s-%s", adj, k_nouns[below(r, N_NOUN)]);
      } while (taken(names, j, names[j]));
      number(r, 7, vals[j]);
      snprintf(nd->line[j], sizeof nd->line[j], "One of the special magic numbers for %.63s is: %.15s.",
               names[j], vals[j]);
    }
    const int q = (int)below(r, (uint64_t)nd->n);
    snprintf(nd->question, sizeof nd->question, "What is the special magic number for %.63s "
             "mentioned in the provided text?", names[q]);
    snprintf(nd->prefix, sizeof nd->prefix, "The special magic number for %.63s mentioned in the "
             "provided text is", names[q]);
    if (!(it->refs[it->n_refs++] = strdup(vals[q]))) *ok = false;
  } else { /* vt: one chain of VT_HOPS + 1 variables */
    number(r, 5, val);
    nd->n = VT_HOPS + 1;
    for (int j = 0; j < nd->n; j++) {
      do {
        for (int c = 0; c < 5; c++) names[j][c] = (char)('A' + below(r, 26));
        names[j][5] = 0;
      } while (taken(names, j, names[j]));
      if (j == 0) snprintf(nd->line[0], sizeof nd->line[0], "VAR %.8s = %s", names[0], val);
      else snprintf(nd->line[j], sizeof nd->line[j], "VAR %.8s = VAR %.8s", names[j], names[j - 1]);
      if (!(it->refs[it->n_refs++] = strdup(names[j]))) *ok = false;
    }
    snprintf(nd->question, sizeof nd->question, "Question: Find all variables that are assigned "
             "the value %s in the text above.", val);
    snprintf(nd->prefix, sizeof nd->prefix, "Answer: According to the chain of variable "
             "assignments in the text above, %d variables are assigned the value %s, they are:",
             nd->n, val);
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

tsr_status tsr_ruler_make(enum tsr_ruler_task t, uint64_t seed, int64_t index, int64_t n_filler,
                          struct tsr_ruler_item *it) {
  memset(it, 0, sizeof *it);
  if ((unsigned)t >= 4 || n_filler < 0 || index < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "ruler: task %d, item %lld, %lld filler lines",
                         (int)t, (long long)index, (long long)n_filler);
  struct rng r = {seed + (uint64_t)index * GOLDEN};
  struct needles nd;
  bool ok = true;
  make_needles(t, &r, &nd, it, &ok);
  /* each needle goes before filler line depth[j] (n_filler: after the last), in order */
  uint64_t depth[5];
  for (int j = 0; j < nd.n; j++) depth[j] = below(&r, (uint64_t)n_filler + 1);
  qsort(depth, (size_t)nd.n, sizeof *depth, cmp_u64);
  it->depth = n_filler ? (double)depth[0] / (double)n_filler : 0;
  struct sbuf b = {.ok = true};
  put(&b, k_intro[t]);
  int j = 0;
  for (int64_t i = 0; i <= n_filler; i++) {
    for (; j < nd.n && depth[j] == (uint64_t)i; j++) {
      put(&b, "\n");
      put(&b, nd.line[j]);
    }
    if (i < n_filler) {
      put(&b, "\n");
      put(&b, k_noise);
    }
  }
  put(&b, "\n");
  put(&b, nd.question);
  it->user = b.p;
  if (!(it->answer_prefix = strdup(nd.prefix))) ok = false;
  if (!b.ok || !ok) {
    tsr_ruler_item_free(it);
    return tsr_error_set(TSR_ERR_NOMEM, "ruler: out of memory for %lld filler lines",
                         (long long)n_filler);
  }
  return TSR_OK;
}

void tsr_ruler_item_free(struct tsr_ruler_item *it) {
  free(it->user);
  free(it->answer_prefix);
  for (int i = 0; i < it->n_refs; i++) free(it->refs[i]);
  memset(it, 0, sizeof *it);
}

static bool contains_nocase(const char *hay, const char *needle) {
  const size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
      i++;
    if (i == n) return true;
  }
  return n == 0;
}

double tsr_ruler_score(const struct tsr_ruler_item *it, const char *reply) {
  if (it->n_refs == 0) return 0;
  int found = 0;
  for (int i = 0; i < it->n_refs; i++) found += contains_nocase(reply ? reply : "", it->refs[i]);
  return (double)found / it->n_refs;
}
