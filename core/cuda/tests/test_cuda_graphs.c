/*
** The CUDA backend's graph replay decisions (cuda_graphs.h) on the CPU: a compute may
** replay the last one's capture only when their signatures are equal, and any change a
** launch would see (an op parameter, a shape, a stride, a device address, the backend's
** own scratch) changes the signature; graphs with products the backend does not run on
** its own kernels alone (cuBLAS, expert ids read back to the host) or plugin ops whose
** cuda kernel is not declared replayable are not captured, naming the node; the cache of captures keeps several signatures and evicts
** the least recently used.
*/
#include <string.h>

#include "cuda_graphs.h"
#include "harness.h"
#include "abi/op_registry.h"

enum { K = 64, M = 32, E = 4 };

/* A stand-in for the backend's rule (tsr_cuda_product_on_device): products of at most
** 16 columns (or *ctx, when given), expert products of at most 32 pairs. */
static bool gemv_limits(void *ctx, const struct tsr_tensor *t) {
  const int64_t max_n = ctx ? *(const int64_t *)ctx : 16;
  if (t->op == TSR_OP_MAT_MUL) return t->src[1]->ne[1] <= max_n;
  return t->src[2]->ne[0] * t->src[2]->ne[1] <= 32;
}

/* x -> scale -> mat_mul (n columns) -> add; every tensor at a made-up device address */
static struct tsr_graph *decode_like(int64_t n, float scale, char **dptr) {
  static char weights[K * M * 4];
  struct tsr_graph *g = tsr_graph_new(32);
  struct tsr_tensor *w = tsr_new_external(g, TSR_F32, 2, (int64_t[]){K, M}, weights);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, K, n);
  struct tsr_tensor *y = tsr_mat_mul(g, w, tsr_scale(g, x, scale));
  tsr_graph_mark_output(tsr_add(g, y, y));
  for (int i = 0; i < tsr_graph_n_tensors(g); i++) dptr[i] = (char *)(uintptr_t)(0x100000 + 4096 * i);
  return g;
}

static size_t sig(struct tsr_graph *g, char **dptr, const char *extra, unsigned char **buf,
                  size_t *cap) {
  return tsr_cuda_graph_signature(g, dptr, extra, strlen(extra), buf, cap);
}

static void equal_computes_have_equal_signatures_and_changes_show(void) {
  char *d1[32], *d2[32];
  unsigned char *a = NULL, *b = NULL;
  size_t ca = 0, cb = 0;
  struct tsr_graph *g1 = decode_like(1, 0.5f, d1), *g2 = decode_like(1, 0.5f, d2);
  size_t la = sig(g1, d1, "scratch", &a, &ca), lb = sig(g2, d2, "scratch", &b, &cb);
  CHECK(la > 0 && la == lb && !memcmp(a, b, la));
  tsr_graph_free(g2);
  /* an op parameter */
  g2 = decode_like(1, 0.25f, d2);
  lb = sig(g2, d2, "scratch", &b, &cb);
  CHECK(la == lb && memcmp(a, b, la));
  tsr_graph_free(g2);
  /* a shape */
  g2 = decode_like(2, 0.5f, d2);
  lb = sig(g2, d2, "scratch", &b, &cb);
  CHECK(la == lb && memcmp(a, b, la));
  tsr_graph_free(g2);
  /* a device address, and the backend's own bytes */
  g2 = decode_like(1, 0.5f, d2);
  d2[2] += 256;
  lb = sig(g2, d2, "scratch", &b, &cb);
  CHECK(la == lb && memcmp(a, b, la));
  d2[2] -= 256;
  lb = sig(g2, d2, "scratcH", &b, &cb);
  CHECK(la == lb && memcmp(a, b, la));
  lb = sig(g2, d2, "scratch", &b, &cb);
  CHECK(la == lb && !memcmp(a, b, la));
  tsr_graph_free(g2);
  tsr_graph_free(g1);
  free(a), free(b);
}

