/*
** attn_dca: Dual Chunk Attention as an `attention` implementation (dca.h
** states the semantics; README.md the settings and measured figures).
**
** It positions keys and queries itself (tsr_attention_v1.rotates): the arch
** describes its RoPE (struct tsr_attn_rope) and hands q and k over before
** rotation. prepare_k rotates each new key at p mod C with the arch's own
** rotation, and that is what the KV cache stores; build rotates q at its
** three band positions with the same rotation and runs the fused kernel
** (dca_cpu.c on the cpu, cuda/dca_cuda.cu on cuda). A context shift
** re-rotates every moved key by its own delta ((p + d) mod C - p mod C), or
** needs none when d is a multiple of C.
**
** Full-attention layers only: sliding-window layers never see past their
** window, so a profile keeps flash there (attention: {full: dca, sliding: flash}).
*/
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dca.h"
#include "tessera/attn_decode_fit.h"

/* Process-wide op ids: the registry outlives hosts, so a plugin initialised
** again (a second host in one process) keeps its first ids. */
static int32_t g_pos_op = -1, g_attn_op = -1;

/* ---- geometry ---------------------------------------------------------------- */

/* One value of the model's dual_chunk_attention_config (Qwen2.5-1M's): the u32 key
** <arch>.dual_chunk_attention.<name> of the file the arch names (struct tsr_attn_rope
** model and arch) into *out, 0 where it names no file or the file lacks the key.
** Returns TSR_OK, or an error with a message in why. */
static tsr_status model_key(const struct dca_state *st, const struct tsr_attn_rope *r,
                            const char *name, int32_t *out, char *why, size_t n) {
  *out = 0;
  if (!r->model || !r->arch) return TSR_OK;
  char key[160];
  snprintf(key, sizeof key, "%s.dual_chunk_attention.%s", r->arch, name);
  if (!st->host->gguf->has_key(r->model, key)) return TSR_OK;
  uint32_t v = 0;
  if (st->host->gguf->get_u32(r->model, key, &v) != TSR_OK) {
    snprintf(why, n, "attn_dca: the model's %s is not a u32", key);
    return TSR_ERR_FORMAT;
  }
  *out = v > INT32_MAX ? INT32_MAX : (int32_t)v;
  return TSR_OK;
}

/* Settings first, then what the model says, then the documented defaults:
** chunk_size = 3/4 of the trained context (ChunkLlama's rule), else 8192;
** local_size = chunk_size / 8. Returns TSR_OK, or an error with a message in why. */
static tsr_status geometry(const struct dca_state *st, const struct tsr_attn_rope *r,
                           struct dca_geometry *out, char *why, size_t n) {
  int32_t m_cs, m_ls, m_orig;
  tsr_status e = model_key(st, r, "chunk_size", &m_cs, why, n);
  if (e == TSR_OK) e = model_key(st, r, "local_size", &m_ls, why, n);
  if (e == TSR_OK) e = model_key(st, r, "original_context_length", &m_orig, why, n);
  if (e != TSR_OK) return e;
  const bool model_cs = st->chunk_size <= 0 && m_cs > 0;
  const int64_t cs = st->chunk_size > 0   ? st->chunk_size
                     : model_cs           ? m_cs
                     : r->n_ctx_train > 0 ? (int64_t)r->n_ctx_train * 3 / 4
                                          : 8192;
  const int64_t ls = st->local_size >= 0 ? st->local_size : model_cs ? m_ls : cs / 8;
  if (cs < 2 || cs > INT32_MAX / 2 || ls < 0 || ls >= cs) {
    snprintf(why, n, "attn_dca: chunk_size %lld and local_size %lld (%s): needs 0 <= local_size "
             "< chunk_size and chunk_size >= 2", (long long)cs, (long long)ls,
             model_cs ? "from the model" : "from the settings or defaults");
    return TSR_ERR_INVALID_ARG;
  }
  out->cs = (int32_t)cs;
  out->ls = (int32_t)ls;
  out->c = (int32_t)(cs - ls);
  /* the temperature starts past the model's original length ("auto": only when
  ** its dual_chunk_attention_config names one, as Qwen2.5-1M's does) */
  const int64_t orig = st->original_length > 0 ? st->original_length
                       : m_orig > 0               ? m_orig
                                                  : r->n_ctx_train;
  out->temp_from = 0;
  if (!strcmp(st->temperature, "yarn") || (!strcmp(st->temperature, "auto") && m_orig > 0)) {
    if (orig <= 0) {
      snprintf(why, n, "attn_dca: temperature yarn needs the trained length, and the model "
               "names none: set original_length");
      return TSR_ERR_INVALID_ARG;
    }
    out->temp_from = orig > INT32_MAX ? INT32_MAX : (int32_t)orig;
  }
  return TSR_OK;
}

