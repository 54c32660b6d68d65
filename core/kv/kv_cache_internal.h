/*
** The KV cache's own structs, shared by kv_cache.c (cells, sequences) and
** kv_cache_graph.c (graph wiring). Nothing outside the cache includes this.
*/
#ifndef TSR_KV_CACHE_INTERNAL_H
#define TSR_KV_CACHE_INTERNAL_H

#include "kv/kv_cache.h"

struct tsr_kv__pool {
  int32_t n_cells; /* 0: the pool does not exist */
  int32_t window;  /* SLIDING: the largest window of its layers */
  uint64_t meta_bytes[3]; /* allocation sizes of pos, seqs, slots */
  int32_t *pos;    /* per cell; -1 empty */
  uint64_t *seqs;  /* per cell: bit s set when sequence s holds it */
  int32_t *slots;  /* the last prepare's cells, n_ubatch long */
  /* kept as cells change, so a decode step is not a pass over a million cells */
  int32_t n_used;    /* cells with pos >= 0 */
  int32_t free_hint; /* every cell below it is used: the first free cell is at or after it */
  int32_t hi;        /* every cell at or above it is free (frees leave it high; span lowers it) */
};

struct tsr_kv__layer {
  struct tsr_arch_layer desc;
  int pool;  /* where its K/V live (a shared layer: its source's); -1: none */
  int32_t owner; /* the layer whose buffers it reads (itself when it owns them) */
  const struct tsr_kv_codec_v1 *kc, *vc;
  bool k_lift, v_lift;
  size_t k_row, v_row;           /* bytes of one head of one cell */
  uint64_t k_bytes, v_bytes, state_bytes; /* allocation sizes (64-byte multiples) */
  void *k, *v;
  float *state; /* LINEAR: n_seq slots of desc.state_bytes */
  float *ckpt;  /* LINEAR: n_checkpoints rows of desc.state_bytes */
  uint64_t ckpt_bytes;
  /* the K (0) and V (1) codecs' persistent state (kv_codec.h, n_state) */
  int32_t codec_n_state[2];
  int64_t codec_state_ne[2][TSR_KV_CODEC_MAX_STATE][2];
  uint64_t codec_state_bytes[2][TSR_KV_CODEC_MAX_STATE];
  float *codec_state[2][TSR_KV_CODEC_MAX_STATE];
  /* the set_rows results of the last store, and the graph they belong to */
  uint64_t g_serial; /* tsr_graph_serial of that graph; 0: none */
  int g_index;
  struct tsr_tensor *k_all, *v_all;
};

struct tsr_kv_cache {
  struct tsr_kv_cache_params params;
  struct tsr_kv__pool pools[TSR_KV_POOL_COUNT];
  struct tsr_kv__layer *layers;
  int32_t n_layers;
  bool has_linear;
  uint64_t bytes; /* counted as allocated */
  /* per sequence: the largest position the sliding ring released (-1: none).
  ** A query at p needs keys (p - window, p], so the sequence can resume at p
  ** only when p - window >= released[s]. */
  int32_t released[TSR_KV_MAX_SEQ];
  /* each sequence's largest position in the full pool while seq_max_valid; prepare keeps
  ** it, the other changes drop it and the next read recounts */
  int32_t seq_max[TSR_KV_MAX_SEQ];
  bool seq_max_valid;
};

tsr_status tsr_kv__layout(const struct tsr_arch_layer *layers, int32_t n_layers,
                          const struct tsr_kv_layer_codecs *codecs,
                          const struct tsr_kv_cache_params *p, struct tsr_kv__layer *lay,
                          struct tsr_kv__pool *pools, struct tsr_kv_plan *plan);

#endif
