/*
** InnerQ's statistics file and scales (innerq.h) on their own: sums of squares
** written as RMS and read back, the scale formula with its clamp, and every
** malformed file refused with its line named.
** usage: test_innerq DIR (a scratch folder)
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../innerq.h"
#include "abi/plugin_host.h"
#include "common/error.h"
#include "tests/harness.h"

static const char *g_dir;

static const char *write_file(const char *name, const char *text) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "w");
  if (f) fputs(text, f), fclose(f);
  return path;
}

static struct innerq *new_innerq(double strength, double range) {
  struct innerq *q = calloc(1, sizeof *q);
  if (q) q->strength = strength, q->range = range;
  return q;
}

static void test_rms_written_and_read_back(void) {
  const struct tsr_host *h = tsr_plugin_host_services();
  struct innerq *q = new_innerq(0.5, 2);
  /* layer 3, dim 4: rows (1, 4, 0, 16) and (-1, -4, 0, 16): RMS 1, 4, 0, 16 */
  const float rows[8] = {1, 4, 0, 16, -1, -4, 0, 16};
  CHECK(innerq_reserve(q, 3, 4));
  CHECK(!innerq_reserve(q, 3, 8)); /* one head dim a layer */
  innerq_measure(q, 3, rows, 4, 1);
  innerq_measure(q, 3, rows + 4, 4, 1);
  char path[1024], why[256];
  snprintf(path, sizeof path, "%s/k.innerq", g_dir);
  CHECK_MSG(innerq_write(q, path, why, sizeof why), "%s", why);
  innerq_free(q);

  q = new_innerq(0.5, 2);
  CHECK_OK(innerq_load(h, q, path));
  CHECK(q->layer[3].dim == 4 && q->layer[3].rows == 2 && !q->layer[0].dim);
  const double rms[4] = {1, 4, 0, 16};
  for (int c = 0; c < 4; c++) CHECK(fabs(q->layer[3].values[c] - rms[c]) < 1e-9);
  /* mean RMS 5.25: (5.25/1)^0.5 = 2.29 clamped to 2; (5.25/4)^0.5; a channel that never
  ** moved the largest scale; (5.25/16)^0.5 */
  float s[4], inv[4];
  CHECK_OK(innerq_scales(h, q, 3, 4, false, s));
  CHECK_OK(innerq_scales(h, q, 3, 4, true, inv));
  const double want[4] = {2, sqrt(5.25 / 4), 2, sqrt(5.25 / 16)};
  for (int c = 0; c < 4; c++) {
    CHECK_MSG(fabsf(s[c] - (float)want[c]) < 1e-6f, "scale %d: %g, want %g", c, s[c], want[c]);
    CHECK(fabsf(inv[c] - (float)(1 / want[c])) < 1e-6f);
  }
  q->strength = 1, q->range = 64; /* the full power: mean / rms */
  CHECK_OK(innerq_scales(h, q, 3, 4, false, s));
  CHECK(fabsf(s[1] - 5.25f / 4) < 1e-6f && fabsf(s[3] - 5.25f / 16) < 1e-6f);
  CHECK_ERR_HAS(innerq_scales(h, q, 2, 4, false, s), "has no layer 2");
  CHECK_ERR_HAS(innerq_scales(h, q, 3, 8, false, s), "layer 3 has head dim 4 in the file, 8");
  innerq_free(q);

  snprintf(path, sizeof path, "%s/no/such/dir/k.innerq", g_dir);
  q = new_innerq(0.5, 2);
  CHECK(innerq_reserve(q, 0, 4));
  innerq_measure(q, 0, rows, 4, 2);
  CHECK(!innerq_write(q, path, why, sizeof why) && strstr(why, "cannot create"));
  innerq_free(q);
}