/* The geometry for a build, or NULL with the graph's error set. */
static const struct dca_geometry *geometry_for(struct dca_state *st, struct tsr_graph *g,
                                               const struct tsr_attn_rope *rope,
                                               struct dca_geometry *out) {
  char why[256];
  if (!rope) {
    st->host->graph->fail(g, TSR_ERR_UNSUPPORTED, "attention dca positions q and k itself and "
                          "needs the arch to describe its RoPE (tsr_attn_call.rope, "
                          "host->arch->attn_rope); this arch does not");
    return NULL;
  }
  const tsr_status e = geometry(st, rope, out, why, sizeof why);
  if (e != TSR_OK) {
    st->host->graph->fail(g, e, "%s", why);
    return NULL;
  }
  if (!st->logged) {
    st->logged = 1;
    char temp[48] = "none";
    if (out->temp_from) snprintf(temp, sizeof temp, "yarn past %d", out->temp_from);
    st->host->log(st->self, TSR_LOG_INFO, "chunk_size %d, local_size %d (chunk length %d), "
                  "temperature %s", out->cs, out->ls, out->c, temp);
  }
  return out;
}

/* i32 rotation positions from positions pos (dca.h, enum dca_pos_mode); the op an
** earlier layer of the same graph built from the same pos and params, where the host
** numbers its graphs. */
static struct tsr_tensor *positions(struct dca_state *st, struct tsr_graph *g,
                                    struct tsr_tensor *pos, const struct dca_geometry *geo,
                                    enum dca_pos_mode mode, int32_t delta) {
  const struct tsr_host *h = st->host;
  struct tsr_tensor_info pi;
  h->graph->tensor_info(pos, &pi);
  if (pi.dtype != TSR_DTYPE_ID_I32 || pi.ne[1] * pi.ne[2] * pi.ne[3] != 1) {
    h->graph->fail(g, TSR_ERR_INVALID_ARG, "attn_dca: positions must be i32 [N]");
    return NULL;
  }
  const int32_t params[4] = {mode, geo->c, geo->cs, delta};
  const uint64_t serial = h->graph->serial(g);
  const int n_memo = (int)(sizeof st->pos_memo / sizeof st->pos_memo[0]);
  struct dca_pos_memo *slot = NULL; /* an entry of another graph, to reuse */
  for (int i = 0; serial && i < n_memo; i++) {
    struct dca_pos_memo *m = &st->pos_memo[i];
    if (m->serial == serial && m->pos == pos && !memcmp(m->params, params, sizeof params))
      return m->out;
    if (!slot && m->serial != serial) slot = m;
  }
  const int64_t n = mode == DCA_POS_QUERY ? 3 * pi.ne[0] : pi.ne[0];
  struct tsr_tensor *out =
      h->graph->custom_op_typed(g, g_pos_op, TSR_DTYPE_ID_I32, 1, &n, &pos, 1, params, 4);
  if (out && slot) {
    *slot = (struct dca_pos_memo){.serial = serial, .pos = pos, .out = out};
    memcpy(slot->params, params, sizeof params);
  }
  return out;
}

/* ---- the attention interface ------------------------------------------------- */

