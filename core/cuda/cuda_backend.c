/*
** The CUDA backend: opening the GPU, the device memory that mirrors a
** planned graph, and running its nodes in order on one stream.
**
** Memory (README.md says it at length): the graph is planned into a host
** arena as for the cpu backend; a device arena of the same size holds every
** planned tensor at the same offset. External tensors in ranges the caller
** kept (tsr_backend_keep: weights, KV cache, recurrent state) are uploaded the
** first time a graph uses them; from then on the device copy is the
** authoritative one. Other external tensors are uploaded for each compute
** and copied back when a node wrote into them. Inputs (planned leaves the
** host fills) are uploaded at every compute, outputs downloaded after it.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "cuda_graphs.h"
#include "cuda_internal.h"

#ifndef TSR_CUDA_ARCH
#define TSR_CUDA_ARCH 90
#endif

extern const struct tsr_cuda_host *tsr_cuda_host_table; /* cuda_shim.c */

/* Errors after which every later CUDA call of the process fails too. */
static bool poisons_context(cudaError_t e) {
  return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
         e == cudaErrorMisalignedAddress || e == cudaErrorIllegalInstruction ||
         e == cudaErrorHardwareStackError || e == cudaErrorInvalidPc || e == cudaErrorAssert;
}

tsr_status tsr_cuda_rt_fail(int err, const char *call, const char *file, int line) {
  cudaError_t e = (cudaError_t)err;
  tsr_status st = e == cudaErrorMemoryAllocation ? TSR_ERR_NOMEM : TSR_ERR_INTERNAL;
  return tsr_error_set(st, "cuda backend: %s failed: %s (%s) at %s:%d%s", call, cudaGetErrorName(e),
                       cudaGetErrorString(e), file, line,
                       poisons_context(e) ? " [a kernel fault: the CUDA context is unusable from "
                       "now on; the first failing op is the culprit, backend.sync: true names it]"
                       : "");
}

tsr_status tsr_cuda_blas_fail(int s, const char *call, const char *file, int line) {
  cublasStatus_t b = (cublasStatus_t)s;
  tsr_status st = b == CUBLAS_STATUS_ALLOC_FAILED ? TSR_ERR_NOMEM : TSR_ERR_INTERNAL;
  return tsr_error_set(st, "cuda backend: %s failed: %s (%s) at %s:%d", call, cublasGetStatusName(b),
                       cublasGetStatusString(b), file, line);
}

/* Every device allocation of the backend goes through these two, so that
** `tessera bench` can say how much it holds. */
static cudaError_t dev_alloc(struct cu_ctx *c, void **p, size_t n) {
  cudaError_t e = cudaMalloc(p, n);
  if (e == cudaSuccess && (c->held_bytes += n) > c->held_peak) c->held_peak = c->held_bytes;
  return e;
}

static cudaError_t dev_free(struct cu_ctx *c, void *p, size_t n) {
  if (!p) return cudaSuccess;
  c->held_bytes -= n;
  return cudaFree(p);
}

tsr_status tsr_cuda_scratch(struct cu_ctx *c, enum cu_scratch_slot slot, size_t bytes, void **out) {
  if (bytes > c->scratch_cap[slot] && c->capturing) /* growing waits for the stream */
    return tsr_error_set(TSR_ERR_INTERNAL, "cuda backend: scratch %d must grow to %zu bytes "
                         "inside a graph capture", (int)slot, bytes);
  if (bytes > c->scratch_cap[slot]) {
    size_t cap = bytes + bytes / 4;
    CU_RT(cudaStreamSynchronize(c->stream)); /* earlier launches may still read it */
    CU_RT(dev_free(c, c->scratch[slot], c->scratch_cap[slot]));
    c->scratch[slot] = NULL;
    c->scratch_cap[slot] = 0;
    CU_RT(dev_alloc(c, &c->scratch[slot], cap));
    c->scratch_cap[slot] = cap;
  }
  *out = c->scratch[slot];
  return TSR_OK;
}

/* ---- external memory --------------------------------------------------------
** Two kinds (README.md, "Memory model"). Kept ranges (tsr_backend_keep) get a
** device copy at their first use that stays authoritative until forget. Any
** other external tensor is uploaded for the compute that uses it and, when a
** node writes into it, copied back afterwards: nothing is looked up by host
** address alone, so host memory freed and reused at the same address (a
** test's buffers, a graph's index arrays) can never meet a stale copy. */