static void test_malformed_files_are_refused(void) {
  const struct tsr_host *h = tsr_plugin_host_services();
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"", "ends before its first line"},
      {"kv_turbo-innerq 2\n", ":1: not a kv_turbo InnerQ file"},
      {"kv_turbo-innerq 1\n", "records no layer"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n", "ends before a layer's values"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 2 3\n", ":3: more than the 2 values"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1\n", ":3: value 2 of 2"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 -2\n", ":3: value 2 of 2"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 nan\n", ":3: value 2 of 2"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 1e999\n", ":3: value 2 of 2"},
      {"kv_turbo-innerq 1\nlayer 4096 dim 2 rows 1\n1 1\n", ":2: expected \"layer L dim D"},
      {"kv_turbo-innerq 1\nlayer -1 dim 2 rows 1\n1 1\n", ":2: expected"},
      {"kv_turbo-innerq 1\nlayer 0 dim 0 rows 1\n\n", ":2: expected"},
      {"kv_turbo-innerq 1\nlayer 0 dim 4097 rows 1\n", ":2: expected"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 0\n1 1\n", ":2: expected"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1 more\n1 1\n", ":2: expected"},
      {"kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 1\nlayer 0 dim 2 rows 1\n1 1\n",
       ":4: layer 0 a second time"},
      {"kv_turbo-innerq 1\nlayers 0 dim 2 rows 1\n1 1\n", ":2: expected"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct innerq *q = new_innerq(0.5, 2);
    const char *path = write_file("bad.innerq", cases[i].text);
    tsr_status st = innerq_load(h, q, path);
    CHECK_MSG(st != TSR_OK && strstr(tsr_error_message(), cases[i].want), "case %zu: status %d, "
              "'%s', want '%s'", i, (int)st, tsr_error_message(), cases[i].want);
    innerq_free(q);
  }
  struct innerq *q = new_innerq(0.5, 2);
  char missing[1024];
  snprintf(missing, sizeof missing, "%s/absent.innerq", g_dir);
  CHECK_ERR_HAS(innerq_load(h, q, missing), "cannot open");
  innerq_free(q);
  /* not a regular file: a folder, a device that never ends a line */
  q = new_innerq(0.5, 2);
  CHECK_ERR_HAS(innerq_load(h, q, g_dir), "is not a regular file");
  innerq_free(q);
  q = new_innerq(0.5, 2);
  CHECK_ERR_HAS(innerq_load(h, q, "/dev/zero"), "is not a regular file");
  innerq_free(q);
  /* a line past any real file's: refused, not read whole */
  {
    char path[1024];
    snprintf(path, sizeof path, "%s/long.innerq", g_dir);
    FILE *f = fopen(path, "w");
    if (f) {
      fputs("kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n", f);
      for (int i = 0; i < (1 << 20) / 4 + 16; i++) fputs("1 1 ", f);
      fclose(f);
    }
    q = new_innerq(0.5, 2);
    CHECK_ERR_HAS(innerq_load(h, q, path), ":3: a line longer than");
    innerq_free(q);
  }
  /* a NUL byte would end a C string early and hide what follows it: refused */
  {
    char path[1024];
    snprintf(path, sizeof path, "%s/nul.innerq", g_dir);
    FILE *f = fopen(path, "wb");
    if (f) {
      static const char text[] = "kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 1\0 junk\n";
      fwrite(text, 1, sizeof text - 1, f);
      fclose(f);
    }
    q = new_innerq(0.5, 2);
    CHECK_ERR_HAS(innerq_load(h, q, path), ":3: a NUL byte");
    innerq_free(q);
  }
  /* CRLF lines and trailing blanks are read as the same file */
  q = new_innerq(0.5, 2);
  CHECK_OK(innerq_load(h, q, write_file("crlf.innerq", "kv_turbo-innerq 1\r\nlayer 1 dim 2 "
                                        "rows 5\r\n0.5 2 \r\n")));
  CHECK(q->layer[1].dim == 2 && q->layer[1].values[1] == 2);
  innerq_free(q);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  mkdir(g_dir, 0755);
  TSR_RUN(test_rms_written_and_read_back);
  TSR_RUN(test_malformed_files_are_refused);
  return TSR_TEST_EXIT();
}