/* The dtypes the cuda kernel decodes in place (dq_rt, include/tessera/cuda_quant.cuh):
** the scalar KV tiers f32, f16, bf16, q8_0, q6_0, q5_1, q5_0, q4_1, q4_0. */
static bool cuda_reads(int32_t dtype) {
  static const int32_t reads[] = {0, 1, 30, 8, 1000, 7, 6, 3, 2};
  for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++)
    if (reads[i] == dtype) return true;
  return false;
}

static tsr_status dca_negotiate(void *ctx, const struct tsr_layer_desc *layer,
                                enum tsr_read_path *k_path, enum tsr_read_path *v_path) {
  struct dca_state *st = ctx;
  const struct tsr_host *h = st->host;
  const bool cuda = !strcmp(layer->backend, "cuda");
  if (!cuda && strcmp(layer->backend, "cpu"))
    return h->set_error(TSR_ERR_UNSUPPORTED, "dca has no kernel for backend '%s' (cpu and cuda)",
                        layer->backend);
  st->on_cuda |= cuda; /* the arch's call does not name the backend; build needs it */
  if (layer->kind != TSR_LAYER_FULL)
    return h->set_error(TSR_ERR_UNSUPPORTED, "dca runs full-attention layers only: a %s layer "
                        "never sees past its window, so keep flash there (attention: {full: dca, "
                        "sliding: flash})", layer->kind == TSR_LAYER_SLIDING ? "sliding-window"
                                                                             : "linear");
  const char *codecs[2] = {layer->k_codec, layer->v_codec};
  const int32_t dims[2] = {layer->head_dim_k, layer->head_dim_v};
  enum tsr_read_path *paths[2] = {k_path, v_path};
  for (int i = 0; i < 2; i++) {
    const struct tsr_kv_codec_v1 *c = h->find_kv_codec(st->self, codecs[i], 0);
    *paths[i] = TSR_READ_NONE;
    if (!c) continue; /* negotiation names the missing codec */
    if (dims[i] > 0 && dims[i] % c->block_size)
      return h->set_error(TSR_ERR_UNSUPPORTED, "dca reads %s codec %s in whole blocks of %lld "
                          "values; head dim %d is not a multiple", i ? "V" : "K", codecs[i],
                          (long long)c->block_size, (int)dims[i]);
    if (cuda) {
      /* a codec of its own layout that runs on cuda is lifted to f16 by its kernel */
      const bool own_layout = c->dtype >= TSR_DTYPE_ID_CODEC_FIRST;
      if (!cuda_reads(c->dtype) && !own_layout)
        return h->set_error(TSR_ERR_UNSUPPORTED, "dca on cuda reads the scalar KV dtypes in its "
                            "kernel; %s codec %s is not one of them", i ? "V" : "K", codecs[i]);
      *paths[i] = own_layout                                    ? TSR_READ_LIFT
                  : c->dtype == TSR_DTYPE_ID_F32 || c->dtype == TSR_DTYPE_ID_F16 ? TSR_READ_NATIVE
                                                                : TSR_READ_IN_REGISTER;
    } else if (c->dtype == TSR_DTYPE_ID_F32 || c->dtype == TSR_DTYPE_ID_F16)
      *paths[i] = TSR_READ_NATIVE;
    else if (c->decode_f32 || c->decode_f16)
      *paths[i] = TSR_READ_IN_REGISTER; /* a row at a time through the codec */
    else
      return h->set_error(TSR_ERR_UNSUPPORTED, "dca reads %s codec %s through its CPU decoder, "
                          "and it has none", i ? "V" : "K", codecs[i]);
  }
  return TSR_OK;
}

