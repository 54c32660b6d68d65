/*
** attn_dca's pieces: the plugin (attn_dca.c: settings, negotiation, graph
** building) and its CPU kernels (dca_cpu.c). Dual Chunk Attention as in
** /work/shared/reference/dca.md: CS = chunk_size, LS = local_size, C = CS - LS
** the chunk length; p = n*C + r.
**   keys     rotated once, at r (stored that way in the KV cache)
**   queries  rotated three ways: intra r, successive min(r + C, CS),
**            inter min(2C - 1, CS)
**   bands    by the key's absolute position kp: intra kp >= nC (causal),
**            successive (n-1)C <= kp < nC, inter kp < (n-1)C
** The three bands go through one online softmax, so a band with no key adds
** nothing and no geometry divides by zero.
*/
#ifndef TSR_ATTN_DCA_H
#define TSR_ATTN_DCA_H

#include <stdint.h>

#include "tessera/plugin.h"

/* Per host: the plugin's settings and where it counts what it did. */
struct dca_state {
  const struct tsr_host *host;
  struct tsr_plugin *self;
  int64_t chunk_size;      /* 0: from the model */
  int64_t local_size;      /* -1: from the model */
  int64_t original_length; /* 0: from the model */
  const char *temperature; /* auto | none | yarn */
  int logged;              /* the geometry was logged once */
  int on_cuda; /* some layer was negotiated for cuda: graphs plan the split rows (dca_split_rows;
               ** a cpu graph of a host that also runs cuda only carries them unused) */
  /* positions ops of the graph being built (host->graph->serial; a host builds one graph at a
  ** time): every layer rotates at the same positions, so each op is built once a graph */
  struct dca_pos_memo {
    uint64_t serial; /* 0: empty */
    const struct tsr_tensor *pos;
    int32_t params[4];
    struct tsr_tensor *out;
  } pos_memo[4];
};

/* The geometry one layer runs with, resolved from the settings and what the
** arch says about the model (struct tsr_attn_rope). */
struct dca_geometry {
  int32_t cs, ls, c;
  int32_t temp_from; /* YaRN temperature past this many positions; 0: none */
};

/* What the positions op computes from i32 positions p. */
enum dca_pos_mode {
  DCA_POS_QUERY = 0, /* [3N]: r, min(r + C, CS), min(2C - 1, CS) */
  DCA_POS_KEY = 1,   /* [N]: r */
  DCA_POS_SHIFT = 2, /* [N]: ((p + delta) mod C) - (p mod C) */
};

/* Attention op sources: the queries rotated at each band's positions (intra, successive,
** inter; [D, Hq, Nq] each, the same strides), K and V, the query and key positions, and,
** when there is an eighth: with decode parameters (DCA_P_SKIP or DCA_P_BUDGET > 0) the
** layer's struct tsr_decode_counters, else the mask. Decode parameters come on one
** sequence's decode step, which has no mask. */
enum {
  DCA_SRC_Q = 0, /* 3 */
  DCA_SRC_K = 3,
  DCA_SRC_V = 4,
  DCA_SRC_Q_POS = 5,
  DCA_SRC_KV_POS = 6,
  DCA_SRC_MASK = 7,
  DCA_SRC_COUNTERS = 7,
};

/* Attention op params (int32 words). */
enum {
  DCA_P_STATE = 0,  /* 2 words: struct dca_state * (counters) */
  DCA_P_C = 2,
  DCA_P_SCALE = 3,  /* float bits */
  DCA_P_SOFTCAP = 4,
  DCA_P_TEMP = 5,   /* temp_from */
  DCA_P_KCODEC = 6, /* 2 words each: const struct tsr_kv_codec_v1 * (NULL: read in place) */
  DCA_P_VCODEC = 8,
  DCA_P_SKIP = 10,  /* float bits: struct tsr_decode_params' threshold; 0: none */
  DCA_P_BUDGET = 11, /* float bits: its mass budget; 0: none */
  DCA_P_SINK = 12,
  DCA_P_RECENT = 13,
  DCA_P_COUNT = 14,
};

/* The cuda kernel's split-KV partials live in rows planned past the output's Nq
** (no allocation at run time, so a decode step replays as a CUDA graph without
** memory nodes). Sized as tsr_tile_attn_plan splits (about two blocks of up to 64
** rows a multiprocessor, at least 256 keys a split) for up to DCA_SPLIT_SMS
** multiprocessors; the kernel takes no more splits than the rows hold. */
#define DCA_SPLIT_SMS 160

/* Rows of dv x hq floats past the output for a call's partials (0: one split). */
static inline int64_t dca_split_rows(int64_t nq, int64_t hq, int64_t hkv, int64_t dv,
                                     int64_t nkv) {
  if (nq <= 0 || hkv <= 0 || hq % hkv || dv <= 0) return 0;
  const int64_t units = (nq * (hq / hkv) + 63) / 64 * hkv, most = (nkv + 255) / 256;
  int64_t splits = (2 * DCA_SPLIT_SMS + units - 1) / units;
  if (splits > most) splits = most;
  if (splits <= 1) return 0;
  const int64_t floats = nq * hq * splits * (dv + 2);
  return (floats + dv * hq - 1) / (dv * hq);
}

/* A host pointer in two param words (the cpu and cuda kernels both read it). */
static inline void dca_put_ptr(int32_t *params, int at, const void *p) {
  const uint64_t u = (uint64_t)(uintptr_t)p;
  params[at] = (int32_t)(uint32_t)u;
  params[at + 1] = (int32_t)(uint32_t)(u >> 32);
}

static inline const void *dca_get_ptr(const int32_t *params, int at) {
  const uint64_t u = (uint64_t)(uint32_t)params[at] | (uint64_t)(uint32_t)params[at + 1] << 32;
  return (const void *)(uintptr_t)u;
}

/* CPU kernels (dca_cpu.c); the cuda ones are cuda/dca_cuda.cu's, in attn_dca_cuda.so */
void dca_positions_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params);
void dca_attention_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params);

/* The YaRN temperature on the logits of a query at p: (0.1 ln((p+1)/from) + 1)^2
** past `from` positions, else 1. */
float dca_logit_gain(int32_t p, int32_t from);

/* Whether the op's eighth source is the decode counters (else the mask). */
static inline bool dca_has_decode(const int32_t *params) {
  return params[DCA_P_SKIP] != 0 || params[DCA_P_BUDGET] != 0; /* the bits of 0.0f */
}

#endif