/* Index of the first kept range whose end lies past p. */
static int region_lower(const struct cu_ctx *c, const char *p) {
  int lo = 0, hi = c->n_regions;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (c->regions[mid].host + c->regions[mid].size <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static tsr_status cu_keep(void *ctx, const void *host, size_t size) {
  struct cu_ctx *c = ctx;
  const char *p = host, *end = p + size;
  if (!host || !size) return TSR_OK;
  int i = region_lower(c, p);
  if (i < c->n_regions && c->regions[i].host < end) {
    const struct cu_region *r = &c->regions[i];
    if (r->host <= p && end <= r->host + r->size) return TSR_OK; /* already kept */
    return tsr_error_set(TSR_ERR_INVALID_ARG, "cuda backend: keeping host memory [%p, +%zu) that "
                         "partly overlaps the kept range [%p, +%zu); forget that one first",
                         host, size, (const void *)r->host, r->size);
  }
  if (c->n_regions + 1 > c->cap_regions) {
    int cap = c->cap_regions ? 2 * c->cap_regions : 64;
    struct cu_region *nr = realloc(c->regions, (size_t)cap * sizeof *nr);
    if (!nr) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
    c->regions = nr;
    c->cap_regions = cap;
  }
  memmove(&c->regions[i + 1], &c->regions[i], (size_t)(c->n_regions - i) * sizeof *c->regions);
  c->regions[i] = (struct cu_region){p, size, NULL};
  c->n_regions++;
  return TSR_OK;
}

/* Copies the part of [host, host + size) that kept ranges with a device copy
** hold, in the direction asked for; the rest has no device copy to differ. */
static tsr_status region_copy(struct cu_ctx *c, const char *p, size_t size, bool to_host) {
  const char *end = p + size;
  CU_RT(cudaStreamSynchronize(c->stream));
  for (int i = region_lower(c, p); i < c->n_regions && c->regions[i].host < end; i++) {
    const struct cu_region *r = &c->regions[i];
    if (!r->dev) continue;
    const char *a = r->host > p ? r->host : p;
    const char *b = r->host + r->size < end ? r->host + r->size : end;
    if (to_host)
      CU_RT(cudaMemcpy((char *)a, r->dev + (a - r->host), (size_t)(b - a), cudaMemcpyDeviceToHost));
    else
      CU_RT(cudaMemcpy(r->dev + (a - r->host), a, (size_t)(b - a), cudaMemcpyHostToDevice));
  }
  return TSR_OK;
}

static tsr_status cu_sync_to_host(void *ctx, void *host, size_t size) {
  return region_copy(ctx, host, size, true);
}

static tsr_status cu_sync_to_device(void *ctx, const void *host, size_t size) {
  return region_copy(ctx, host, size, false);
}

static void cu_forget(void *ctx, const void *host, size_t size) {
  struct cu_ctx *c = ctx;
  const char *p = host, *end = p + size;
  cudaStreamSynchronize(c->stream);
  int i = region_lower(c, p), j = i;
  while (j < c->n_regions && c->regions[j].host < end) {
    dev_free(c, c->regions[j].dev, c->regions[j].size);
    j++;
  }
  memmove(&c->regions[i], &c->regions[j], (size_t)(c->n_regions - j) * sizeof *c->regions);
  c->n_regions -= j - i;
}

/* ---- running a graph ---------------------------------------------------------- */

static const struct tsr_tensor *owner_of(const struct tsr_tensor *t) {
  return t->view_src ? t->view_src : t;
}

static bool is_external(const struct tsr_graph *g, const struct tsr_tensor *t) {
  return !t->view_src && g->offsets[t->index] == TSR_NO_OFFSET && (t->flags & TSR_FLAG_WEIGHT);
}

/* The device copy of kept external tensor t: the kept range holding it,
** uploaded whole at its first use. *found is false when no kept range
** touches t; a range that holds only part of it is an error. */
static tsr_status kept_address(struct cu_ctx *c, const struct tsr_tensor *t, char **dev,
                               bool *found) {
  const char *p = t->data;
  const size_t n = tsr_tensor_nbytes(t);
  *found = false;
  int i = region_lower(c, p);
  if (i >= c->n_regions || c->regions[i].host >= p + n) return TSR_OK;
  struct cu_region *r = &c->regions[i];
  if (!(r->host <= p && p + n <= r->host + r->size))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "cuda backend: external tensor '%s' [%p, +%zu) lies "
                         "partly inside the kept range [%p, +%zu); keep all of it or none",
                         t->name, (const void *)p, n, (const void *)r->host, r->size);
  if (!r->dev) {
    cudaError_t e = dev_alloc(c, (void **)&r->dev, r->size);
    if (e != cudaSuccess) {
      r->dev = NULL;
      return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes of device "
                           "memory for the kept range holding '%s' (%s)", r->size, t->name,
                           cudaGetErrorString(e));
    }
    CU_RT(cudaMemcpyAsync(r->dev, r->host, r->size, cudaMemcpyHostToDevice, c->stream));
  }
  *dev = r->dev + (p - r->host);
  *found = true;
  return TSR_OK;
}