/* V skipping on decode steps: the cpu kernel acts on every layer it runs; on cuda the
** GQA decode kernel does, on the layers it takes (a codec of its own layout is read
** lifted to f16) */
static bool dca_honours_decode(void *ctx, const struct tsr_layer_desc *layer) {
  const struct dca_state *st = ctx;
  if (!strcmp(layer->backend, "cpu")) return true;
  if (strcmp(layer->backend, "cuda") || layer->n_head_kv <= 0 ||
      layer->n_head % layer->n_head_kv)
    return false;
  const struct tsr_kv_codec_v1 *k = st->host->find_kv_codec(st->self, layer->k_codec, 0);
  const struct tsr_kv_codec_v1 *v = st->host->find_kv_codec(st->self, layer->v_codec, 0);
  if (!k || !v) return false;
  const int32_t kt = k->dtype >= TSR_DTYPE_ID_CODEC_FIRST ? TSR_DTYPE_ID_F16 : k->dtype;
  const int32_t vt = v->dtype >= TSR_DTYPE_ID_CODEC_FIRST ? TSR_DTYPE_ID_F16 : v->dtype;
  return tsr_gqa_decode_shape_fits(layer->n_head / layer->n_head_kv, layer->head_dim_k,
                                   layer->head_dim_v, kt, vt);
}

static struct tsr_tensor *dca_prepare_k(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                        const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                        struct tsr_tensor *pos) {
  struct dca_geometry geo;
  if (!k || !pos || !geometry_for(ctx, g, rope, &geo)) return NULL;
  struct tsr_tensor *kp = positions(ctx, g, pos, &geo, DCA_POS_KEY, 0);
  return kp ? h->graph->rope_apply(g, rope, k, kp) : NULL;
}

static struct tsr_tensor *dca_shift_k(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                      const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                      struct tsr_tensor *pos, int32_t delta) {
  struct dca_geometry geo;
  if (!k || !geometry_for(ctx, g, rope, &geo)) return NULL;
  if (delta % geo.c == 0) return k; /* every key keeps its position within its chunk */
  if (!pos) {
    h->graph->fail(g, TSR_ERR_UNSUPPORTED, "dca: a context shift by %d moves keys across "
                   "chunks of %d unevenly, and this host does not give the moved keys' positions "
                   "to re-rotate each one; refused (a shift by a multiple of %d needs none)",
                   delta, geo.c, geo.c);
    return NULL;
  }
  struct tsr_tensor *dp = positions(ctx, g, pos, &geo, DCA_POS_SHIFT, delta);
  return dp ? h->graph->rope_apply(g, rope, k, dp) : NULL;
}

static struct tsr_tensor *dca_build(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                    const struct tsr_attn_call *call) {
  struct dca_state *st = ctx;
  struct dca_geometry geo;
  if (!geometry_for(st, g, call->rope, &geo)) return NULL;
  const int32_t layer = call->layer ? call->layer->layer : -1;
  if (call->window > 0 || (call->layer && call->layer->kind != TSR_LAYER_FULL)) {
    h->graph->fail(g, TSR_ERR_UNSUPPORTED, "dca runs full-attention layers only; layer %d is a "
                   "sliding-window layer: keep flash there (attention: {full: dca, sliding: "
                   "flash})", layer);
    return NULL;
  }
  if (!call->causal || !call->q_pos || !call->kv_pos) {
    h->graph->fail(g, TSR_ERR_UNSUPPORTED, "dca (layer %d) needs causal attention with query "
                   "and key positions", layer);
    return NULL;
  }
  /* the K codec's query transform, applied to each query band once it is positioned */
  struct tsr_tensor *(*prepare_q)(const struct tsr_attn_call *, struct tsr_graph *,
                                  struct tsr_tensor *) = call->prepare_q;
  struct tsr_tensor_info qi, ki, vi;
  h->graph->tensor_info(call->q, &qi);
  h->graph->tensor_info(call->k, &ki);
  h->graph->tensor_info(call->v, &vi);
  if (qi.dtype != TSR_DTYPE_ID_F32 || (!prepare_q && qi.ne[0] != ki.ne[0]) || ki.ne[2] <= 0 ||
      qi.ne[2] % ki.ne[2] ||
      vi.ne[1] != ki.ne[1] || vi.ne[2] != ki.ne[2]) {
    h->graph->fail(g, TSR_ERR_INVALID_ARG, "dca (layer %d): q [%lld,%lld,%lld] k [%lld,%lld,%lld] "
                   "v [%lld,%lld,%lld] do not fit", layer, (long long)qi.ne[0],
                   (long long)qi.ne[1], (long long)qi.ne[2], (long long)ki.ne[0],
                   (long long)ki.ne[1], (long long)ki.ne[2], (long long)vi.ne[0],
                   (long long)vi.ne[1], (long long)vi.ne[2]);
    return NULL;
  }
  /* the codecs of what the cache holds; f32 and f16 are read in place */
  const struct tsr_kv_codec_v1 *kc = NULL, *vc = NULL;
  if (ki.dtype != TSR_DTYPE_ID_F32 && ki.dtype != TSR_DTYPE_ID_F16)
    kc = h->find_kv_codec(st->self, NULL, ki.dtype);
  if (vi.dtype != TSR_DTYPE_ID_F32 && vi.dtype != TSR_DTYPE_ID_F16)
    vc = h->find_kv_codec(st->self, NULL, vi.dtype);
  if ((ki.dtype != TSR_DTYPE_ID_F32 && ki.dtype != TSR_DTYPE_ID_F16 && !kc) ||
      (vi.dtype != TSR_DTYPE_ID_F32 && vi.dtype != TSR_DTYPE_ID_F16 && !vc) ||
      (kc && !kc->decode_f32 && !kc->decode_f16) || (vc && !vc->decode_f32 && !vc->decode_f16)) {
    h->graph->fail(g, TSR_ERR_UNSUPPORTED, "dca (layer %d): no CPU decoder for K dtype %d or V "
                   "dtype %d", layer, ki.dtype, vi.dtype);
    return NULL;
  }

