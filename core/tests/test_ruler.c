/* RULER-style tasks: seeded generation, needles where they belong, scoring. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quality/ruler.h"
#include "tests/harness.h"

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static void test_same_seed_and_index_give_the_same_item(void) {
  for (int t = TSR_RULER_PASSKEY; t <= TSR_RULER_VT; t++) {
    struct tsr_ruler_item a, b, c;
    CHECK_OK(tsr_ruler_make((enum tsr_ruler_task)t, 7, 3, 40, &a));
    CHECK_OK(tsr_ruler_make((enum tsr_ruler_task)t, 7, 3, 40, &b));
    CHECK_OK(tsr_ruler_make((enum tsr_ruler_task)t, 7, 4, 40, &c));
    CHECK(!strcmp(a.user, b.user) && !strcmp(a.answer_prefix, b.answer_prefix));
    CHECK(strcmp(a.user, c.user) != 0); /* another item: other needles */
    tsr_ruler_item_free(&a), tsr_ruler_item_free(&b), tsr_ruler_item_free(&c);
  }
}

/* The filler length stretches the text; the needles and answers stay. */
static void test_filler_length_keeps_needles_and_answers(void) {
  for (int t = TSR_RULER_PASSKEY; t <= TSR_RULER_VT; t++) {
    struct tsr_ruler_item a, b;
    CHECK_OK(tsr_ruler_make((enum tsr_ruler_task)t, 1, 0, 10, &a));
    CHECK_OK(tsr_ruler_make((enum tsr_ruler_task)t, 1, 0, 1000, &b));
    CHECK(a.n_refs == b.n_refs && !strcmp(a.answer_prefix, b.answer_prefix));
    for (int i = 0; i < a.n_refs; i++) CHECK(!strcmp(a.refs[i], b.refs[i]));
    CHECK(strlen(b.user) > strlen(a.user) + 900 * 80);
    CHECK(count(b.user, "The grass is green.") == 1000);
    tsr_ruler_item_free(&a), tsr_ruler_item_free(&b);
  }
}

static void test_needles_hold_the_expected_answers(void) {
  struct tsr_ruler_item it;
  CHECK_OK(tsr_ruler_make(TSR_RULER_PASSKEY, 5, 2, 200, &it));
  CHECK(it.n_refs == 1 && strlen(it.refs[0]) == 5);
  char needle[96];
  snprintf(needle, sizeof needle, "The pass key is %s. Remember it.", it.refs[0]);
  CHECK(count(it.user, needle) == 1);
  CHECK(!strcmp(it.answer_prefix, "The pass key is"));
  /* the needle sits at its depth: the filler units before it */
  const char *at = strstr(it.user, needle);
  size_t before = 0;
  for (const char *p = strstr(it.user, "The grass"); p && p < at; p = strstr(p + 1, "The grass"))
    before++;
  CHECK_MSG(before == (size_t)(it.depth * 200), "%zu units before, depth %.3f", before, it.depth);
  tsr_ruler_item_free(&it);

  CHECK_OK(tsr_ruler_make(TSR_RULER_NIAH_MULTI, 5, 2, 200, &it));
  CHECK(count(it.user, "One of the special magic numbers for ") == 4);
  CHECK(it.n_refs == 1 && strlen(it.refs[0]) == 7 && strstr(it.user, it.refs[0]));
  tsr_ruler_item_free(&it);

  CHECK_OK(tsr_ruler_make(TSR_RULER_VT, 5, 2, 200, &it));
  CHECK(it.n_refs == 5);
  /* the chain in order: VAR v0 = N, then VAR v(i) = VAR v(i-1), each after the last */
  const char *prev = it.user;
  for (int i = 0; i < 5; i++) {
    char stmt[64];
    if (i == 0) snprintf(stmt, sizeof stmt, "VAR %s = ", it.refs[0]);
    else snprintf(stmt, sizeof stmt, "VAR %s = VAR %s", it.refs[i], it.refs[i - 1]);
    const char *p = strstr(it.user, stmt);
    CHECK_MSG(p && p >= prev, "statement %d '%s' missing or out of order", i, stmt);
    if (p) prev = p;
  }
  tsr_ruler_item_free(&it);
}

static void test_score_is_string_match_all(void) {
  struct tsr_ruler_item it;
  CHECK_OK(tsr_ruler_make(TSR_RULER_VT, 9, 0, 5, &it));
  char reply[256];
  snprintf(reply, sizeof reply, "%s, %s and %s", it.refs[0], it.refs[1], it.refs[2]);
  CHECK(tsr_ruler_score(&it, reply) == 3.0 / 5.0);
  for (char *p = reply; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
  CHECK(tsr_ruler_score(&it, reply) == 3.0 / 5.0); /* case does not matter */
  snprintf(reply, sizeof reply, "%s %s %s %s %s", it.refs[4], it.refs[3], it.refs[2], it.refs[1],
           it.refs[0]);
  CHECK(tsr_ruler_score(&it, reply) == 1.0);
  CHECK(tsr_ruler_score(&it, "") == 0.0);
  tsr_ruler_item_free(&it);
}

static void test_unknown_task_is_named(void) {
  enum tsr_ruler_task t;
  CHECK(tsr_ruler_task_parse("niah", &t) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "niah") && strstr(tsr_error_message(), "passkey"));
  CHECK_OK(tsr_ruler_task_parse("vt", &t));
  CHECK(t == TSR_RULER_VT && !strcmp(tsr_ruler_task_name(t), "vt"));
}

int main(void) {
  TSR_RUN(test_same_seed_and_index_give_the_same_item);
  TSR_RUN(test_filler_length_keeps_needles_and_answers);
  TSR_RUN(test_needles_hold_the_expected_answers);
  TSR_RUN(test_score_is_string_match_all);
  TSR_RUN(test_unknown_task_is_named);
  return TSR_TEST_EXIT();
}
