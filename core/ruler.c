/* RULER-style tasks (ruler.h): generation from a seed, and scoring. */
#include "ruler.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char *const k_names[] = {"passkey", "niah_single", "niah_multi", "vt"};

/* RULER's "noise" haystack: one unit. */
static const char k_filler[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

static const char *const k_adjectives[] = {
    "abundant", "bitter", "calm", "dusty", "eager", "fragile", "gentle", "hollow",
    "icy", "jolly", "keen", "loud", "mellow", "narrow", "odd", "proud",
    "quiet", "rapid", "silent", "tidy", "urban", "vivid", "wary", "young"};
static const char *const k_nouns[] = {
    "anchor", "basket", "candle", "desert", "engine", "feather", "garden", "harbor",
    "island", "jacket", "kettle", "ladder", "meadow", "needle", "orchard", "pepper",
    "quarry", "river", "saddle", "tunnel", "violin", "wagon", "yogurt", "zipper"};

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

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t below(uint64_t *s, uint64_t n) { return splitmix(s) % n; }
static double unit(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1.0p-53; }

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

struct needle {
  double depth;
  char text[160];
};

static int by_depth(const void *a, const void *b) {
  double x = ((const struct needle *)a)->depth, y = ((const struct needle *)b)->depth;
  return (x > y) - (x < y);
}

/* n_filler units with the needles at their depths (in order of depth). */
static void haystack(struct sbuf *b, const struct needle *nd, int n, int64_t n_filler) {
  int next = 0;
  for (int64_t u = 0; u <= n_filler; u++) {
    while (next < n && (int64_t)(nd[next].depth * (double)n_filler) <= u) {
      put(b, nd[next++].text);
      put(b, " ");
    }
    if (u < n_filler) put(b, k_filler);
  }
}

static char *dup_str(const char *s, bool *ok) {
  char *d = strdup(s);
  if (!d) *ok = false;
  return d;
}

tsr_status tsr_ruler_make(enum tsr_ruler_task t, uint64_t seed, int64_t index, int64_t n_filler,
                          struct tsr_ruler_item *it) {
  memset(it, 0, sizeof *it);
  if ((unsigned)t >= 4 || n_filler < 0 || index < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "ruler: task %d, item %lld, %lld filler units",
                         (int)t, (long long)index, (long long)n_filler);
  /* every choice below comes from (task, seed, index) alone */
  uint64_t rng = seed ^ (0x51ed270b27f3a1c5ull * (uint64_t)(index + 1)) ^ ((uint64_t)t << 56);
  splitmix(&rng);
  struct needle nd[5];
  int n_needles = 0;
  char question[384], prefix[384], value[16];
  struct sbuf b = {.ok = true};
  bool ok = true;
  if (t == TSR_RULER_PASSKEY) {
    snprintf(value, sizeof value, "%05llu", (unsigned long long)(10000 + below(&rng, 90000)));
    nd[0].depth = unit(&rng);
    snprintf(nd[0].text, sizeof nd[0].text, "The pass key is %s. Remember it. %s is the pass key.",
             value, value);
    n_needles = 1;
    put(&b, "There is an important info hidden inside a lot of irrelevant text. Find it and "
            "memorize it. I will quiz you about the important information there.\n\n");
    snprintf(question, sizeof question, "\n\nWhat is the pass key?");
    snprintf(prefix, sizeof prefix, "The pass key is");
    it->refs[it->n_refs++] = dup_str(value, &ok);
  } else if (t == TSR_RULER_NIAH_SINGLE || t == TSR_RULER_NIAH_MULTI) {
    n_needles = t == TSR_RULER_NIAH_SINGLE ? 1 : 4;
    char keys[4][64];
    const int asked = (int)below(&rng, (uint64_t)n_needles);
    for (int j = 0; j < n_needles; j++) {
      bool fresh;
      do { /* distinct keys: the question must have one answer */
        snprintf(keys[j], sizeof keys[j], "%s-%s", k_adjectives[below(&rng, 24)],
                 k_nouns[below(&rng, 24)]);
        fresh = true;
        for (int q = 0; q < j; q++) fresh = fresh && strcmp(keys[q], keys[j]);
      } while (!fresh);
      char num[16];
      snprintf(num, sizeof num, "%07llu", (unsigned long long)(1000000 + below(&rng, 9000000)));
      nd[j].depth = unit(&rng);
      snprintf(nd[j].text, sizeof nd[j].text, "One of the special magic numbers for %s is: %s.",
               keys[j], num);
      if (j == asked) {
        it->refs[it->n_refs++] = dup_str(num, &ok);
        it->depth = nd[j].depth;
      }
    }
    put(&b, "Some special magic numbers are hidden within the following text. Make sure to "
            "memorize it. I will quiz you about the numbers afterwards.\n");
    snprintf(question, sizeof question, "\nWhat is the special magic number for %s mentioned in "
             "the provided text?", keys[asked]);
    snprintf(prefix, sizeof prefix, "The special magic number for %s mentioned in the provided "
             "text is", keys[asked]);
  } else { /* vt: one chain of 5 variables, in order through the haystack */
    n_needles = 5;
    char names[5][8];
    snprintf(value, sizeof value, "%05llu", (unsigned long long)(10000 + below(&rng, 90000)));
    for (int j = 0; j < 5; j++) {
      bool fresh;
      do {
        for (int c = 0; c < 5; c++) names[j][c] = (char)('A' + below(&rng, 26));
        names[j][5] = 0;
        fresh = true;
        for (int q = 0; q < j; q++) fresh = fresh && strcmp(names[q], names[j]);
      } while (!fresh);
      nd[j].depth = unit(&rng);
    }
    qsort(nd, 5, sizeof *nd, by_depth); /* the chain reads in order */
    for (int j = 0; j < 5; j++) {
      if (j == 0) snprintf(nd[j].text, sizeof nd[j].text, "VAR %s = %s.", names[0], value);
      else snprintf(nd[j].text, sizeof nd[j].text, "VAR %s = VAR %s.", names[j], names[j - 1]);
      it->refs[it->n_refs++] = dup_str(names[j], &ok);
    }
    put(&b, "Memorize and track the chain(s) of variable assignment hidden in the following "
            "text.\n\n");
    snprintf(question, sizeof question, "\nQuestion: Find all variables that are assigned the "
             "value %s in the text above.", value);
    snprintf(prefix, sizeof prefix, "Answer: According to the chain(s) of variable assignment "
             "in the text above, 5 variables are assigned the value %s, they are: ", value);
  }
  if (t != TSR_RULER_NIAH_SINGLE && t != TSR_RULER_NIAH_MULTI) it->depth = nd[0].depth;
  qsort(nd, (size_t)n_needles, sizeof *nd, by_depth);
  haystack(&b, nd, n_needles, n_filler);
  put(&b, question);
  it->user = b.p;
  it->answer_prefix = dup_str(prefix, &ok);
  if (!b.ok || !ok) {
    tsr_ruler_item_free(it);
    return tsr_error_set(TSR_ERR_NOMEM, "ruler: out of memory for %lld filler units",
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