  /* q [D, Nq, Hq] -> [D, Hq, Nq], rotated at each band's positions (the three runs of
  ** qpos3): three tensors of one layout, no copy of q beside the rotations */
  struct tsr_tensor *qv = h->graph->permute(g, call->q, 0, 2, 1, 3);
  struct tsr_tensor *qpos3 = positions(st, g, call->q_pos, &geo, DCA_POS_QUERY, 0);
  if (!qv || !qpos3) return NULL;
  struct tsr_tensor *qb[3];
  struct tsr_tensor_info qbi[3];
  /* decode (one query): one rotation of that query three times over (a view of stride 0),
  ** one launch where three would be; the bands are views of its rows */
  struct tsr_tensor *q3 = NULL;
  struct tsr_tensor_info q3i;
  if (qi.ne[1] == 1) {
    struct tsr_tensor_info qvi;
    h->graph->tensor_info(qv, &qvi);
    const int64_t ne3[3] = {qvi.ne[0], qvi.ne[1], 3};
    const size_t nb3[3] = {qvi.nb[0], qvi.nb[1], 0};
    struct tsr_tensor *x3 = h->graph->view(g, qv, 3, ne3, nb3, 0);
    if (!x3 || !(q3 = h->graph->rope_apply(g, call->rope, x3, qpos3))) return NULL;
    if (prepare_q && !(q3 = prepare_q(call, g, q3))) return NULL;
    h->graph->tensor_info(q3, &q3i);
  }
  for (int b = 0; b < 3; b++) {
    if (q3) {
      const int64_t ne1[3] = {q3i.ne[0], q3i.ne[1], 1};
      qb[b] = h->graph->view(g, q3, 3, ne1, q3i.nb, (size_t)b * q3i.nb[2]);
    } else { /* band b's run of qpos3 */
      const int64_t n = qi.ne[1];
      const size_t nb = sizeof(int32_t);
      struct tsr_tensor *pos = h->graph->view(g, qpos3, 1, &n, &nb, (size_t)b * (size_t)n * nb);
      qb[b] = pos ? h->graph->rope_apply(g, call->rope, qv, pos) : NULL;
      if (qb[b] && prepare_q) qb[b] = prepare_q(call, g, qb[b]);
    }
    if (!qb[b]) return NULL;
    h->graph->tensor_info(qb[b], &qbi[b]);
    if (qbi[b].ne[0] != ki.ne[0]) {
      h->graph->fail(g, TSR_ERR_INVALID_ARG, "dca (layer %d): queries of head dim %lld against "
                     "keys stored at %lld", layer, (long long)qbi[b].ne[0], (long long)ki.ne[0]);
      return NULL;
    }
    if (b && memcmp(qbi[b].nb, qbi[0].nb, sizeof qbi[0].nb)) {
      h->graph->fail(g, TSR_ERR_INTERNAL, "dca (layer %d): the rotated query bands differ in "
                     "layout", layer);
      return NULL;
    }
  }