static int span_cmp(const void *a, const void *b) {
  const struct cu_span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The span holding address p, or NULL (spans are merged and sorted). */
static struct cu_span *span_of(struct cu_ctx *c, const char *p) {
  int lo = 0, hi = c->n_spans;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (c->spans[mid].hi <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo < c->n_spans && c->spans[lo].lo <= p ? &c->spans[lo] : NULL;
}

/* Device addresses of every tensor of g, in c->dptr. Owners first: arena
** tensors, then external ones (kept ranges, else this compute's staging,
** uploaded here); views last, as owner + offset. Nothing is freed or moved
** once an address is handed out, so no address goes stale within a compute. */
static tsr_status resolve(struct cu_ctx *c, struct tsr_graph *g) {
  if (g->n > c->dptr_cap || g->n > c->cap_spans) {
    char **d = realloc(c->dptr, (size_t)g->n * sizeof *d);
    if (d) c->dptr = d, c->dptr_cap = g->n;
    struct cu_span *sp = d ? realloc(c->spans, (size_t)g->n * sizeof *sp) : NULL;
    if (sp) c->spans = sp, c->cap_spans = g->n;
    if (!d || !sp) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
  }
  c->n_spans = 0;
  for (int i = 0; i < g->n; i++) {
    struct tsr_tensor *t = &g->tensors[i];
    c->dptr[i] = NULL;
    if (t->view_src) continue;
    if (g->offsets[i] != TSR_NO_OFFSET) {
      c->dptr[i] = c->arena + g->offsets[i];
      continue;
    }
    if (!is_external(g, t) || !t->data)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "cuda backend: tensor '%s' has no memory; plan "
                           "and bind the graph first", t->name);
    bool kept = false;
    tsr_status st = kept_address(c, t, &c->dptr[i], &kept);
    if (st != TSR_OK) return st;
    if (!kept && !tsr_tensor_nbytes(t)) c->dptr[i] = c->arena; /* empty: never read */
    else if (!kept)
      c->spans[c->n_spans++] = (struct cu_span){t->data, (const char *)t->data + tsr_tensor_nbytes(t),
                                                0, false};
  }
  /* unkept external memory: merge overlapping ranges, stage them back to back */
  if (c->n_spans) {
    qsort(c->spans, (size_t)c->n_spans, sizeof *c->spans, span_cmp);
    int m = 0;
    for (int k = 1; k < c->n_spans; k++) {
      if (c->spans[k].lo < c->spans[m].hi) {
        if (c->spans[k].hi > c->spans[m].hi) c->spans[m].hi = c->spans[k].hi;
      } else {
        c->spans[++m] = c->spans[k];
      }
    }
    c->n_spans = m + 1;
    size_t total = 0;
    for (int k = 0; k < c->n_spans; k++) {
      c->spans[k].off = total;
      total += ((size_t)(c->spans[k].hi - c->spans[k].lo) + 255) & ~(size_t)255;
    }
    void *stage = NULL;
    tsr_status st = tsr_cuda_scratch(c, SCR_STAGE, total, &stage);
    if (st != TSR_OK) return st;
    for (int k = 0; k < c->n_spans; k++)
      CU_RT(cudaMemcpyAsync((char *)stage + c->spans[k].off, c->spans[k].lo,
                            (size_t)(c->spans[k].hi - c->spans[k].lo), cudaMemcpyHostToDevice,
                            c->stream));
    for (int i = 0; i < g->n; i++) {
      const struct tsr_tensor *t = &g->tensors[i];
      if (c->dptr[i] || t->view_src || !is_external(g, t) || !tsr_tensor_nbytes(t)) continue;
      const struct cu_span *sp = span_of(c, t->data);
      if (sp) c->dptr[i] = (char *)stage + sp->off + ((const char *)t->data - sp->lo);
    }
    /* spans a node writes into go back to the host after the compute; a
    ** plugin kernel may write into any of its sources (a state carried in
    ** place, plugin.h), so theirs go back too */
    for (int i = 0; i < g->n; i++) {
      const struct tsr_tensor *t = &g->tensors[i];
      if (!tsr_op_computes(t)) continue;
      if (t->view_src && is_external(g, t->view_src)) {
        struct cu_span *sp = span_of(c, t->view_src->data);
        if (sp) sp->written = true;
      }
      for (int k = 0; t->op == TSR_OP_CUSTOM && k < TSR_MAX_SRC && t->src[k]; k++) {
        const struct tsr_tensor *o = owner_of(t->src[k]);
        struct cu_span *sp = is_external(g, o) ? span_of(c, t->src[k]->data) : NULL;
        if (sp) sp->written = true;
      }
    }
  }
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (!t->view_src) continue;
    const char *base = c->dptr[t->view_src->index];
    if (!base)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "cuda backend: view '%s' of '%s', which has no "
                           "memory", t->name, t->view_src->name);
    c->dptr[i] = (char *)base + t->view_offs;
  }
  return TSR_OK;
}

static struct cu_t cu_of(const struct cu_ctx *c, const struct tsr_tensor *t) {
  struct cu_t r = {0};
  if (!t) return r;
  r.p = c->dptr[t->index];
  r.type = (int32_t)t->dtype;
  for (int d = 0; d < 4; d++) r.ne[d] = t->ne[d], r.nb[d] = (int64_t)t->nb[d];
  return r;
}

static tsr_status call_kernel(struct cu_ctx *c, int32_t op_id, const struct tsr_tensor *dst_t,
                              const struct tsr_tensor *const *src_t, int n_src,
                              const int32_t *params, int64_t graph);