/* attention without a mask: its positions follow an empty source slot and still count */
static void sources_after_an_empty_slot_are_signed(void) {
  static char kv[2][K * 16 * 4];
  char *d[32];
  unsigned char *a = NULL, *b = NULL;
  size_t ca = 0, cb = 0, la = 0;
  for (int pass = 0; pass < 2; pass++) {
    struct tsr_graph *g = tsr_graph_new(16);
    struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, K, 1, 2);
    struct tsr_tensor *k = tsr_new_external(g, TSR_F32, 3, (int64_t[]){K, 16, 2}, kv[0]);
    struct tsr_tensor *v = tsr_new_external(g, TSR_F32, 3, (int64_t[]){K, 16, 2}, kv[1]);
    struct tsr_tensor *qp = tsr_new_tensor_1d(g, TSR_I32, 1), *kp = tsr_new_tensor_1d(g, TSR_I32, 16);
    struct tsr_attn_params ap = {.scale = 0.125f, .causal = true};
    tsr_graph_mark_output(tsr_flash_attn(g, q, k, v, NULL, qp, kp, &ap));
    for (int i = 0; i < tsr_graph_n_tensors(g); i++) d[i] = (char *)(uintptr_t)(0x100000 + 4096 * i);
    if (pass) d[kp->index] += 64; /* the key positions elsewhere */
    const size_t l = sig(g, d, "", pass ? &b : &a, pass ? &cb : &ca);
    if (!pass) la = l;
    else CHECK(l == la && memcmp(a, b, l));
    tsr_graph_free(g);
  }
  free(a), free(b);
}

static void batched_and_host_reading_graphs_are_not_captured(void) {
  char *d[32], why[160] = "";
  struct tsr_graph *g = decode_like(16, 1.0f, d);
  CHECK(tsr_cuda_graph_capturable(g, gemv_limits, NULL, NULL, why, sizeof why));
  tsr_graph_free(g);
  g = decode_like(17, 1.0f, d);
  CHECK(!tsr_cuda_graph_capturable(g, gemv_limits, NULL, NULL, why, sizeof why));
  CHECK_MSG(strstr(why, "batched product") != NULL, "%s", why);
  /* the backend's word decides: one that multiplies 17 columns on its own kernels */
  int64_t wider = 64;
  CHECK(tsr_cuda_graph_capturable(g, gemv_limits, &wider, NULL, why, sizeof why));
  tsr_graph_free(g);
  /* expert products: 2 slots x 3 tokens pass, 2 x 20 do not */
  static char experts[K * M * E * 4];
  for (int tokens = 3; tokens <= 20; tokens += 17) {
    g = tsr_graph_new(16);
    struct tsr_tensor *w = tsr_new_external(g, TSR_F32, 3, (int64_t[]){K, M, E}, experts);
    struct tsr_tensor *x = tsr_new_tensor_3d(g, TSR_F32, K, 2, tokens);
    struct tsr_tensor *ids = tsr_new_tensor_2d(g, TSR_I32, 2, tokens);
    struct tsr_tensor *y = tsr_mat_mul_id(g, w, x, ids);
    tsr_tensor_set_name(y, "moe_out");
    tsr_graph_mark_output(y);
    const bool ok = tsr_cuda_graph_capturable(g, gemv_limits, NULL, NULL, why, sizeof why);
    CHECK(ok == (tokens == 3));
    if (!ok) CHECK_MSG(strstr(why, "many pairs") && strstr(why, "moe_out"), "%s", why);
    tsr_graph_free(g);
  }
}

static void nothing(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                    const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)ith, (void)nth, (void)dst, (void)src, (void)n_src, (void)params;
}

/* a plugin op is captured only once its cuda kernel is declared replayable, in the
** registry the backend asks (the loader hands it tsr_op_registry_replayable) */
static void plugin_ops_are_captured_once_declared_replayable(void) {
  int32_t id;
  CHECK_OK(tsr_op_registry_add("graphs_test.step", &id));
  CHECK_OK(tsr_op_registry_add_kernel(id, "cpu", nothing, NULL));
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *x = tsr_new_tensor_1d(g, TSR_F32, 8);
  struct tsr_tensor *y = tsr_custom_op(g, id, 1, (int64_t[]){8}, &x, 1, NULL, 0);
  tsr_tensor_set_name(y, "plugin_step");
  tsr_graph_mark_output(y);
  char why[160] = "";
  CHECK(!tsr_cuda_graph_capturable(g, gemv_limits, NULL, NULL, why, sizeof why));
  CHECK_MSG(strstr(why, "not declared replayable") && strstr(why, "plugin_step"), "%s", why);
  /* no cuda kernel yet: nothing to declare, and the op stays uncaptured */
  CHECK(tsr_op_registry_set_replayable(id, "cuda") == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "graphs_test.step") != NULL, "%s", tsr_error_message());
  CHECK(!tsr_cuda_graph_capturable(g, gemv_limits, NULL, tsr_op_registry_replayable, why, sizeof why));
  CHECK_OK(tsr_op_registry_add_kernel(id, "cuda", nothing, NULL));
  CHECK(!tsr_cuda_graph_capturable(g, gemv_limits, NULL, tsr_op_registry_replayable, why, sizeof why));
  CHECK_OK(tsr_op_registry_set_replayable(id, "cuda"));
  CHECK(tsr_op_registry_replayable(id, "cuda") && !tsr_op_registry_replayable(id, "cpu"));
  CHECK_MSG(tsr_cuda_graph_capturable(g, gemv_limits, NULL, tsr_op_registry_replayable, why, sizeof why),
            "%s", why);
  CHECK(!tsr_cuda_graph_capturable(g, gemv_limits, NULL, NULL, why, sizeof why));
  CHECK(tsr_op_registry_set_replayable(id + 1000, "cuda") == TSR_ERR_INVALID_ARG);
  tsr_graph_free(g);
}