  int32_t params[DCA_P_COUNT] = {0};
  dca_put_ptr(params, DCA_P_STATE, st);
  params[DCA_P_C] = geo.c;
  memcpy(&params[DCA_P_SCALE], &call->scale, sizeof(float));
  memcpy(&params[DCA_P_SOFTCAP], &call->softcap, sizeof(float));
  params[DCA_P_TEMP] = geo.temp_from;
  dca_put_ptr(params, DCA_P_KCODEC, kc);
  dca_put_ptr(params, DCA_P_VCODEC, vc);
  struct tsr_tensor *src[DCA_SRC_MASK + 1] = {qb[0],     qb[1],        qb[2],       call->k,
                                              call->v,   call->q_pos,  call->kv_pos, call->mask};
  /* a decode step's V skipping (tsr_attn_call.decode): its threshold, guards and counters */
  const struct tsr_decode_params *dp = call->decode;
  if (dp && (dp->v_skip_threshold > 0.0f || dp->v_skip_budget > 0.0f) && dp->counters) {
    if (call->mask) {
      h->graph->fail(g, TSR_ERR_INTERNAL, "dca (layer %d): decode parameters on a step with a "
                     "mask (several sequences)", layer);
      return NULL;
    }
    if (!(src[DCA_SRC_COUNTERS] = h->graph->decode_counters(g, dp))) return NULL;
    memcpy(&params[DCA_P_SKIP], &dp->v_skip_threshold, sizeof(float));
    memcpy(&params[DCA_P_BUDGET], &dp->v_skip_budget, sizeof(float));
    params[DCA_P_SINK] = dp->sink;
    params[DCA_P_RECENT] = dp->recent;
  }
  const int n_src = call->mask || src[DCA_SRC_COUNTERS] ? DCA_SRC_MASK + 1 : DCA_SRC_MASK;
  /* on cuda, rows past the output hold the split partials (dca.h) */
  const int64_t extra =
      st->on_cuda ? dca_split_rows(qi.ne[1], qi.ne[2], ki.ne[2], vi.ne[0], ki.ne[1]) : 0;
  const int64_t ne[3] = {vi.ne[0], qi.ne[2], qi.ne[1] + extra};
  struct tsr_tensor *out = h->graph->custom_op(g, g_attn_op, 3, ne, src, n_src, params,
                                               DCA_P_COUNT);
  if (!out || !extra) return out;
  struct tsr_tensor_info oi;
  h->graph->tensor_info(out, &oi);
  const int64_t ne_out[3] = {vi.ne[0], qi.ne[2], qi.ne[1]};
  return h->graph->view(g, out, 3, ne_out, oi.nb, 0);
}

static const struct tsr_attention_v1 g_dca = {
    .struct_size = sizeof(struct tsr_attention_v1),
    .name = "dca",
    .negotiate = dca_negotiate,
    .build = dca_build,
    .v_skip = true,
    .honours_decode = dca_honours_decode,
    .v_skip_budget = true, /* on the cpu: the composition refuses a budget elsewhere */
    .rotates = true,
    .prepare_k = dca_prepare_k,
    .shift_k = dca_shift_k,
    .applies_prepare_q = true,
};

/* ---- plugin ------------------------------------------------------------------ */