static tsr_status run_attention(struct cu_ctx *c, const struct tsr_tensor *t) {
  const int32_t read_op = tsr_cuda_codec_read_op(c, t);
  if (read_op >= 0) /* a codec's own kernel reads its rows in register */
    return call_kernel(c, read_op, t, (const struct tsr_tensor *const *)t->src, 6, t->op_params,
                       c->capturing ? TSR_DEVICE_CALL_CAPTURE : TSR_DEVICE_CALL_EAGER);
  struct cu_t dst = cu_of(c, t);
  struct cu_attn a = {
      .q = cu_of(c, t->src[0]), .k = cu_of(c, t->src[1]), .v = cu_of(c, t->src[2]),
      .mask = cu_of(c, t->src[3]), .q_pos = cu_of(c, t->src[4]), .kv_pos = cu_of(c, t->src[5]),
      .scale = tsr_param_f32(t, 0), .softcap = tsr_param_f32(t, 1),
      .causal = t->op_params[2] != 0, .window = t->op_params[3], .pipelined = c->attn_pipelined,
      .gqa_decode = c->attn_gqa_decode, .split_keys = c->attn_split_keys,
      .f32 = c->precision_f32};
  if (t->src[TSR_FA_SRC_COUNTERS] && tsr_param_f32(t, TSR_FA_P_BUDGET) > 0.0f)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: flash attention '%s' has a decode "
                         "policy's mass budget, which runs on the cpu only", t->name);
  if (t->src[TSR_FA_SRC_COUNTERS] && tsr_param_f32(t, TSR_FA_P_SKIP) > 0.0f) {
    a.skip_below = tsr_param_f32(t, TSR_FA_P_SKIP);
    a.sink = t->op_params[TSR_FA_P_SINK], a.recent = t->op_params[TSR_FA_P_RECENT];
    a.counters = (unsigned long long *)c->dptr[t->src[TSR_FA_SRC_COUNTERS]->index];
  }
  void *scratch = NULL;
  size_t need = cu_flash_attn_scratch(&dst, &a, c->n_sm);
  if (need) {
    tsr_status st = tsr_cuda_scratch(c, SCR_ATTN, need, &scratch);
    if (st != TSR_OK) return st;
  }
  int refused = 0;
  CU_LAUNCH(cu_flash_attn(c->stream, &dst, &a, scratch, c->n_sm, &refused));
  if (refused && a.skip_below > 0.0f) /* V skipping runs in the GQA decode kernel only */
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: flash attention '%s' has decode "
                         "parameters (V skipping), but the GQA decode kernel cannot take it (K "
                         "dtype %d, V dtype %d, head dims %lld/%lld): %s", t->name,
                         (int)a.k.type, (int)a.v.type, (long long)a.k.ne[0],
                         (long long)a.v.ne[0], cudaGetErrorString((cudaError_t)refused));
  if (refused && !c->said_attn_refused) { /* slower, not wrong: said once */
    fprintf(stderr, "tessera: cuda backend: flash attention '%s' (head dims %lld/%lld, %lld keys) "
            "could not launch on the tiled kernel (%s); it runs on the per-query kernel\n",
            t->name, (long long)a.k.ne[0], (long long)a.v.ne[0], (long long)a.k.ne[1],
            cudaGetErrorString((cudaError_t)refused));
    c->said_attn_refused = true;
  }
  return TSR_OK;
}

/* An absent source (an optional input left out) has data NULL and no dims. */
static void info_of(const struct cu_ctx *c, const struct tsr_tensor *t, struct tsr_tensor_info *i) {
  if (!t) {
    *i = (struct tsr_tensor_info){.struct_size = sizeof *i};
    return;
  }
  *i = (struct tsr_tensor_info){.struct_size = sizeof *i, .dtype = (int32_t)t->dtype, .n_dims = 4,
                                .data = c->dptr[t->index], .name = t->name};
  for (int d = 0; d < 4; d++) i->ne[d] = t->ne[d], i->nb[d] = t->nb[d];
}

static tsr_status plugin_scratch(struct tsr_device_call *call, size_t bytes, void **out) {
  return tsr_cuda_scratch((struct cu_ctx *)call->backend_ctx, SCR_PLUGIN, bytes, out);
}

/* Calls plugin op op_id's cuda kernel on infos of dst and its n_src sources, with
** the device call a kernel reads (plugin.h): graph says how a CUDA graph holds it. */
static tsr_status call_kernel(struct cu_ctx *c, int32_t op_id, const struct tsr_tensor *dst_t,
                              const struct tsr_tensor *const *src_t, int n_src,
                              const int32_t *params, int64_t graph) {
  tsr_plugin_kernel_fn fn;
  void *kctx;
  tsr_status st = c->host->custom_op_kernel(op_id, "cuda", &fn, &kctx);
  if (st != TSR_OK) return st;
  struct tsr_tensor_info dst, src[TSR_MAX_SRC];
  info_of(c, dst_t, &dst);
  for (int i = 0; i < n_src; i++) info_of(c, src_t[i], &src[i]);
  struct tsr_device_call call = {.struct_size = sizeof call, .backend = "cuda",
                                 .device = c->device, .stream = c->stream, .status = TSR_OK,
                                 .graph = graph,
                                 .attn_pipelined = c->attn_pipelined,
                                 .attn_gqa_decode = c->attn_gqa_decode,
                                 .attn_split_keys = c->attn_split_keys,
                                 .precision_f32 = c->precision_f32,
                                 .scratch = plugin_scratch, .backend_ctx = c};
  c->host->set_device_call(&call);
  fn(kctx, 0, 1, &dst, src, n_src, params);
  c->host->set_device_call(NULL);
  if (call.status != TSR_OK) {
    const char *name = c->host->custom_op_name(op_id);
    tsr_error_prefix("cuda kernel of plugin op '%s'", name ? name : "?");
    return (tsr_status)call.status;
  }
  return TSR_OK;
}

/* A plugin op: its cuda kernel with device addresses, enqueuing on our stream
** (plugin.h, register_kernel_lib); inside a capture it does no bookkeeping, and
** replay is the bookkeeping call of a compute that replayed (or just captured and
** launched) the graph, which enqueues nothing (plugin.h, tsr_device_call.graph). */
static tsr_status run_custom(struct cu_ctx *c, const struct tsr_tensor *t, bool replay) {
  int n_src = 0;
  while (n_src < TSR_MAX_SRC && t->src[n_src]) n_src++;
  return call_kernel(c, t->op_params[0], t, (const struct tsr_tensor *const *)t->src, n_src,
                     &t->op_params[2],
                     replay ? TSR_DEVICE_CALL_REPLAY
                     : c->capturing ? TSR_DEVICE_CALL_CAPTURE
                                    : TSR_DEVICE_CALL_EAGER);
}

