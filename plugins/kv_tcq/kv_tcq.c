/*
** kv_tcq: trellis-coded KV codecs turbo2_tcq and turbo3_tcq (formats in tcq.h, for
** users in README.md).
**
** kv_turbo's rotation, as this plugin's own graph hooks (prepare_rows, prepare_q,
** finish_out: the same code, ../kv_turbo/rotation.h), so the tiers compose with any
** attention on any backend. What is stored is the rotated rows' blocks of 64, each a
** Viterbi path through a right-shift trellis and a scale: the CPU writes and reads them
** through encode_rows and decode_f32 here, CUDA through cuda/tcq_cuda.cu (a warp a
** block for the Viterbi encoder, a lift to f16, and a read kernel for K and V both in
** these tiers that decodes in register).
*/
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <tessera/plugin.h>

#include "../kv_turbo/rotation_op.h"
#include "tcq.h"
#include "tcq_codebooks.h"

/* ---- the tiers ------------------------------------------------------------ */

static const float g_book2[256] = {TCQ2_CODEBOOK}, g_book3[512] = {TCQ3_CODEBOOK};
static const char *const g_names[TCQ_TIERS] = {"turbo2_tcq", "turbo3_tcq"};

/* The process's codec configuration: the encoder's arithmetic (f32, which the CUDA
** encoder matches bit for bit, or f64, an audit of the exact least-squares path) and the
** codebooks (compiled in, or files the codebooks setting names). Dtypes are
** process-wide, so every live engine must agree: the first one sets it. */
static struct {
  pthread_mutex_t lock;
  int live;            /* engines using it */
  bool f64;
  char books_dir[1024]; /* "" for the compiled-in books */
  float loaded[TCQ_TIERS][512];
} g_config = {.lock = PTHREAD_MUTEX_INITIALIZER};
static const float *g_books[TCQ_TIERS] = {g_book2, g_book3};

/* A codebook file (tools/codebook_header.py's format): '#' lines, then
** "kv_tcq-codebook 1 NAME N" and N f16-exact values, one a line. */
static tsr_status load_book(const struct tsr_host *h, const char *dir, int tier, float *out) {
  enum { LINE_MAX_BYTES = 4096 };
  char path[1100];
  const int n = tcq_states(tcq_step_bits(tier));
  snprintf(path, sizeof path, "%s/%s.txt", dir, g_names[tier]);
  /* opened without blocking, so a fifo is refused rather than waited on */
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return h->set_error(TSR_ERR_IO, "kv_tcq codebooks: cannot open %s", path);
  struct stat sb;
  FILE *f = NULL;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || !(f = fdopen(fd, "r"))) {
    close(fd);
    return h->set_error(TSR_ERR_IO, "kv_tcq codebooks: %s is not a regular file", path);
  }
  int got = -1, lineno = 0;
  tsr_status s = TSR_OK;
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while (s == TSR_OK && (len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    if (len > LINE_MAX_BYTES) {
      s = h->set_error(TSR_ERR_FORMAT, "kv_tcq codebooks: %s:%d: a line longer than %d bytes",
                       path, lineno, LINE_MAX_BYTES);
      break;
    }
    if ((ssize_t)strlen(line) != len) {
      s = h->set_error(TSR_ERR_FORMAT, "kv_tcq codebooks: %s:%d: a NUL byte", path, lineno);
      break;
    }
    line[strcspn(line, "\r\n")] = 0;
    if (line[0] == '#' || !line[0]) continue;
    if (got < 0) {
      char head[64];
      snprintf(head, sizeof head, "kv_tcq-codebook 1 %s %d", g_names[tier], n);
      if (strcmp(line, head))
        s = h->set_error(TSR_ERR_FORMAT, "kv_tcq codebooks: %s:%d: expected '%s'", path, lineno,
                         head);
      got = 0;
      continue;
    }
    char *end = NULL;
    const float v = strtof(line, &end);
    if (end == line || *end || !isfinite(v) || (float)(_Float16)v != v)
      s = h->set_error(TSR_ERR_FORMAT, "kv_tcq codebooks: %s:%d: '%.40s' is not an f16-exact "
                       "finite number", path, lineno, line);
    else if (got >= n)
      s = h->set_error(TSR_ERR_FORMAT, "kv_tcq codebooks: %s:%d: more than %d values", path,
                       lineno, n);
    else
      out[got++] = v;
  }
  free(line);
  fclose(f);
  if (s == TSR_OK && got != n)
    s = h->set_error(TSR_ERR_FORMAT, "kv_tcq codebooks: %s: %d values, not %d", path,
                     got < 0 ? 0 : got, n);
  return s;
}

