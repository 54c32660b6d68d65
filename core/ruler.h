/*
** RULER-style synthetic long-context tasks (Hsieh et al., "RULER: What's the
** Real Context Size of Your Long-Context Language Models?"), generated
** deterministically from a seed, in RULER's own wording with its "noise"
** haystack (the repeated grass/sky/sun sentences), so figures compare with
** published ones:
**
**  - passkey: one line "The pass key is N. Remember it. N is the pass key."
**    (N has 5 digits) hidden in the haystack; the reply must contain N.
**  - niah_single: one needle "One of the special magic numbers for KEY is:
**    N." (KEY a word pair, N 7 digits); asked for KEY's number.
**  - niah_multi: four such needles with different keys; asked for one.
**  - vt: variable tracking, one chain "VAR A = N." then "VAR B = VAR A." ...
**    (5 variables, 4 hops) spread through the haystack in order; the reply
**    must name all 5 variables.
**
** An item is the user's message (instruction, haystack, question), the
** start of the reply the prompt ends with (RULER's answer prefix) and the
** strings the reply must contain. Which needles, where (as a fraction of the
** haystack) and their values depend only on (task, seed, index); the
** haystack length (n_filler units) only stretches the text around them, so
** one item can be fitted to any context length.
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
  double depth;        /* where the first needle sits in the haystack, 0..1 */
};

/* "passkey", "niah_single", "niah_multi", "vt"; another name is
** TSR_ERR_INVALID_ARG listing them. */
tsr_status tsr_ruler_task_parse(const char *name, enum tsr_ruler_task *out);
const char *tsr_ruler_task_name(enum tsr_ruler_task t);
/* Tokens a reply may need: RULER's generation budget per task, trimmed to
** what the answers here take. */
int32_t tsr_ruler_max_new_tokens(enum tsr_ruler_task t);

/* Item `index` of the task with a haystack of n_filler units. */
tsr_status tsr_ruler_make(enum tsr_ruler_task t, uint64_t seed, int64_t index, int64_t n_filler,
                          struct tsr_ruler_item *it);
void tsr_ruler_item_free(struct tsr_ruler_item *it);

/* string_match_all: the fraction of it->refs that reply contains, ignoring
** ASCII case. */
double tsr_ruler_score(const struct tsr_ruler_item *it, const char *reply);

#endif