/* A codec dtype's device kernel (plugin.h, tsr_kv_codec_kernels) where set_rows
** (role 0: encode; sources the rows and cells) or a cast to f16 (role 1: lift;
** source the codec's rows) would run: launches only, so a capture records them
** like the core's own (no replay call). */
static tsr_status run_codec(struct cu_ctx *c, const struct tsr_tensor *t, int role) {
  const int32_t dtype = role ? (int32_t)t->src[0]->dtype : (int32_t)t->dtype;
  int32_t op[3];
  if (!c->host->codec_ops(dtype, &op[0], &op[1], &op[2]))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: dtype %d has no codec kernels", dtype);
  const struct tsr_tensor *const *src = (const struct tsr_tensor *const *)t->src + (role ? 0 : 1);
  return call_kernel(c, op[role], t, src, role ? 1 : 2, NULL,
                     c->capturing ? TSR_DEVICE_CALL_CAPTURE : TSR_DEVICE_CALL_EAGER);
}

static tsr_status run_node(struct cu_ctx *c, const struct tsr_tensor *t) {
  struct cu_t d = cu_of(c, t), a = cu_of(c, t->src[0]), b = cu_of(c, t->src[1]);
  struct cu_t s2 = cu_of(c, t->src[2]);
  cudaStream_t s = c->stream;
  cu_stream cs = (cu_stream)s;
  switch (t->op) {
  case TSR_OP_GET_ROWS: CU_LAUNCH(cu_get_rows(cs, &d, &a, &b)); break;
  case TSR_OP_MAT_MUL: return tsr_cuda_mat_mul(c, &d, &a, &b);
  case TSR_OP_MAT_MUL_ID: return tsr_cuda_mat_mul_id(c, &d, &a, &b, &s2);
  case TSR_OP_ADD: CU_LAUNCH(cu_binary(cs, &d, &a, &b, 0)); break;
  case TSR_OP_MUL: CU_LAUNCH(cu_binary(cs, &d, &a, &b, 1)); break;
  case TSR_OP_SCALE: CU_LAUNCH(cu_map(cs, &d, &a, CU_MAP_SCALE, 0, tsr_param_f32(t, 0))); break;
  case TSR_OP_UNARY: CU_LAUNCH(cu_map(cs, &d, &a, CU_MAP_UNARY, t->op_params[0], 0.0f)); break;
  case TSR_OP_SOFTCAP: CU_LAUNCH(cu_map(cs, &d, &a, CU_MAP_SOFTCAP, 0, tsr_param_f32(t, 0))); break;
  case TSR_OP_GLU:
    CU_LAUNCH(cu_glu(cs, &d, &a, t->src[1] ? &b : NULL, t->op_params[0], t->op_params[1]));
    break;
  case TSR_OP_RMS_NORM:
    CU_LAUNCH(cu_norm(cs, &d, &a, t->src[1] ? &b : NULL, tsr_param_f32(t, 0), 0));
    break;
  case TSR_OP_L2_NORM: CU_LAUNCH(cu_norm(cs, &d, &a, NULL, tsr_param_f32(t, 0), 1)); break;
  case TSR_OP_SOFTMAX:
    CU_LAUNCH(cu_softmax(cs, &d, &a, t->src[1] ? &b : NULL, tsr_param_f32(t, 0)));
    break;
  case TSR_OP_ROPE:
    CU_LAUNCH(cu_rope(cs, &d, &a, &b, t->src[2] ? &s2 : NULL, t->op_params[0],
                      t->op_params[1] == TSR_ROPE_NEOX, tsr_param_f32(t, 2), tsr_param_f32(t, 3)));
    break;
  case TSR_OP_CONCAT: CU_LAUNCH(cu_concat(cs, &d, &a, &b, t->op_params[0])); break;
  case TSR_OP_CPY:
    if (tsr_dtype_is_codec((int)t->src[0]->dtype)) return run_codec(c, t, 1);
    CU_LAUNCH(cu_cpy(cs, &d, &a));
    break;
  case TSR_OP_SET_ROWS:
    if (tsr_dtype_is_codec((int)t->dtype)) return run_codec(c, t, 0);
    CU_LAUNCH(cu_set_rows(cs, &d, &b, &s2));
    break;
  case TSR_OP_TOP_K: CU_LAUNCH(cu_top_k(cs, &d, &a, t->op_params[0])); break;
  case TSR_OP_ARGMAX: CU_LAUNCH(cu_argmax(cs, &d, &a)); break;
  case TSR_OP_FLASH_ATTN: return run_attention(c, t);
  case TSR_OP_CUSTOM: return run_custom(c, t, false);
  default:
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: no kernel for op %s", tsr_op_name(t->op));
  }
  return TSR_OK;
}

static cudaError_t sample_device_memory(struct cu_ctx *c) {
  size_t free_b, total_b;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) return e;
  if (total_b - free_b > c->used_peak) c->used_peak = total_b - free_b;
  c->device_total = total_b;
  return cudaSuccess;
}

/* Node timing: an event before the first node and one after each (at most g->n). */
static tsr_status ensure_events(struct cu_ctx *c, const struct tsr_graph *g) {
  const int need = g->n + 1;
  if (need <= c->n_events) return TSR_OK;
  cudaEvent_t *ev = realloc(c->events, sizeof *ev * (size_t)need);
  double *st = ev ? realloc(c->stamps, sizeof *st * (size_t)need) : NULL;
  if (ev) c->events = ev;
  if (st) c->stamps = st;
  if (!ev || !st) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: %d timing events", need);
  for (; c->n_events < need; c->n_events++)
    CU_RT(cudaEventCreate(&c->events[c->n_events]));
  return TSR_OK;
}

