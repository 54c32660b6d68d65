/*
** decode_policy parameters reaching a kernel, proven with the out-of-tree example
** policy (example_policy/: skip V rows below a threshold on decode steps, with sink
** and recent guards) on the cpu's flash, on a reference fixture: the first 32
** golden tokens are one prefill, the rest decoded a token at a time.
**   - with the guards covering every key nothing is skipped and the logits equal
**     the run without the policy bit for bit, though every V row was weighed;
**   - with a threshold and small guards rows are skipped, the policy's counters
**     say how many, and the logits stay close to exact (the skipped weights are
**     below the threshold against the running max);
**   - profile check refuses the policy where the attention's kernels do not act
**     on decode parameters, naming both.
** usage: test_decode_policy OUT_DIR PLUGIN_DIR MODEL.gguf GOLDEN.gguf
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "common/error.h"
#include "model/gguf.h"
#include "abi/plugin_host.h"
#include "abi/setup.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

enum { PREFILL = 32 };

static const char *g_out, *g_plugins, *g_model;
static struct tsr_test_golden g_gs;

/* A profile; policy NULL: none. */
static const char *profile(const char *policy, const char *extra) {
  static char path[1024];
  static int serial;
  snprintf(path, sizeof path, "%s/policy_%d.yaml", g_out, serial++);
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fprintf(f, "model: %s\ncontext: 256\nubatch: 32\n%splugins:\n  - arch_qwen\n  - attn_dca\n"
          "  - name: example_policy\n    path: %s/example_policy\n%s%s\n", g_model, extra,
          g_plugins, policy ? "    settings: " : "", policy ? policy : "");
  if (policy) fprintf(f, "decode_policies: [example_policy]\n");
  fclose(f);
  return path;
}

struct run_out {
  float *logits; /* [n - PREFILL][vocab]: the decoded tokens' */
  uint64_t read, skipped;
};

static bool run(const char *policy, struct run_out *out) {
  memset(out, 0, sizeof *out);
  struct tsr_engine_options opt = {.profile_path = profile(policy, ""), .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_OK, "policy %s: %s", policy ? policy : "none", tsr_error_message());
  if (st != TSR_OK) return false;
  const int32_t v = g_gs.vocab, n = g_gs.n - PREFILL;
  out->logits = malloc(sizeof(float) * (size_t)v * (size_t)n);
  float *last = malloc(sizeof(float) * (size_t)v);
  st = tsr_engine_eval(e, 0, g_gs.ids, PREFILL, last, NULL);
  for (int32_t i = 0; i < n && st == TSR_OK; i++)
    st = tsr_engine_eval(e, 0, g_gs.ids + PREFILL + i, 1, out->logits + (size_t)i * v, NULL);
  CHECK_MSG(st == TSR_OK, "%s", tsr_error_message());
  const struct tsr_plugin *p =
      tsr_plugin_host_find_plugin(tsr_engine_setup(e)->host, "example_policy");
  if (p) {
    out->read = tsr_plugin_engaged(p, "full.v_rows_read"); /* the fixture's every layer */
    out->skipped = tsr_plugin_engaged(p, "full.v_rows_skipped");
  }
  free(last);
  tsr_engine_free(e);
  return st == TSR_OK;
}

static void test_parameters_reach_the_kernel_and_its_counters_come_back(void) {
  const size_t n = (size_t)(g_gs.n - PREFILL) * (size_t)g_gs.vocab;
  struct run_out none, guarded, skipping;
  if (run(NULL, &none) && run("{threshold: 0.05, sink: 0, recent: 100000}", &guarded) &&
      run("{threshold: 0.05, sink: 1, recent: 4}", &skipping)) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)skipping.logits[i] - none.logits[i]));
    int agree = 0;
    const int32_t rows = g_gs.n - PREFILL;
    for (int32_t r = 0; r < rows; r++)
      agree += tsr_test_argmax(skipping.logits + (size_t)r * g_gs.vocab, g_gs.vocab) ==
               tsr_test_argmax(none.logits + (size_t)r * g_gs.vocab, g_gs.vocab);
    printf("  guarded: %llu rows read, %llu skipped; threshold 0.05, sink 1, recent 4: %llu "
           "read, %llu skipped (%.1f%%), max |logit diff| %.3e, argmax agrees at %d of %d\n",
           (unsigned long long)guarded.read, (unsigned long long)guarded.skipped,
           (unsigned long long)skipping.read, (unsigned long long)skipping.skipped,
           100.0 * (double)skipping.skipped / (double)(skipping.read ? skipping.read : 1), d,
           agree, rows);
    CHECK(none.read == 0 && none.skipped == 0);
    CHECK(guarded.read > 0 && guarded.skipped == 0);
    CHECK(!memcmp(guarded.logits, none.logits, n * sizeof(float)));
    CHECK(skipping.read == guarded.read && skipping.skipped > 0);
    CHECK_MSG(d > 0 && d < 1.0, "skipping moved logits by %.3e", d);
    CHECK(agree >= rows * 9 / 10);
  }
  free(none.logits), free(guarded.logits), free(skipping.logits);
}

static void expect_refused(const char *extra, const char *want) {
  struct tsr_engine_options opt = {.profile_path = profile("{threshold: 0.05}", extra),
                                   .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_ERR_UNSUPPORTED && strstr(tsr_error_message(), want) &&
                strstr(tsr_error_message(), "decode policy example_policy"),
            "%s: status %d, '%s'", extra, st, tsr_error_message());
  tsr_engine_free(e);
}

/* On cuda the GQA decode kernel skips V rows: a K/V pair it has no kernel for, or the
** kernel turned off, is refused before anything is allocated. */
static void test_a_policy_the_attention_cannot_act_on_is_refused_naming_both(void) {
  const char *q5 = "backend: cuda\nkv: {k: q5_0, v: q5_0}\n";
  expect_refused(q5, "attention flash (core");
  expect_refused(q5, "on backend cuda");
  expect_refused("backend: cuda\nattention: dca\nkv: {k: q5_0, v: q5_0}\n",
                 "attention dca (attn_dca");
  expect_refused("backend: {name: cuda, attention: {decode: tile}}\n",
                 "backend.attention.decode turns off");
  expect_refused("backend: {name: cuda, precision: f32}\n",
                 "backend.precision f32 computes in f32 only");
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s OUT_DIR PLUGIN_DIR MODEL.gguf GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_out = argv[1], g_plugins = argv[2], g_model = argv[3];
  struct tsr_gguf *gold = NULL;
  if (!tsr_test_golden_seq0(argv[4], PREFILL + 8, &gold, &g_gs)) return 2;
  TSR_RUN(test_parameters_reach_the_kernel_and_its_counters_come_back);
  TSR_RUN(test_a_policy_the_attention_cannot_act_on_is_refused_naming_both);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