/* Joins the process's configuration, or sets it when no engine holds one. */
static tsr_status config_join(const struct tsr_host *h, bool f64, const char *books_dir) {
  pthread_mutex_lock(&g_config.lock);
  tsr_status s = TSR_OK;
  if (g_config.live > 0 && (g_config.f64 != f64 || strcmp(g_config.books_dir, books_dir))) {
    s = h->set_error(TSR_ERR_UNSUPPORTED, "kv_tcq: viterbi %s with codebooks '%s', while "
                     "another engine of this process encodes with viterbi %s and codebooks "
                     "'%s': the codecs are process-wide", f64 ? "f64" : "f32", books_dir,
                     g_config.f64 ? "f64" : "f32", g_config.books_dir);
  } else if (g_config.live == 0) {
    if (strlen(books_dir) >= sizeof g_config.books_dir)
      s = h->set_error(TSR_ERR_INVALID_ARG, "kv_tcq codebooks: the path is too long");
    for (int t = 0; t < TCQ_TIERS && s == TSR_OK && books_dir[0]; t++)
      s = load_book(h, books_dir, t, g_config.loaded[t]);
    if (s == TSR_OK) {
      g_config.f64 = f64;
      snprintf(g_config.books_dir, sizeof g_config.books_dir, "%s", books_dir);
      for (int t = 0; t < TCQ_TIERS; t++)
        g_books[t] = books_dir[0] ? g_config.loaded[t] : t ? g_book3 : g_book2;
    }
  }
  if (s == TSR_OK) g_config.live++;
  pthread_mutex_unlock(&g_config.lock);
  return s;
}

static void config_leave(void) {
  pthread_mutex_lock(&g_config.lock);
  g_config.live--;
  pthread_mutex_unlock(&g_config.lock);
}

/* ---- one block -------------------------------------------------------------- */

/* Sum of f(i) over the 64 values in the CUDA encoder's order: lane l adds values 2l and
** 2l + 1, then the lanes fold by xor 16, 8, 4, 2, 1 (every lane ends with lane 0's sum). */
static double lane_sum(const double sq[TCQ_BLOCK]) {
  double a[32];
  for (int l = 0; l < 32; l++) a[l] = sq[2 * l] + sq[2 * l + 1];
  for (int o = 16; o; o >>= 1) {
    double b[32];
    for (int l = 0; l < 32; l++) b[l] = a[l] + a[l ^ o];
    memcpy(a, b, sizeof a);
  }
  return a[0];
}

/* u = 8 y / |y|; returns |y| (0 for a zero block, not finite for a NaN or inf one). */
static double block_normalize(const float *y, float *u) {
  double sq[TCQ_BLOCK];
  for (int i = 0; i < TCQ_BLOCK; i++) sq[i] = (double)y[i] * y[i];
  const double norm = sqrt(lane_sum(sq));
  const double inv = norm > 0 && isfinite(norm) ? 8.0 / norm : 0.0;
  for (int i = 0; i < TCQ_BLOCK; i++) u[i] = (float)(y[i] * inv);
  return norm;
}