/* After the compute's final synchronisation: the n_timed events as seconds since the
** first, then each node's kind and time. */
static tsr_status add_node_times(struct cu_ctx *c, const struct tsr_graph *g, int n_timed) {
  c->stamps[0] = 0;
  for (int k = 1; k < n_timed; k++) {
    float ms = 0;
    CU_RT(cudaEventElapsedTime(&ms, c->events[0], c->events[k]));
    c->stamps[k] = 1e-3 * (double)ms;
  }
  tsr_op_times_add_graph(c->times, g, c->host->custom_op_name, c->stamps);
  return TSR_OK;
}

/* Every node of g in order on the stream (an event after each when timing: *timed). */
static tsr_status run_nodes(struct cu_ctx *c, struct tsr_graph *g, int *timed) {
  tsr_status st;
  if (c->times && (st = ensure_events(c, g)) != TSR_OK) return st;
  if (c->times) CU_RT(cudaEventRecord(c->events[(*timed)++], c->stream));
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (!tsr_op_computes(t)) continue;
    st = run_node(c, t);
    if (st == TSR_OK && c->times) {
      cudaError_t e = cudaEventRecord(c->events[(*timed)++], c->stream);
      if (e != cudaSuccess) st = tsr_cuda_rt_fail((int)e, "cudaEventRecord", __FILE__, __LINE__);
    }
    if (st == TSR_OK && c->sync_nodes) {
      cudaError_t e = cudaStreamSynchronize(c->stream);
      if (e != cudaSuccess) st = tsr_cuda_rt_fail((int)e, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
    if (st != TSR_OK) {
      tsr_error_prefix("cuda backend, op %s, tensor '%s'", tsr_op_name(t->op), t->name);
      return st;
    }
  }
  return TSR_OK;
}

/* The signature of this compute of g into c->sig_next (cuda_graphs.h): the nodes, then
** the arena and every scratch buffer a launch may point into. */
static size_t signature(struct cu_ctx *c, const struct tsr_graph *g) {
  struct {
    void *arena, *scratch[SCR_COUNT];
    size_t scratch_cap[SCR_COUNT];
  } own;
  memset(&own, 0, sizeof own);
  own.arena = c->arena;
  memcpy(own.scratch, c->scratch, sizeof own.scratch);
  memcpy(own.scratch_cap, c->scratch_cap, sizeof own.scratch_cap);
  return tsr_cuda_graph_signature(g, c->dptr, &own, sizeof own, &c->sig_next, &c->sig_next_cap);
}

static void drop_exec(void *exec) { cudaGraphExecDestroy((cudaGraphExec_t)exec); }

/* Records the nodes of g as a CUDA graph and launches it into *out; false (nothing kept)
** when the capture failed, why in *err. */
static bool capture(struct cu_ctx *c, struct tsr_graph *g, cudaGraphExec_t *out, char *err,
                    size_t err_len) {
  *out = NULL;
  cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    snprintf(err, err_len, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
    return false;
  }
  int timed = 0;
  c->capturing = true;
  tsr_status st = run_nodes(c, g, &timed);
  c->capturing = false;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  e = cudaStreamEndCapture(c->stream, &graph);
  if (st == TSR_OK && e == cudaSuccess && (e = cudaGraphInstantiate(&exec, graph, 0)) == cudaSuccess)
    *out = exec; /* only a graph that instantiated: a failed call leaves exec unspecified */
  if (graph) cudaGraphDestroy(graph);
  if (st == TSR_OK && e == cudaSuccess && (e = cudaGraphLaunch(*out, c->stream)) == cudaSuccess)
    return true;
  snprintf(err, err_len, "%s", st != TSR_OK ? tsr_error_message() : cudaGetErrorString(e));
  (void)cudaGetLastError(); /* a failed capture leaves no sticky error; clear what it left */
  if (*out) cudaGraphExecDestroy(*out);
  *out = NULL;
  return false;
}

/* After a replay, or a capture's first launch: each plugin node's bookkeeping call,
** in graph order, so its counters move once a compute, as node by node. */
static tsr_status replay_custom(struct cu_ctx *c, const struct tsr_graph *g) {
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (t->op != TSR_OP_CUSTOM || !tsr_op_computes(t)) continue;
    tsr_status st = run_custom(c, t, true);
    if (st != TSR_OK) return st;
  }
  return TSR_OK;
}

