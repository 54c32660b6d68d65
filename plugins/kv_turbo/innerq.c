/*
** InnerQ's channel statistics and scales (innerq.h): the file, read as hostile input.
*/
#include "innerq.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "kv_turbo-innerq 1"

bool innerq_reserve(struct innerq *q, int32_t layer, int32_t dim) {
  struct innerq_layer *l = &q->layer[layer];
  if (l->dim) return l->dim == dim;
  if (!(l->values = calloc((size_t)dim, sizeof *l->values))) return false;
  l->dim = dim;
  return true;
}

void innerq_measure(struct innerq *q, int32_t layer, const float *rows, int32_t dim, int64_t n) {
  struct innerq_layer *l = &q->layer[layer];
  for (int64_t r = 0; r < n; r++)
    for (int32_t c = 0; c < dim; c++) {
      const double x = rows[r * dim + c];
      l->values[c] += x * x;
    }
  l->rows += n;
}

bool innerq_write(const struct innerq *q, const char *path, char *why, size_t n) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) {
    snprintf(why, n, "the path is too long");
    return false;
  }
  const int fd = mkstemp(tmp); /* a new file beside FILE: nothing of the user's is touched */
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    snprintf(why, n, "cannot create %s: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd), remove(tmp);
    return false;
  }
  fprintf(f, "%s\n", MAGIC);
  for (int32_t i = 0; i < INNERQ_MAX_LAYERS; i++) {
    const struct innerq_layer *l = &q->layer[i];
    if (!l->dim || l->rows <= 0) continue;
    fprintf(f, "layer %d dim %d rows %lld\n", (int)i, (int)l->dim, (long long)l->rows);
    for (int32_t c = 0; c < l->dim; c++)
      fprintf(f, "%s%.9g", c ? " " : "", sqrt(l->values[c] / (double)l->rows));
    fputc('\n', f);
  }
  const bool wrote = !ferror(f);
  if (fclose(f) != 0 || !wrote || rename(tmp, path) != 0) {
    snprintf(why, n, "cannot write %s: %s", path, strerror(errno));
    remove(tmp);
    return false;
  }
  return true;
}

/* The next whitespace-separated integer of *s within [lo, hi], or false. */
static bool next_int(char **s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  const long long v = strtoll(*s, &end, 10);
  if (end == *s || errno || v < lo || v > hi) return false;
  *s = end;
  *out = v;
  return true;
}

/* A line holds at most INNERQ_MAX_DIM values of a few dozen characters each. */
#define LINE_MAX_BYTES (1 << 20)

enum line_read { LINE_OK, LINE_EOF, LINE_TOO_LONG, LINE_NUL };

/* The next line of f into buf (cap bytes, terminated, the newline dropped), read a byte at
** a time so that a NUL byte or a line past cap is seen, not hidden or read whole. */
static enum line_read read_line(FILE *f, char *buf, size_t cap) {
  size_t n = 0;
  int c = getc(f);
  if (c == EOF) return LINE_EOF;
  for (; c != EOF && c != '\n'; c = getc(f)) {
    if (c == '\0') return LINE_NUL;
    if (n + 1 == cap) return LINE_TOO_LONG;
    buf[n++] = (char)c;
  }
  buf[n] = '\0';
  return LINE_OK;
}