/* The Viterbi's loops in AVX2 where the CPU has it (the same operations, each rounded
** alike: the build contracts no multiply-add). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TCQ_VECTOR __attribute__((target_clones("avx2", "default")))
#else
#define TCQ_VECTOR
#endif

/* The path minimising sum (u_t - book[s_t])^2 over n steps (a block's 64) from
** s_{-1} = 0: the steps o_t, k bits each. A state's predecessors ((s & 63) << k) | p
** share s's low 6 bits, so each step takes 64 minima; a tie takes the lowest p, and the
** final state the lowest index. */
#define VITERBI(NAME, T)                                                                   \
  TCQ_VECTOR static void NAME(const float *book, int k, const float *u, int n_steps,        \
                              uint8_t *steps) {                                            \
    const int n = tcq_states(k), np = 1 << k;                                              \
    T cost[512], best[64];                                                                 \
    uint8_t back[TCQ_BLOCK][64];                                                           \
    for (int s = 0; s < n; s++) cost[s] = s ? (T)INFINITY : 0;                             \
    for (int t = 0; t < n_steps; t++) {                                                    \
      /* p ascending, each m's minimum kept unless strictly beaten: loops that vectorize */ \
      for (int m = 0; m < 64; m++) best[m] = cost[m << k], back[t][m] = 0;                 \
      for (int p = 1; p < np; p++)                                                         \
        for (int m = 0; m < 64; m++) {                                                     \
          const T c = cost[m << k | p];                                                    \
          const bool lower = c < best[m];                                                  \
          best[m] = lower ? c : best[m];                                                   \
          back[t][m] = lower ? (uint8_t)p : back[t][m];                                    \
        }                                                                                  \
      for (int hi = 0; hi < n; hi += 64)                                                   \
        for (int m = 0; m < 64; m++) {                                                     \
          const T d = (T)u[t] - (T)book[hi + m], dd = d * d;                               \
          cost[hi + m] = best[m] + dd;                                                     \
        }                                                                                  \
    }                                                                                      \
    int s = 0;                                                                             \
    for (int i = 1; i < n; i++)                                                            \
      if (cost[i] < cost[s]) s = i;                                                        \
    for (int t = n_steps - 1; t >= 0; t--) {                                               \
      steps[t] = (uint8_t)(s >> TCQ_LOW_BITS);                                             \
      s = (s & 63) << k | back[t][s & 63];                                                 \
    }                                                                                      \
  }
VITERBI(viterbi_f32, float)
VITERBI(viterbi_f64, double)

static void encode_block(int tier, const float *y, uint8_t *block) {
  const int k = tcq_step_bits(tier);
  const float *book = g_books[tier];
  memset(block, 0, (size_t)tcq_block_bytes(k));
  float u[TCQ_BLOCK];
  const double norm = block_normalize(y, u);
  _Float16 scale = 0;
  if (!isfinite(norm)) {
    scale = (_Float16)NAN; /* a NaN or inf row stays visibly broken */
  } else if (norm > 0) {
    uint8_t steps[TCQ_BLOCK];
    if (g_config.f64) viterbi_f64(book, k, u, TCQ_BLOCK, steps);
    else viterbi_f32(book, k, u, TCQ_BLOCK, steps);
    for (int t = 0; t < TCQ_BLOCK; t++) {
      const int bit = k * t;
      block[bit >> 3] |= (uint8_t)(steps[t] << (bit & 7));
      if ((bit & 7) + k > 8) block[(bit >> 3) + 1] |= (uint8_t)(steps[t] >> (8 - (bit & 7)));
    }
    double sq[TCQ_BLOCK];
    for (int t = 0; t < TCQ_BLOCK; t++) {
      const double c = book[tcq_state(block, k, t)];
      sq[t] = c * c;
    }
    const double cc = lane_sum(sq);
    scale = cc > 0 ? (_Float16)(norm / sqrt(cc)) : (_Float16)0;
  }
  memcpy(block + tcq_stream_bytes(k), &scale, 2);
}

static void decode_block(int tier, const uint8_t *block, float *out) {
  const int k = tcq_step_bits(tier);
  const uint16_t bits = tcq_scale_bits(block, k);
  _Float16 h;
  memcpy(&h, &bits, 2);
  const float scale = (float)h;
  for (int t = 0; t < TCQ_BLOCK; t++) out[t] = scale * g_books[tier][tcq_state(block, k, t)];
}

/* ---- the codec's reference functions, each naming its tier (a dtype keeps the first
** registration's for the process) ---------------------------------------------- */

static void encode_rows(int tier, const float *src, void *dst, int64_t n) {
  const int bytes = tcq_block_bytes(tcq_step_bits(tier));
  for (int64_t b = 0; b < n / TCQ_BLOCK; b++)
    encode_block(tier, src + b * TCQ_BLOCK, (uint8_t *)dst + b * bytes);
}

static void decode_f32(int tier, const void *src, float *dst, int64_t n) {
  const int bytes = tcq_block_bytes(tcq_step_bits(tier));
  for (int64_t b = 0; b < n / TCQ_BLOCK; b++)
    decode_block(tier, (const uint8_t *)src + b * bytes, dst + b * TCQ_BLOCK);
}

static void decode_f16(int tier, const void *src, uint16_t *dst, int64_t n) {
  float tmp[TCQ_BLOCK];
  const int bytes = tcq_block_bytes(tcq_step_bits(tier));
  for (int64_t b = 0; b < n / TCQ_BLOCK; b++) {
    decode_block(tier, (const uint8_t *)src + b * bytes, tmp);
    for (int i = 0; i < TCQ_BLOCK; i++) {
      const _Float16 h = (_Float16)tmp[i];
      memcpy(&dst[b * TCQ_BLOCK + i], &h, 2);
    }
  }
}

