/*
** The bytes of a generated model. Every row of every tensor draws from its
** own generator, seeded by (seed, tensor name, row index), so the file is the
** same whatever the thread count or the writer's block size, and rows can be
** made in parallel: each block the streaming writer asks for is split over
** a thread pool, each thread filling f32 rows and quantizing them with the
** reference quantizer of the tensor's dtype straight into the writer's block.
** Memory: the writer's one block plus one f32 row per thread.
**
** (The qwen3 presets keep the one sequential stream they always had, so
** the build's default model keeps its bytes: see gen_shape.one_stream.)
**
** Normal values come from Box-Muller in single precision over 24-bit
** uniforms (|x| < 5.9 std): exact enough for benchmark weights and several
** times faster than the double-precision transform, which matters for the
** 25 billion values of a full Gemma 4 26B-A4B.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu/threadpool.h"
#include "common/error.h"
#include "gen_model.h"

double gen_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* The generator of row `row` of tensor t: its own, whatever the order rows are made in. */
static uint64_t row_state(const struct gen_tensor *t, uint64_t seed, int64_t row) {
  uint64_t state = seed ^ name_hash(t->name) ^ ((uint64_t)row * 0xd1b54a32d192ed03ull);
  splitmix64(&state);
  return state;
}

/* Row `row` of tensor t as f32 values in x[0..ne0). */
static void fill_row(const struct gen_tensor *t, uint64_t seed, int64_t row, float *x) {
  const int64_t n = t->ne[0];
  if (t->fill == GEN_CONST) {
    for (int64_t i = 0; i < n; i++) x[i] = t->value;
    return;
  }
  if (t->fill == GEN_ROPE_FREQS) {
    for (int64_t i = 0; i < n; i++) x[i] = i < t->n_rot_pairs ? 1.0f : 1e30f;
    return;
  }
  uint64_t state = row_state(t, seed, row);
  const float two_pi = 6.283185307f, inv24 = 1.0f / 16777216.0f;
  for (int64_t i = 0; i < n; i += 2) {
    uint64_t r = splitmix64(&state);
    float u1 = ((float)(r >> 40) + 0.5f) * inv24, u2 = (float)((r >> 16) & 0xffffff) * inv24;
    /* gcc turns the pair into one sincosf */
    float m = t->std * sqrtf(-2.0f * logf(u1)), a = two_pi * u2;
    x[i] = m * cosf(a);
    if (i + 1 < n) x[i + 1] = m * sinf(a);
  }
}

bool gen_codes_supported(enum tsr_dtype dt) {
  return dt == TSR_Q4_0 || dt == TSR_Q8_0 || dt == TSR_Q4_K || dt == TSR_Q6_K;
}

/* Fills n bytes from the generator. */
static void random_bytes(uint64_t *state, unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = splitmix64(state);
    for (size_t k = 0; k < 8 && i + k < n; k++) p[i + k] = (unsigned char)(r >> (8 * k));
  }
}

static void put_half(unsigned char *p, float f) {
  const uint16_t h = tsr_f32_to_f16(f);
  p[0] = (unsigned char)(h & 0xff), p[1] = (unsigned char)(h >> 8);
}

/* A block scale: the std over the codes' own std, times 0.75 .. 1.25 so blocks differ, of
** either sign (codes centred half a step below 0, as q - 8, average out). */
static float block_scale(uint64_t *state, float std, float codes_std) {
  const uint64_t r = splitmix64(state);
  const float f = std / codes_std * (0.75f + 0.5f * (float)(r >> 40) / 16777216.0f);
  return r & 1 ? -f : f;
}

void gen_fill_codes(const struct gen_tensor *t, uint64_t seed, int64_t row, unsigned char *dst) {
  uint64_t state = row_state(t, seed, row);
  const int64_t n_blocks = t->ne[0] / tsr_dtype_block_size(t->dtype);
  const size_t bytes = tsr_dtype_type_size(t->dtype);
  for (int64_t b = 0; b < n_blocks; b++) {
    unsigned char *blk = dst + (size_t)b * bytes;
    random_bytes(&state, blk, bytes); /* the quants; scales are overwritten below */
    switch (t->dtype) {
    case TSR_Q4_0: put_half(blk, block_scale(&state, t->std, 4.61f)); break; /* q - 8 */
    case TSR_Q8_0: put_half(blk, block_scale(&state, t->std, 73.9f)); break;
    case TSR_Q4_K: {
      /* w = d sc q - dmin m: sub-block scales 32..63, mins 0..63, dmin centring the mean
      ** (d 47.5 * 7.5 = dmin 31.5); sd of d sc q - dmin m is 313 d */
      const float d = fabsf(block_scale(&state, t->std, 313.4f)); /* centred by dmin */
      put_half(blk, d);
      put_half(blk + 2, d * (47.5f * 7.5f / 31.5f));
      uint8_t sc[8], m[8], *s = blk + 4;
      const uint64_t rs = splitmix64(&state), rm = splitmix64(&state);
      for (int j = 0; j < 8; j++)
        sc[j] = (uint8_t)(32 + (rs >> (5 * j) & 31)), m[j] = (uint8_t)(rm >> (6 * j) & 63);
      for (int j = 0; j < 4; j++) { /* the packing k4_scale reads */
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
      }
      break;
    }
    case TSR_Q6_K: /* w = d s (q - 32): scales 32..127; sd of s (q - 32) is 1555 */
      for (int j = 0; j < 16; j++) blk[192 + j] = (uint8_t)(32 + blk[192 + j] % 96);
      put_half(blk + 208, block_scale(&state, t->std, 1555.0f));
      break;
    default: break; /* gen_codes_supported */
    }
  }
}