static int g_dropped[4];
static void drop_fake(void *exec) { g_dropped[*(int *)exec]++; }

/* Several signatures keep their captures at once; a new one takes an empty slot, then
** the least recently used, whose capture is dropped. */
static void the_cache_keeps_several_captures_and_evicts_the_oldest(void) {
  static int execs[4] = {0, 1, 2, 3};
  struct tsr_cuda_graph_cache c = {.n_slots = 3, .drop = drop_fake};
  const unsigned char a[] = "decode", b[] = "verify of 3", d[] = "verify of 4", e[] = "drafter";
  CHECK(tsr_cuda_graph_find(&c, a, sizeof a) == NULL);
  struct tsr_cuda_graph_slot *sa = tsr_cuda_graph_take(&c, a, sizeof a);
  struct tsr_cuda_graph_slot *sb = tsr_cuda_graph_take(&c, b, sizeof b);
  struct tsr_cuda_graph_slot *sd = tsr_cuda_graph_take(&c, d, sizeof d);
  CHECK(sa && sb && sd && sa != sb && sb != sd && sa != sd);
  sa->exec = &execs[0], sb->exec = &execs[1], sd->exec = &execs[2];
  /* the same bytes find their slot; a prefix or a longer signature does not */
  CHECK(tsr_cuda_graph_find(&c, b, sizeof b) == sb);
  CHECK(tsr_cuda_graph_find(&c, b, sizeof b - 1) == NULL);
  CHECK(tsr_cuda_graph_find(&c, a, sizeof a) == sa); /* now d is the least recently used */
  struct tsr_cuda_graph_slot *se = tsr_cuda_graph_take(&c, e, sizeof e);
  CHECK(se == sd && se->exec == NULL && !se->refused);
  CHECK(g_dropped[2] == 1 && g_dropped[0] == 0 && g_dropped[1] == 0);
  CHECK(tsr_cuda_graph_find(&c, d, sizeof d) == NULL);
  CHECK(tsr_cuda_graph_find(&c, e, sizeof e) == se);
  CHECK(tsr_cuda_graph_find(&c, a, sizeof a)->exec == &execs[0]);
  /* one slot: every new signature replaces the last (graphs as a single capture) */
  struct tsr_cuda_graph_cache one = {.n_slots = 1, .drop = drop_fake};
  tsr_cuda_graph_take(&one, a, sizeof a)->exec = &execs[3];
  CHECK(tsr_cuda_graph_take(&one, b, sizeof b) != NULL && g_dropped[3] == 1);
  CHECK(tsr_cuda_graph_find(&one, a, sizeof a) == NULL);
  tsr_cuda_graph_cache_clear(&one);
  tsr_cuda_graph_cache_clear(&c);
  CHECK(g_dropped[0] == 1 && g_dropped[1] == 1 && g_dropped[2] == 1 && g_dropped[3] == 1);
  CHECK(c.slot[0].sig == NULL && c.slot[0].exec == NULL);
}

int main(void) {
  TSR_RUN(equal_computes_have_equal_signatures_and_changes_show);
  TSR_RUN(sources_after_an_empty_slot_are_signed);
  TSR_RUN(batched_and_host_reading_graphs_are_not_captured);
  TSR_RUN(plugin_ops_are_captured_once_declared_replayable);
  TSR_RUN(the_cache_keeps_several_captures_and_evicts_the_oldest);
  return TSR_TEST_EXIT();
}