#define TIER_FNS(T)                                                                       \
  static void encode_rows_##T(void *ctx, const float *src, void *dst, int64_t n) {       \
    (void)ctx;                                                                            \
    encode_rows(T, src, dst, n);                                                          \
  }                                                                                       \
  static void decode_f32_##T(void *ctx, const void *src, float *dst, int64_t n) {        \
    (void)ctx;                                                                            \
    decode_f32(T, src, dst, n);                                                           \
  }                                                                                       \
  static void decode_f16_##T(void *ctx, const void *src, uint16_t *dst, int64_t n) {     \
    (void)ctx;                                                                            \
    decode_f16(T, src, dst, n);                                                           \
  }
TIER_FNS(0)
TIER_FNS(1)
static void (*const g_encode[])(void *, const float *, void *, int64_t) = {encode_rows_0,
                                                                          encode_rows_1};
static void (*const g_decode_f32[])(void *, const void *, float *, int64_t) = {decode_f32_0,
                                                                              decode_f32_1};
static void (*const g_decode_f16[])(void *, const void *, uint16_t *, int64_t) = {
    decode_f16_0, decode_f16_1};

/* ---- the rotation (kv_turbo's) ------------------------------------------------ */

static int32_t g_rotate_op = -1; /* kv_tcq.rotate, registered once a process */

static void rotate_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)n_src;
  const struct tcq_state *st = tcq_state_of(params);
  const bool inverse = params[TURBO_P_INVERSE] != 0;
  const uint64_t done = turbo_rotate_rows_cpu(ith, nth, dst, src, inverse);
  if (done)
    ((const struct tsr_host *)st->host)
        ->engaged(st->self, inverse ? "outputs_unrotated" : "rows_rotated", done);
}

static struct tsr_tensor *rotate(struct tcq_state *st, struct tsr_graph *g, struct tsr_tensor *x,
                                 int64_t out_dim, bool inverse) {
  return turbo_rotate_node(st->host, g, g_rotate_op, st, x, out_dim, inverse);
}

/* ---- dump_blocks: the rotated blocks, for the codebook trainer ------------------ */

/* A record: int32 layer, int32 side (0 K, 1 V), then the block's u = 8 y / |y| as 64
** f32 (tools/train_codebook.py reads them); zero and non-finite blocks are left out. */
enum { DUMP_P_LAYER = 0, DUMP_P_IS_K = 1 };
static int32_t g_dump_op = -1; /* kv_tcq.dump_blocks: the rows as they are, recorded */

static void dump_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                     const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)n_src;
  struct tcq_state *st = tcq_state_of(params);
  const struct tsr_host *h = st->host;
  const int64_t dim = dst->ne[0], rows = dst->ne[1] * dst->ne[2] * dst->ne[3];
  for (int64_t r = ith; r < rows; r += nth) /* contiguous rows in and out */
    memcpy((float *)dst->data + r * dim, (const float *)src[0].data + r * dim,
           sizeof(float) * (size_t)dim);
  if (ith != 0 || !st->dump) return; /* one thread writes, in row order */
  const int32_t head[2] = {params[DUMP_P_LAYER], params[DUMP_P_IS_K] ? 0 : 1};
  uint64_t written = 0;
  for (int64_t b = 0; b < rows * (dim / TCQ_BLOCK) && st->dump_left > 0; b++) {
    float u[TCQ_BLOCK];
    const double norm = block_normalize((const float *)src[0].data + b * TCQ_BLOCK, u);
    if (!(norm > 0) || !isfinite(norm)) continue;
    if (fwrite(head, sizeof head, 1, st->dump) != 1 || fwrite(u, sizeof u, 1, st->dump) != 1) {
      h->log(st->self, TSR_LOG_ERROR, "dump_blocks: writing %s failed; dumping stops",
             st->dump_path);
      st->dump_left = 0;
      break;
    }
    st->dump_left--, written++;
  }
  if (written) h->engaged(st->self, "blocks_dumped", written);
}