/* The presets' generator (gen_shape.one_stream): xorshift64* and
** double-precision Box-Muller, one normal per two uniforms, every tensor's
** rows drawn in file order from one stream. */
static float stream_normal(uint64_t *rng) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    *rng ^= *rng >> 12, *rng ^= *rng << 25, *rng ^= *rng >> 27;
    u[i] = ((*rng * 0x2545f4914f6cdd1dull >> 11) + 0.5) / 9007199254740992.0;
  }
  return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

static void fill_row_stream(const struct gen_tensor *t, uint64_t *rng, float *x) {
  if (t->fill != GEN_NORMAL) {
    fill_row(t, 0, 0, x);
    return;
  }
  for (int64_t i = 0; i < t->ne[0]; i++) x[i] = t->std * stream_normal(rng);
}

struct job {
  const struct gen_tensor *t;
  struct gen_ctx *g;
  int64_t row0, n_rows;
  size_t row_bytes;
  unsigned char *dst;
};

static void job_rows(void *arg, int ith, int nth) {
  const struct job *j = arg;
  const int64_t per = (j->n_rows + nth - 1) / nth;
  const int64_t a = (int64_t)ith * per, b = a + per < j->n_rows ? a + per : j->n_rows;
  float *x = j->g->scratch + (size_t)ith * (size_t)j->g->max_row;
  for (int64_t r = a; r < b; r++) {
    if (j->g->random_codes && j->t->fill == GEN_NORMAL && gen_codes_supported(j->t->dtype)) {
      gen_fill_codes(j->t, j->g->seed, j->row0 + r, j->dst + (size_t)r * j->row_bytes);
      continue;
    }
    if (j->g->one_stream) fill_row_stream(j->t, &j->g->stream, x); /* nth is 1 */
    else fill_row(j->t, j->g->seed, j->row0 + r, x);
    /* the dtype was checked when the plan was typed: this cannot fail */
    (void)tsr_dtype_from_f32(j->t->dtype, x, j->dst + (size_t)r * j->row_bytes, j->t->ne[0]);
  }
}

static void progress(struct gen_ctx *g, bool last) {
  double now = gen_now();
  if (!g->progress || (!last && now - g->t_last < 0.5)) return;
  g->t_last = now;
  double el = now - g->t_start;
  fprintf(stderr, "\rgen-model: %6.2f / %.2f GiB, %5.1f%%, %.0f MB/s%s", g->done / 1073741824.0,
          g->total / 1073741824.0, g->total ? 100.0 * g->done / g->total : 100.0,
          el > 0 ? g->done / el / 1e6 : 0.0, last ? "\n" : "");
  fflush(stderr);
}

/* The writer's row producer for one tensor. */
static tsr_status produce_rows(void *ctx, int64_t row0, int64_t n_rows, void *dst) {
  struct gen_tensor *t = ctx;
  struct gen_ctx *g = t->g;
  struct job j = {t, g, row0, n_rows, tsr_dtype_row_size(t->dtype, t->ne[0]), dst};
  /* small blocks (norms, scales) are not worth waking the pool for */
  if (g->pool && !g->one_stream && n_rows > 1 && n_rows * t->ne[0] >= 65536)
    tsr_threadpool_run(g->pool, job_rows, &j);
  else
    job_rows(&j, 0, 1);
  g->done += (uint64_t)n_rows * j.row_bytes;
  progress(g, false);
  return TSR_OK;
}

tsr_status gen_ctx_init(struct gen_ctx *g, const struct gen_plan *p, uint64_t seed, int n_threads,
                        bool one_stream) {
  memset(g, 0, sizeof *g);
  g->seed = 0x9e3779b97f4a7c15ull ^ (seed * 0xff51afd7ed558ccdull);
  g->one_stream = one_stream;
  g->stream = 0x9e3779b97f4a7c15ull ^ seed;
  g->n_threads = n_threads > 0 && !one_stream ? n_threads : 1;
  for (int i = 0; i < p->n; i++) {
    if (p->t[i].ne[0] > g->max_row) g->max_row = p->t[i].ne[0];
    g->total += p->t[i].bytes;
  }
  g->max_row += g->max_row & 1; /* normals come in pairs */
  g->scratch = malloc((size_t)g->n_threads * (size_t)g->max_row * sizeof(float));
  if (!g->scratch) return tsr_error_set(TSR_ERR_NOMEM, "gen-model: out of memory");
  if (g->n_threads > 1 && !(g->pool = tsr_threadpool_new(g->n_threads)))
    return tsr_error_set(TSR_ERR_NOMEM, "gen-model: cannot start %d threads", g->n_threads);
  g->progress = isatty(fileno(stderr));
  g->t_start = g->t_last = gen_now();
  return TSR_OK;
}

void gen_ctx_free(struct gen_ctx *g) {
  if (g->progress && g->done) progress(g, true);
  if (g->pool) tsr_threadpool_free(g->pool);
  free(g->scratch);
  memset(g, 0, sizeof *g);
}

tsr_status gen_add_tensors(struct tsr_gguf_writer *w, struct gen_plan *p, struct gen_ctx *g,
                           bool zeros) {
  tsr_status st = TSR_OK;
  for (int i = 0; i < p->n && st == TSR_OK; i++) {
    struct gen_tensor *t = &p->t[i];
    t->g = g;
    /* a shape-only model: matrices zero (holes), the small fixed tensors as they are */
    if (zeros && t->fill == GEN_NORMAL) {
      st = tsr_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, NULL);
      g->total -= t->bytes;
    } else {
      st = tsr_gguf_writer_add_tensor_rows(w, t->name, t->dtype, t->n_dims, t->ne, produce_rows, t);
    }
  }
  return st;
}