static const struct tsr_plugin_setting g_settings[] = {
    {"chunk_size", TSR_SETTING_INT, 0, 1073741823, "0", NULL,
     "CS, the largest relative distance attention sees; 0: the model's "
     "dual_chunk_attention_config, else 3/4 of its trained context, else 8192"},
    {"local_size", TSR_SETTING_INT, -1, 1073741823, "-1", NULL,
     "LS: queries see exact distances to the previous chunk's last LS+1 keys; the chunk length "
     "is CS - LS; -1: the model's, else chunk_size / 8"},
    {"temperature", TSR_SETTING_ENUM, 1, 0, "auto", "auto|none|yarn",
     "YaRN temperature on the logits past original_length: (0.1 ln((p+1)/L) + 1)^2; auto: "
     "when the model's dual_chunk_attention_config names its original length"},
    {"original_length", TSR_SETTING_INT, 0, 2147483647, "0", NULL,
     "L for the temperature; 0: the model's original length, else its trained context"},
};
#define N_SETTINGS (sizeof g_settings / sizeof g_settings[0])

/* Registers op `name` with its cpu kernel and its cuda kernel `cuda_symbol` in
** attn_dca_cuda.so beside the plugin (cuda/; opened only by a cuda run). */
static tsr_status register_op(const struct tsr_host *h, struct tsr_plugin *self, const char *name,
                              tsr_plugin_kernel_fn cpu, const char *cuda_symbol, int32_t *op) {
  if (*op >= 0) return TSR_OK;
  int32_t id;
  tsr_status st = h->kernel->register_op(self, name, &id);
  if (st == TSR_OK) st = h->kernel->register_kernel(self, id, "cpu", cpu, NULL);
  if (st == TSR_OK)
    st = h->kernel->register_kernel_lib(self, id, "cuda", "attn_dca_cuda.so", cuda_symbol,
                                        (void *)h);
  /* both kernels launch from their node alone and count on replay (cuda/dca_cuda.cu):
  ** a decode step holding them is captured as a CUDA graph, as flash's is */
  if (st == TSR_OK) st = h->kernel->declare_replayable(self, id, "cuda");
  if (st == TSR_OK) *op = id;
  return st;
}

static tsr_status register_ops(const struct tsr_host *h, struct tsr_plugin *self) {
  tsr_status st = register_op(h, self, "positions", dca_positions_cpu, "dca_positions_cuda",
                              &g_pos_op);
  if (st == TSR_OK)
    st = register_op(h, self, "attention", dca_attention_cpu, "dca_attention_cuda", &g_attn_op);
  return st;
}

static tsr_status dca_init(const struct tsr_host *h, struct tsr_plugin *self) {
  tsr_status st = register_ops(h, self);
  if (st != TSR_OK) return st;
  struct dca_state *s = calloc(1, sizeof *s);
  if (!s) return h->set_error(TSR_ERR_NOMEM, "attn_dca: out of memory");
  s->host = h;
  s->self = self;
  h->set_state(self, s);
  st = h->setting_i64(self, "chunk_size", &s->chunk_size);
  if (st == TSR_OK) st = h->setting_i64(self, "local_size", &s->local_size);
  if (st == TSR_OK) st = h->setting_i64(self, "original_length", &s->original_length);
  if (st == TSR_OK) st = h->setting_str(self, "temperature", &s->temperature);
  if (st == TSR_OK && s->chunk_size > 0 && s->local_size >= s->chunk_size)
    st = h->set_error(TSR_ERR_INVALID_ARG, "attn_dca: local_size %lld must be below chunk_size "
                      "%lld", (long long)s->local_size, (long long)s->chunk_size);
  if (st != TSR_OK) return st;
  struct tsr_attention_v1 a = g_dca; /* the host keeps its own copy */
  a.ctx = s;
  return h->register_attention(self, &a);
}

static void dca_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  free(h->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_ATTENTION, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "attn_dca",
    .version = "0.2.0",
    .description = "Dual Chunk Attention for contexts past the trained length",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = N_SETTINGS,
    .init = dca_init,
    .destroy = dca_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