static struct tsr_tensor *dump(struct tcq_state *st, struct tsr_graph *g,
                               const struct tsr_kv_codec_site *site, struct tsr_tensor *x) {
  const struct tsr_host *h = st->host;
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  int32_t params[TURBO_P_COUNT] = {site->layer, site->is_k};
  memcpy(&params[TURBO_P_STATE], &st, sizeof st);
  return h->graph->custom_op(g, g_dump_op, xi.n_dims, xi.ne, &x, 1, params, TURBO_P_COUNT);
}

/* ---- the hooks ---------------------------------------------------------------- */

static struct tsr_tensor *prepare_rows(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                       const struct tsr_kv_codec_site *site,
                                       struct tsr_tensor *x) {
  struct tcq_state *st = ctx;
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  struct tsr_tensor *y = rotate(st, g, x, turbo_storage_dim(xi.ne[0]), false);
  return y && st->dump_path ? dump(st, g, site, y) : y;
}

static struct tsr_tensor *prepare_q(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                    const struct tsr_kv_codec_site *site, struct tsr_tensor *q) {
  (void)site;
  struct tsr_tensor_info qi;
  h->graph->tensor_info(q, &qi);
  return rotate(ctx, g, q, turbo_storage_dim(qi.ne[0]), false);
}

static struct tsr_tensor *finish_out(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                     const struct tsr_kv_codec_site *site,
                                     struct tsr_tensor *out) {
  (void)h;
  return rotate(ctx, g, out, site->head_dim, true);
}

/* ---- cuda ------------------------------------------------------------------- */

static struct tcq_cuda_ctx g_cuda; /* the cuda kernels' ctx (tcq.h) */

static bool is_tier(const char *name) {
  return !strcmp(name, g_names[0]) || !strcmp(name, g_names[1]);
}

/* The read kernel takes K and V both in these tiers, stored head dims up to 512. */
static bool reads(void *ctx, const struct tsr_layer_desc *layer) {
  (void)ctx;
  return is_tier(layer->k_codec) && is_tier(layer->v_codec) && layer->head_dim_k > 0 &&
         layer->head_dim_k <= 512 && layer->head_dim_v > 0 && layer->head_dim_v <= 512;
}

/* ---- the plugin ------------------------------------------------------------- */

static const struct tsr_plugin_setting g_settings[] = {
    {"viterbi", TSR_SETTING_ENUM, 0, 0, "f32", "f32|f64",
     "the encoder's arithmetic: f32 (CUDA matches it bit for bit) or f64, an audit of the "
     "exact least-squares path (cpu backend only)"},
    {"dump_blocks", TSR_SETTING_STRING, 1, 0, "", NULL,
     "write each stored block (rotated, scaled to unit variance a value) to this file, for "
     "tools/train_codebook.py (cpu backend only); empty: off"},
    {"dump_max_blocks", TSR_SETTING_INT, 1, 1e9, "400000", NULL,
     "dump_blocks stops after this many blocks"},
    {"codebooks", TSR_SETTING_STRING, 1, 0, "", NULL,
     "a directory of codebook files (turbo2_tcq.txt, turbo3_tcq.txt, as codebooks/ holds) to "
     "use instead of the compiled-in books (cpu backend only); empty: the compiled-in"},
};
#define N_SETTINGS (sizeof g_settings / sizeof g_settings[0])

static tsr_status register_ops(const struct tsr_host *h, struct tsr_plugin *self) {
  int32_t op;
  tsr_status s = TSR_OK;
  if (g_rotate_op < 0) {
    s = h->kernel->register_op(self, "rotate", &op);
    if (s == TSR_OK) s = h->kernel->register_kernel(self, op, "cpu", rotate_cpu, NULL);
    if (s == TSR_OK)
      s = h->kernel->register_kernel_lib(self, op, "cuda", "kv_tcq_cuda.so",
                                         "kv_tcq_rotate_cuda", NULL);
    /* its launches depend on the node alone, and it counts on replay */
    if (s == TSR_OK) s = h->kernel->declare_replayable(self, op, "cuda");
    if (s == TSR_OK) g_rotate_op = op, g_cuda.host = h;
  }
  if (s == TSR_OK && g_dump_op < 0) {
    s = h->kernel->register_op(self, "dump_blocks", &op);
    if (s == TSR_OK) s = h->kernel->register_kernel(self, op, "cpu", dump_cpu, NULL);
    if (s == TSR_OK) g_dump_op = op;
  }
  return s;
}