tsr_status innerq_load(const struct tsr_host *h, struct innerq *q, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return h->set_error(TSR_ERR_IO, "kv_turbo innerq_scales: cannot open %s: %s", path,
                        strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return h->set_error(TSR_ERR_IO, "kv_turbo innerq_scales: %s is not a regular file", path);
  }
  tsr_status st = TSR_OK;
  char *line = malloc(LINE_MAX_BYTES);
  if (!line) st = h->set_error(TSR_ERR_NOMEM, "kv_turbo innerq: out of memory");
  long n_line = 0, records = 0;
  struct innerq_layer *open = NULL; /* a header read, its values line next */
  enum line_read got = LINE_OK;
  while (st == TSR_OK && (got = read_line(f, line, LINE_MAX_BYTES)) != LINE_EOF) {
    n_line++;
    if (got != LINE_OK) {
      st = got == LINE_NUL
               ? h->set_error(TSR_ERR_FORMAT, "%s:%ld: a NUL byte (not a text file)", path,
                              n_line)
               : h->set_error(TSR_ERR_FORMAT, "%s:%ld: a line longer than %d bytes", path,
                              n_line, LINE_MAX_BYTES - 1);
      continue;
    }
    line[strcspn(line, "\r")] = '\0';
    if (n_line == 1) {
      if (strcmp(line, MAGIC))
        st = h->set_error(TSR_ERR_FORMAT, "%s:1: not a kv_turbo InnerQ file (its first "
                          "line must be \"%s\")", path, MAGIC);
      continue;
    }
    if (!open) {
      long long layer, dim, rows;
      char *s = line;
      if (strncmp(s, "layer", 5) || (s += 5, !next_int(&s, 0, INNERQ_MAX_LAYERS - 1, &layer)) ||
          strncmp(s, " dim", 4) || (s += 4, !next_int(&s, 1, INNERQ_MAX_DIM, &dim)) ||
          strncmp(s, " rows", 5) || (s += 5, !next_int(&s, 1, INT64_MAX, &rows)) || *s) {
        st = h->set_error(TSR_ERR_FORMAT, "%s:%ld: expected \"layer L dim D rows R\" (L "
                          "below %d, D 1..%d, R at least 1)", path, n_line, INNERQ_MAX_LAYERS,
                          INNERQ_MAX_DIM);
        continue;
      }
      open = &q->layer[layer];
      if (open->dim) {
        st = h->set_error(TSR_ERR_FORMAT, "%s:%ld: layer %lld a second time", path, n_line,
                          layer);
        continue;
      }
      open->dim = (int32_t)dim, open->rows = rows;
      if (!(open->values = calloc((size_t)dim, sizeof *open->values)))
        st = h->set_error(TSR_ERR_NOMEM, "kv_turbo innerq: out of memory");
      continue;
    }
    char *s = line;
    for (int32_t c = 0; c < open->dim && st == TSR_OK; c++) {
      char *end;
      errno = 0;
      const double v = strtod(s, &end);
      if (end == s || errno || !isfinite(v) || v < 0)
        st = h->set_error(TSR_ERR_FORMAT, "%s:%ld: value %d of %d is not a finite RMS >= 0",
                          path, n_line, (int)c + 1, (int)open->dim);
      open->values[c] = v;
      s = end;
    }
    while (st == TSR_OK && (*s == ' ' || *s == '\t')) s++;
    if (st == TSR_OK && *s)
      st = h->set_error(TSR_ERR_FORMAT, "%s:%ld: more than the %d values of the layer", path,
                        n_line, (int)open->dim);
    open = NULL;
    records++;
  }
  if (st == TSR_OK && ferror(f))
    st = h->set_error(TSR_ERR_IO, "kv_turbo innerq_scales: reading %s: %s", path, strerror(errno));
  if (st == TSR_OK && (open || n_line == 0))
    st = h->set_error(TSR_ERR_FORMAT, "%s: ends %s", path,
                      n_line ? "before a layer's values" : "before its first line");
  if (st == TSR_OK && records == 0)
    st = h->set_error(TSR_ERR_FORMAT, "%s: records no layer", path);
  free(line);
  fclose(f);
  return st;
}

tsr_status innerq_scales(const struct tsr_host *h, const struct innerq *q, int32_t layer,
                         int32_t dim, bool inverse, float *out) {
  const struct innerq_layer *l =
      layer >= 0 && layer < INNERQ_MAX_LAYERS ? &q->layer[layer] : NULL;
  if (!l || !l->dim)
    return h->set_error(TSR_ERR_INVALID_ARG, "kv_turbo innerq_scales: the file has no layer %d "
                        "(calibrated on another model?)", (int)layer);
  if (l->dim != dim)
    return h->set_error(TSR_ERR_INVALID_ARG, "kv_turbo innerq_scales: layer %d has head dim %d "
                        "in the file, %d in the model (calibrated on another model?)",
                        (int)layer, (int)l->dim, (int)dim);
  double mean = 0;
  for (int32_t c = 0; c < dim; c++) mean += l->values[c];
  mean /= dim;
  for (int32_t c = 0; c < dim; c++) {
    /* a channel that never moved takes the largest scale: it adds nothing to the norm */
    double s = l->values[c] > 0 ? pow(mean / l->values[c], q->strength) : q->range;
    s = s > q->range ? q->range : s < 1 / q->range ? 1 / q->range : s;
    out[c] = (float)(inverse ? 1 / s : s);
  }
  return TSR_OK;
}

void innerq_free(struct innerq *q) {
  if (!q) return;
  for (int32_t i = 0; i < INNERQ_MAX_LAYERS; i++) free(q->layer[i].values);
  free(q);
}