/* A compute with graphs on. c->graphs keeps the signatures of recent computes (after
** they ran) and their captures (backend.graph_slots of them). This compute replays its
** signature's capture; is captured when its signature was computed before without one
** (the first compute settles the scratch sizes); else runs node by node and keeps its
** signature. A failed capture is said once per signature and its nodes then run one by
** one. */
static tsr_status run_graph(struct cu_ctx *c, struct tsr_graph *g) {
  char why[300];
  int timed = 0;
  if (!tsr_cuda_graph_capturable(g, tsr_cuda_product_on_device, c, c->host->custom_op_replayable,
                                 why, sizeof why)) {
    /* prefill (batched products) never is; a decode step that is not says so once */
    if (!strstr(why, "batched product") && !c->said_uncapturable) {
      fprintf(stderr, "tessera: cuda backend: this decode graph cannot be captured as a CUDA "
              "graph: %s; it runs node by node\n", why);
      c->said_uncapturable = true;
    }
    return run_nodes(c, g, &timed);
  }
  size_t len = signature(c, g);
  if (!len) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
  struct tsr_cuda_graph_slot *slot = tsr_cuda_graph_find(&c->graphs, c->sig_next, len);
  if (slot && slot->exec) {
    CU_RT(cudaGraphLaunch((cudaGraphExec_t)slot->exec, c->stream));
    c->n_replays++;
    return replay_custom(c, g);
  }
  if (slot && !slot->refused) {
    cudaGraphExec_t exec;
    if (capture(c, g, &exec, why, sizeof why)) {
      slot->exec = exec;
      c->n_captures++;
      return replay_custom(c, g);
    }
    slot->refused = true;
    fprintf(stderr, "tessera: cuda backend: a decode graph could not be captured (%s); its "
            "nodes run one by one\n", why);
  }
  tsr_status st = run_nodes(c, g, &timed);
  if (st != TSR_OK) return st;
  /* the signature after the run (scratch it grew) is what the next compute must match */
  if (!(len = signature(c, g))) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
  if (!tsr_cuda_graph_find(&c->graphs, c->sig_next, len) &&
      !tsr_cuda_graph_take(&c->graphs, c->sig_next, len))
    return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
  return TSR_OK;
}

static tsr_status cu_compute(void *ctx, struct tsr_graph *g) {
  struct cu_ctx *c = ctx;
  if (!g->planned)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "cuda backend: plan and bind the graph first");
  if (g->arena_bytes > c->arena_cap) {
    CU_RT(cudaStreamSynchronize(c->stream));
    CU_RT(dev_free(c, c->arena, c->arena_cap));
    c->arena = NULL;
    c->arena_cap = 0;
    cudaError_t e = dev_alloc(c, (void **)&c->arena, g->arena_bytes);
    if (e != cudaSuccess)
      return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: cannot allocate a %zu-byte device arena "
                           "(%s)", g->arena_bytes, cudaGetErrorString(e));
    c->arena_cap = g->arena_bytes;
  }
  tsr_status st = resolve(c, g);
  if (st != TSR_OK) return st;
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (!(t->flags & TSR_FLAG_INPUT) || (t->flags & TSR_FLAG_WEIGHT) ||
        g->offsets[i] == TSR_NO_OFFSET)
      continue;
    if (!t->data)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "cuda backend: input '%s' is not bound", t->name);
    CU_RT(cudaMemcpyAsync(c->dptr[i], t->data, tsr_tensor_nbytes(t), cudaMemcpyHostToDevice,
                          c->stream));
  }
  int timed = 0;
  st = c->use_graphs && !c->times && !c->sync_nodes ? run_graph(c, g) : run_nodes(c, g, &timed);
  if (st != TSR_OK) return st;
  /* unkept external memory a node wrote into goes back whole (its other
  ** bytes are the ones just uploaded); outputs in the arena come back; an
  ** output written into kept memory stays on the device (sync_to_host reads it) */
  void *stage = c->scratch[SCR_STAGE];
  for (int k = 0; k < c->n_spans; k++)
    if (c->spans[k].written)
      CU_RT(cudaMemcpyAsync((char *)c->spans[k].lo, (char *)stage + c->spans[k].off,
                            (size_t)(c->spans[k].hi - c->spans[k].lo), cudaMemcpyDeviceToHost,
                            c->stream));
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (!(t->flags & TSR_FLAG_OUTPUT) || g->offsets[owner_of(t)->index] == TSR_NO_OFFSET) continue;
    CU_RT(cudaMemcpyAsync(t->data, c->dptr[i], tsr_tensor_nbytes(t), cudaMemcpyDeviceToHost,
                          c->stream));
  }
  CU_RT(cudaStreamSynchronize(c->stream));
  /* the device's memory in use grows when this process allocates: sampled after a
  ** compute that allocated (kept ranges' first upload, a larger arena or scratch)
  ** and whenever read, not at every decode step */
  if (c->held_bytes != c->held_sampled) {
    CU_RT(sample_device_memory(c));
    c->held_sampled = c->held_bytes;
  }
  return c->times ? add_node_times(c, g, timed) : TSR_OK;
}

static tsr_status cu_memory(void *ctx, struct tsr_backend_memory *out) {
  struct cu_ctx *c = ctx;
  CU_RT(sample_device_memory(c));
  *out = (struct tsr_backend_memory){c->held_bytes, c->held_peak, c->used_peak, c->device_total};
  return TSR_OK;
}

static void cu_graph_counts(void *ctx, uint64_t *captures, uint64_t *replays) {
  const struct cu_ctx *c = ctx;
  *captures = c->n_captures, *replays = c->n_replays;
}

static tsr_status cu_time_nodes(void *ctx, struct tsr_op_times *acc) {
  ((struct cu_ctx *)ctx)->times = acc;
  return TSR_OK;
}

static const char *cu_name(void *ctx) {
  (void)ctx;
  return "cuda";
}

static tsr_status cu_supports(void *ctx, const struct tsr_tensor *t) {
  return tsr_cuda_supports(ctx, t);
}

static void cu_free(void *ctx) {
  struct cu_ctx *c = ctx;
  if (!c) return;
  if (c->stream) cudaStreamSynchronize(c->stream);
  for (int i = 0; i < c->n_regions; i++)
    if (c->regions[i].dev) cudaFree(c->regions[i].dev);
  for (int i = 0; i < SCR_COUNT; i++)
    if (c->scratch[i]) cudaFree(c->scratch[i]);
  if (c->arena) cudaFree(c->arena);
  if (c->blas) cublasDestroy(c->blas);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c->regions);
  free(c->spans);
  free(c->dptr);
  free(c->host_buf);
  for (int i = 0; i < c->n_events; i++) cudaEventDestroy(c->events[i]);
  free(c->events);
  free(c->stamps);
  tsr_cuda_graph_cache_clear(&c->graphs);
  free(c->sig_next);
  free(c);
}