/* The settings; *cpu_only when one of them runs on the cpu alone. */
static tsr_status settings_init(const struct tsr_host *h, struct tsr_plugin *self,
                                struct tcq_state *st, bool *cpu_only) {
  const char *precision = NULL, *path = NULL, *books = NULL;
  int64_t max_blocks = 0;
  tsr_status s = h->setting_str(self, "viterbi", &precision);
  if (s == TSR_OK) s = h->setting_str(self, "dump_blocks", &path);
  if (s == TSR_OK) s = h->setting_i64(self, "dump_max_blocks", &max_blocks);
  if (s == TSR_OK) s = h->setting_str(self, "codebooks", &books);
  if (s != TSR_OK) return s;
  const bool f64 = !strcmp(precision, "f64");
  *cpu_only = f64 || path[0] || books[0];
  if ((s = config_join(h, f64, books)) != TSR_OK) return s;
  st->joined = true;
  if (!path[0]) return TSR_OK;
  if (!(st->dump_path = strdup(path))) return h->set_error(TSR_ERR_NOMEM, "kv_tcq: out of memory");
  st->dump_left = max_blocks;
  /* a regular file only: a fifo without a reader is refused, not waited on */
  const int fd = open(st->dump_path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || ftruncate(fd, 0) != 0 ||
      fcntl(fd, F_SETFL, 0) != 0 || !(st->dump = fdopen(fd, "wb"))) {
    if (fd >= 0) close(fd);
    return h->set_error(TSR_ERR_IO, "kv_tcq: dump_blocks: cannot write %s (a regular file)",
                        st->dump_path);
  }
  return TSR_OK;
}

static tsr_status tcq_init(const struct tsr_host *h, struct tsr_plugin *self) {
  struct tcq_state *st = calloc(1, sizeof *st);
  if (!st) return h->set_error(TSR_ERR_NOMEM, "kv_tcq: out of memory");
  st->host = h, st->self = self;
  h->set_state(self, st);
  bool cpu_only = false;
  tsr_status s = settings_init(h, self, st, &cpu_only);
  if (s == TSR_OK) s = register_ops(h, self);
  static const char *const encode[] = {"kv_tcq_encode2_cuda", "kv_tcq_encode3_cuda"};
  static const char *const lift[] = {"kv_tcq_lift2_cuda", "kv_tcq_lift3_cuda"};
  /* the f64 audit, dumping and loaded codebooks are the cpu's: profile check refuses
  ** them on another backend */
  for (int t = 0; t < TCQ_TIERS && s == TSR_OK; t++) {
    const struct tsr_kv_codec_kernels cuda = {
        .backend = "cuda",
        .file = "kv_tcq_cuda.so",
        .encode = encode[t],
        .lift = lift[t],
        .ctx = &g_cuda,
        .read = "kv_tcq_read_cuda",
        .reads = reads,
    };
    const int k = tcq_step_bits(t);
    const struct tsr_kv_codec_v1 codec = {
        .struct_size = sizeof codec,
        .name = g_names[t],
        .dtype = TSR_KV_CODEC_OWN_DTYPE,
        .block_size = TCQ_BLOCK,
        .block_bytes = (size_t)tcq_block_bytes(k),
        .backends = cpu_only ? "cpu" : "cpu,cuda",
        .ctx = st,
        .encode_rows = g_encode[t],
        .decode_f16 = g_decode_f16[t],
        .decode_f32 = g_decode_f32[t],
        .storage_dim = turbo_codec_storage_dim,
        .prepare_rows = prepare_rows,
        .prepare_q = prepare_q,
        .finish_out = finish_out,
        .kernels = &cuda,
        .n_kernels = 1,
    };
    s = h->register_kv_codec(self, &codec);
    const struct tsr_kv_codec_v1 *got = s == TSR_OK ? h->find_kv_codec(self, codec.name, 0) : NULL;
    if (got) g_cuda.dtype[t] = got->dtype;
  }
  return s;
}

static void tcq_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  struct tcq_state *st = h->get_state(self);
  if (!st) return;
  if (st->joined) config_leave();
  if (st->dump && fclose(st->dump) != 0)
    h->log(self, TSR_LOG_ERROR, "dump_blocks: closing %s failed", st->dump_path);
  free(st->dump_path);
  free(st);
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_KV_CODEC, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "kv_tcq",
    .version = "1.0.0",
    .description = "trellis-coded KV codecs turbo2_tcq and turbo3_tcq (2.25/3.25 bits a value)",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = N_SETTINGS,
    .init = tcq_init,
    .destroy = tcq_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
