/*
** RULER-style synthetic long-context tasks (Hsieh et al., "RULER: What's the
** Real Context Size of Your Long-Context Language Models?"), generated
** deterministically from (task, seed, item) exactly as the project's training
** script does (tests/reference/train/tasks.py, its noise haystack), so the
** trained reference models are scored on the format they learned:
**
**  - passkey: "The pass key is N. Remember it. N is the pass key." (N has 5
**    digits) among filler lines; the reply must contain N.
**  - niah_single: one needle "One of the special magic numbers for KEY is:
**    N." (KEY an adjective-noun pair, N 7 digits); asked for KEY's number.
**  - niah_multi: four such needles with distinct keys; asked for one.
**  - vt: variable tracking, one chain "VAR A = N" then "VAR B = VAR A" ...
**    (5 variables, 4 hops) in order through the filler; the reply must name
**    all 5 variables.
**
** An item is the user's message (the task's intro line, the filler lines
** with the needles between them, the question, joined by newlines), the
** start of the reply the prompt ends with (the answer prefix; raw text puts
** it after the question and a space) and the strings the reply must contain.
** The needles and their values depend only on (task, seed, item); the
** filler line count moves where they sit, as in tasks.py.
**
** Scoring is RULER's string_match_all: the fraction of the expected strings
** found in the reply, case-insensitively.
*/
#ifndef TSR_RULER_H
#define TSR_RULER_H

#include <stdint.h>

#include "tessera/tessera.h"

enum tsr_ruler_task {
  TSR_RULER_PASSKEY,
  TSR_RULER_NIAH_SINGLE,
  TSR_RULER_NIAH_MULTI,
  TSR_RULER_VT,
};

#define TSR_RULER_MAX_REFS 8

struct tsr_ruler_item {
  char *user;          /* instruction + haystack + question */
  char *answer_prefix; /* the reply starts with this (part of the prompt) */
  char *refs[TSR_RULER_MAX_REFS];
  int n_refs;
  double depth;        /* where the first needle sits among the filler lines, 0..1 */
};

/* "passkey", "niah_single", "niah_multi", "vt"; another name is
** TSR_ERR_INVALID_ARG listing them. */
tsr_status tsr_ruler_task_parse(const char *name, enum tsr_ruler_task *out);
const char *tsr_ruler_task_name(enum tsr_ruler_task t);
/* Tokens a reply may need: RULER's generation budget per task, trimmed to
** what the answers here take. */
int32_t tsr_ruler_max_new_tokens(enum tsr_ruler_task t);

/* Item `index` of the task with n_filler filler lines. */
tsr_status tsr_ruler_make(enum tsr_ruler_task t, uint64_t seed, int64_t index, int64_t n_filler,
                          struct tsr_ruler_item *it);
void tsr_ruler_item_free(struct tsr_ruler_item *it);

/* string_match_all: the fraction of it->refs that reply contains, ignoring
** ASCII case. */
double tsr_ruler_score(const struct tsr_ruler_item *it, const char *reply);

#endif