/* ---- opening ------------------------------------------------------------------ */

static tsr_status check_host(const struct tsr_cuda_host *h) {
  if (!h || h->abi_version != TSR_CUDA_ABI_VERSION || h->struct_size != sizeof *h ||
      h->tensor_size != sizeof(struct tsr_tensor) || h->graph_size != sizeof(struct tsr_graph) ||
      h->backend_size != sizeof(struct tsr_backend))
    return TSR_ERR_UNSUPPORTED; /* no message channel we can trust: the loader names it */
  return TSR_OK;
}

/* Driver and device, each failure named for the person at the machine. */
static tsr_status open_device(struct cu_ctx *c, const struct tsr_cuda_settings *set) {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  if (drv == 0)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "no CUDA driver: libcuda.so.1 was not found or "
                         "did not load (install the NVIDIA driver; this runtime is CUDA %d.%d)",
                         rt / 1000, rt % 1000 / 10);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorInsufficientDriver || (e == cudaSuccess && drv < rt && n == 0))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "the NVIDIA driver supports CUDA %d.%d, older than "
                         "the CUDA %d.%d runtime this backend was built with; update the driver",
                         drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "no CUDA GPU found (driver CUDA %d.%d is installed; "
                         "check CUDA_VISIBLE_DEVICES and nvidia-smi)", drv / 1000, drv % 1000 / 10);
  if (e != cudaSuccess)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cannot list CUDA devices: %s (%s)",
                         cudaGetErrorName(e), cudaGetErrorString(e));
  c->device = set->device;
  if (c->device >= n)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "backend.device %d: there are %d GPUs (0..%d)",
                         c->device, n, n - 1);
  struct cudaDeviceProp prop;
  CU_RT(cudaGetDeviceProperties(&prop, c->device));
  const int cc = prop.major * 10 + prop.minor;
  if (cc < TSR_CUDA_ARCH)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "GPU %d (%s) has compute capability %d.%d; this "
                         "backend was built for sm_%d (meson -Dgpu_arch)", c->device, prop.name,
                         prop.major, prop.minor, TSR_CUDA_ARCH);
  CU_RT(cudaSetDevice(c->device));
  c->n_sm = prop.multiProcessorCount;
  snprintf(c->name, sizeof c->name, "%s (sm_%d, %d SMs, %.1f GiB)", prop.name, cc, c->n_sm,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  CU_RT(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  CU_BLAS(cublasCreate(&c->blas));
  CU_BLAS(cublasSetStream(c->blas, c->stream));
  /* the profile's choices, overrides applied (core/graph/cuda_settings.h) */
  c->gemm_f32 = set->gemm_f32;
  c->gemv_x8 = !set->gemv_f32;
  c->sync_nodes = set->sync;
  c->use_graphs = set->graphs;
  const int slots = set->graph_slots;
  c->graphs = (struct tsr_cuda_graph_cache){
      .n_slots = slots < 1 ? 1 : slots > TSR_CUDA_GRAPH_SLOTS_MAX ? TSR_CUDA_GRAPH_SLOTS_MAX : slots,
      .drop = drop_exec};
  c->attn_pipelined = set->attn_pipelined;
  c->attn_gqa_decode = set->attn_decode;
  c->attn_split_keys = set->attn_split_keys;
  c->precision_f32 = set->precision_f32;
  return TSR_OK;
}

__attribute__((visibility("default"))) tsr_status
tsr_cuda_backend_open(const struct tsr_cuda_host *host, const struct tsr_cuda_settings *settings,
                      struct tsr_backend **out);

tsr_status tsr_cuda_backend_open(const struct tsr_cuda_host *host,
                                 const struct tsr_cuda_settings *settings,
                                 struct tsr_backend **out) {
  *out = NULL;
  if (check_host(host) != TSR_OK) {
    if (host && host->abi_version == TSR_CUDA_ABI_VERSION && host->set_error)
      host->set_error("libtessera-cuda.so was built from another tessera tree (tensor, graph or "
                      "backend layout differs); rebuild it with this core");
    else if (host && host->set_error && host->abi_version >= 1)
      host->set_error("libtessera-cuda.so speaks another backend ABI version; rebuild it");
    return TSR_ERR_UNSUPPORTED;
  }
  tsr_cuda_host_table = host;
  tsr_dtype_set_codec_source(host->dtype_traits); /* plugins' codec dtypes are the core's */
  struct cu_ctx *c = calloc(1, sizeof *c);
  struct tsr_backend *b = calloc(1, sizeof *b);
  if (!c || !b) {
    free(c);
    free(b);
    return tsr_error_set(TSR_ERR_NOMEM, "out of host memory");
  }
  c->host = host;
  tsr_status st = open_device(c, settings);
  if (st != TSR_OK) {
    cu_free(c);
    free(b);
    return st;
  }
  b->i = (struct tsr_backend_i){cu_name,         cu_supports, cu_compute, cu_free,
                                cu_sync_to_host, cu_forget,   cu_keep,    cu_sync_to_device,
                                tsr_cuda_probe,  cu_time_nodes, cu_memory,  cu_graph_counts};
  b->context = c;
  *out = b;
  return TSR_OK;
}

