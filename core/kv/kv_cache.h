/*
** The KV cache: where every attention layer's keys and values live between
** forward passes, and the recurrent state of linear-attention layers.
**
** Pools. Cells are shared by all sequences (a unified cache, as llama.cpp's):
**   FULL     n_ctx cells. Its cell metadata always exists, even for a model
**            without full-attention layers, and records every token of every
**            sequence: n_ctx is the context of all sequences together and
**            seq_pos_max reads it.
**   SLIDING  one pool for all sliding-window layers, of
**            min(n_ctx, n_seq * (window + n_ubatch)) cells, window being the
**            largest window of the sliding layers. It is a ring: prepare
**            reuses cells that no query of this batch or a later one can see
**            (below), the oldest first, and only as many as the batch needs.
**   LINEAR   per linear layer, n_seq state slots of state_bytes (f32, zeroed).
** A layer with kv_shared_from != 0 reads another layer's K/V and owns nothing.
**
** Storage. Each owning attention layer has a K buffer and a V buffer, each
** one 64-byte aligned allocation laid out [head_dim, cells, n_head_kv] in its
** codec: ne0 = head dim (whole codec blocks), ne1 = cells, ne2 = kv heads; a
** row is one head of one cell. That is the k [D, Nkv, Hkv] the core flash op
** reads, so the whole pool is handed to attention as is. K and V codecs are
** chosen per layer by the caller (asymmetric pairs are normal).
**
** Bytes. tsr_kv_cache_plan_bytes computes, without allocating, exactly what
** tsr_kv_cache_new allocates (tsr_kv_cache_bytes): every K, V and state
** buffer, the codecs' persistent state (kv_codec.h, n_state) and the per-pool
** cell metadata, each rounded up to 64 bytes. The
** memory plan (core/abi/setup.c) calls it, so the plan and the allocation are
** one formula.
**
** Cells. Each pool cell holds a position (-1: empty) and a bitmask of the
** sequences that hold it (a cell copied to another sequence is shared, not
** duplicated). Per step:
**   1. tsr_kv_cache_prepare(pos[], seq[], n) picks one cell per token in each
**      pool and records its position and sequence;
**   2. the engine copies slots.cells[pool] into each layer's cells_idx input
**      and fills the attention inputs with tsr_kv_cache_fill_kv_pos (one
**      sequence) or tsr_kv_cache_fill_mask (several);
**   3. the graph writes K/V through tsr_kv_cache_store and attends over the
**      k_all / v_all it returns.
**
** The ring's release rule. A query at position P sees a key at q iff
** P - q < window, and positions grow within a sequence. So at prepare a cell
** may be released when every sequence holding it has tokens in this batch and
** q <= p_min(s) - window for each, p_min(s) being the smallest position of s
** in the batch. Cells of sequences absent from the batch are kept. Of those
** that may go, prepare releases only the n it needs, empty cells first and
** then the smallest positions, so a sequence keeps its last window + n_ubatch
** positions; past that share a sequence of the batch lets go of a cell even
** where another sequence shares it, so n_seq shares always fit the ring.
** Rolling a sequence back (seq_rm of its tail) to position p is safe while the
** ring still holds p - window + 1 onwards (tsr_kv_cache_seq_resume_min): a tail
** of up to n_ubatch tokens, so speculative decoding, prompt reuse and bench's
** repetitions at depth resume without a refill; an older rollback is refused.
**
** Recurrent state cannot be rolled back by position: seq_rm / seq_cp of part of
** a sequence are refused when the model has linear layers; removing a whole
** sequence zeroes its state slots and copying a whole sequence copies them.
** A speculation step keeps checkpoints instead (n_checkpoints rows per linear
** layer, the state after each token of the verify batch, written by the
** layer's ops); the engine copies the row of the last kept token back into the
** state slot and tsr_kv_cache_seq_rm_restored removes the rejected tokens' cells.
**
** Context shift (engine.h: tsr_engine_context_shift) drops positions
** [n_keep, n_keep + n_discard) with seq_rm, moves the rest down with
** seq_add, and has the arch re-rotate the moved cells' keys (K is stored
** after RoPE) through tsr_kv_cache_k_buffer. Cells keep their place; only
** their positions change, so masks and kv_pos follow by themselves.
*/
#ifndef TSR_KV_CACHE_H
#define TSR_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/plugin.h"

#define TSR_KV_MAX_SEQ 64 /* sequences are bits of a uint64_t */

enum tsr_kv_pool {
  TSR_KV_POOL_FULL = 0,
  TSR_KV_POOL_SLIDING = 1,
  TSR_KV_POOL_COUNT = 2,
};

struct tsr_kv_cache_params {
  int32_t n_ctx;    /* cells of the full-attention pool, all sequences together */
  int32_t n_seq;    /* 1..TSR_KV_MAX_SEQ */
  int32_t n_ubatch; /* most tokens one prepare writes */
  int32_t n_checkpoints; /* per linear layer, state rows for a speculation step (0: none) */
};

/* K and V codec of one layer; read only for layers that own K/V. */
struct tsr_kv_layer_codecs {
  const struct tsr_kv_codec_v1 *k, *v;
  bool k_lift, v_lift; /* attention reads them lifted to f16 (TSR_READ_LIFT) */
};

struct tsr_kv_plan {
  uint64_t bytes;                               /* everything; = tsr_kv_cache_bytes */
  uint64_t kind_bytes[TSR_LAYER_KIND_COUNT];    /* per layer kind, pool metadata included
                                                ** (FULL's even without full layers) */
  uint64_t kind_cells[TSR_LAYER_KIND_COUNT];    /* cells of the kind's pool (LINEAR: state
                                                ** slots per layer); 0 if no layer owns one */
  int32_t window;                               /* the sliding pool's window */
};

struct tsr_kv_cache;

/* Exact bytes tsr_kv_cache_new would allocate. Errors name the layer (and
** codec): a head dim that is not whole codec blocks, a missing codec, a bad
** window or state size, a KV-shared layer whose source owns nothing. */
tsr_status tsr_kv_cache_plan_bytes(const struct tsr_arch_layer *layers, int32_t n_layers,
                                   const struct tsr_kv_layer_codecs *codecs,
                                   const struct tsr_kv_cache_params *params,
                                   struct tsr_kv_plan *out);
/* layers and codecs are copied (the codec structs are referenced: they must
** outlive the cache). Everything starts empty and zeroed. */
tsr_status tsr_kv_cache_new(const struct tsr_arch_layer *layers, int32_t n_layers,
                            const struct tsr_kv_layer_codecs *codecs,
                            const struct tsr_kv_cache_params *params, struct tsr_kv_cache **out);
void tsr_kv_cache_free(struct tsr_kv_cache *c);
/* Bytes allocated, counted at allocation. */
uint64_t tsr_kv_cache_bytes(const struct tsr_kv_cache *c);

int32_t tsr_kv_cache_n_cells(const struct tsr_kv_cache *c, enum tsr_kv_pool pool);
/* Cells [0, span) hold every used cell of the pool: what a step's attention
** reads, so its cost follows the tokens held, not n_ctx. A multiple of
** TSR_KV_SPAN_STEP (a graph keeps its shapes for that many decode steps),
** at most n_cells, at least one step. Amortized O(1): the bound kept by
** prepare is lowered past cells freed since. */
#define TSR_KV_SPAN_STEP 256
int32_t tsr_kv_cache_span(struct tsr_kv_cache *c, enum tsr_kv_pool pool);
/* The pool a layer's K/V live in (a shared layer: its source's), or -1. */
int tsr_kv_cache_layer_pool(const struct tsr_kv_cache *c, int32_t layer);
/* The K and V codecs layer reads (its source's when it shares K/V); NULL for a
** layer without K/V. */
void tsr_kv_cache_layer_codecs(const struct tsr_kv_cache *c, int32_t layer,
                               const struct tsr_kv_codec_v1 **k, const struct tsr_kv_codec_v1 **v);
/* Whether attention reads layer's K and V lifted to f16. */
void tsr_kv_cache_layer_lifts(const struct tsr_kv_cache *c, int32_t layer, bool *k, bool *v);
/* The dim a codec stores rows of head_dim values at: its storage_dim hook's
** answer, else head_dim; 0 when it cannot store that head dim. */
int32_t tsr_kv_codec_storage_dim(const struct tsr_kv_codec_v1 *codec, int32_t head_dim);
/* One cell's position (-1 empty) and sequence bitmask. */
int32_t tsr_kv_cache_cell_pos(const struct tsr_kv_cache *c, enum tsr_kv_pool pool, int32_t cell);
uint64_t tsr_kv_cache_cell_seqs(const struct tsr_kv_cache *c, enum tsr_kv_pool pool, int32_t cell);

/* ---- one step ------------------------------------------------------------ */

/* cells[pool][i]: the cell of token i in that pool; NULL for a pool no layer
** uses. Owned by the cache, valid until the next prepare. */
struct tsr_kv_slots {
  int32_t n;
  const int32_t *cells[TSR_KV_POOL_COUNT];
};

/* Picks cells for n tokens (n <= n_ubatch; pos >= 0; seq in [0, n_seq)) in
** every pool (FULL: empty cells; SLIDING: empty or released cells), records
** their positions and sequences. Not enough cells: TSR_ERR_NOMEM ("context
** full: ...") and the cache is unchanged. */
tsr_status tsr_kv_cache_prepare(struct tsr_kv_cache *c, const int32_t *pos, const int32_t *seq,
                                int32_t n, struct tsr_kv_slots *out);
/* Writes zero bytes over the host K/V rows of the cells s picked (the last prepare's), in
** every layer owning K/V: a fill of positions only leaves them so on the cpu, whose
** attention reads these buffers, as a store would write its rows. */
void tsr_kv_cache_zero_rows(struct tsr_kv_cache *c, const struct tsr_kv_slots *s);
/* kv_pos[cell] for the cells [0, n_cells) = the cell's position, -1 if empty
** or (seq >= 0) not held by seq (flash hides kv_pos < 0). seq < 0: every
** cell's position, for a batch of several sequences, whose mask then says
** which cells each query sees. n_cells: the pool's, or its span. */
void tsr_kv_cache_fill_kv_pos(const struct tsr_kv_cache *c, enum tsr_kv_pool pool, int32_t seq,
                              int32_t n_cells, int32_t *kv_pos);
/* Additive mask [n_cells x n] (mask[j * n_cells + cell], the flash op's
** [Nkv, Nq]) over the cells [0, n_cells): 0 where the cell is visible to
** query j, else -INFINITY. Visible
** iff the cell holds q_seq[j], and pos <= q_pos[j] when causal, and
** q_pos[j] - pos < window when window > 0. */
void tsr_kv_cache_fill_mask(const struct tsr_kv_cache *c, enum tsr_kv_pool pool,
                            const int32_t *q_pos, const int32_t *q_seq, int n, bool causal,
                            int32_t window, int32_t n_cells, float *mask);

/* ---- graph wiring --------------------------------------------------------- */

struct tsr_graph;
struct tsr_tensor;

/* Appends the writes of one layer's new K and V (f32 [head_dim, n, n_head_kv],
** views allowed) into the cells cells_idx (i32 [n], this layer's pool's
** slots) and returns in k_all / v_all the whole pool as [D, cells, Hkv] in
** the layer's codecs: the set_rows results, so they come after the writes
** in graph order. A shared layer's views after this call in the same graph
** are these same tensors. On error the graph's error is set and the
** outputs are NULL. */
void tsr_kv_cache_store(struct tsr_graph *g, struct tsr_kv_cache *c, int32_t layer,
                        struct tsr_tensor *k, struct tsr_tensor *v, struct tsr_tensor *cells_idx,
                        struct tsr_tensor **k_all, struct tsr_tensor **v_all);
/* A linear layer's checkpoint rows (n_checkpoints of state_bytes each), or NULL. */
float *tsr_kv_cache_checkpoints(const struct tsr_kv_cache *c, int32_t layer);
int32_t tsr_kv_cache_n_checkpoints(const struct tsr_kv_cache *c);
/* Removes sequence seq's cells at p0 and above after the caller put every linear
** layer's state slot of seq back to the state after p0 - 1 (a checkpoint row, copied
** where the backend keeps the cache); unlike seq_rm, allowed on a model with linear
** layers. */
tsr_status tsr_kv_cache_seq_rm_restored(struct tsr_kv_cache *c, int32_t seq, int32_t p0);

/* The persistent state of the layer's K (is_k) or V codec (kv_codec.h, n_state)
** as f32 external tensors of g, its source's for a KV-shared layer; NULL past
** the codec's n_state. */
void tsr_kv_cache_codec_state(struct tsr_graph *g, const struct tsr_kv_cache *c, int32_t layer,
                              bool is_k, struct tsr_tensor *state[TSR_KV_CODEC_MAX_STATE]);

/* An owning layer's K buffer as an external [head_dim_k, cells, n_head_kv]
** tensor in its codec (what context shift reads with get_rows and writes
** back with set_rows); NULL with the graph's error set for a layer that
** owns no K. */
struct tsr_tensor *tsr_kv_cache_k_buffer(struct tsr_graph *g, struct tsr_kv_cache *c,
                                         int32_t layer);
/* The K/V a layer reads without writing: for a KV-shared layer its source's
** (the very tensors store returned when the source was stored in g, else
** plain views of the buffers); for an owning layer its own buffers. */
void tsr_kv_cache_layer_views(struct tsr_graph *g, struct tsr_kv_cache *c, int32_t layer,
                              struct tsr_tensor **k_all, struct tsr_tensor **v_all);

/* ---- sequences ------------------------------------------------------------ */

/* Removes positions [p0, p1) of seq (seq < 0: every sequence; p0 < 0: from
** 0; p1 < 0: to the end). Refused for part of a sequence when there are
** linear layers (their state cannot roll back); the cache is then unchanged. */
tsr_status tsr_kv_cache_seq_rm(struct tsr_kv_cache *c, int32_t seq, int32_t p0, int32_t p1);
/* dst also holds src's cells at positions [p0, p1) (shared, no copy); a whole
** copy also copies linear state slots, a partial one is refused with linear
** layers. dst should hold nothing at those positions. */
tsr_status tsr_kv_cache_seq_cp(struct tsr_kv_cache *c, int32_t src, int32_t dst, int32_t p0,
                               int32_t p1);
/* Adds delta to the positions [p0, p1) of seq (p0 < 0: from 0; p1 < 0: to
** the end), in every pool. Refused, with the cache unchanged, when a moved
** cell is also held by another sequence (its position is theirs too), or
** when a position would become negative or land on one seq still holds
** outside the range. It moves metadata only: re-rotating the keys is the
** caller's (context shift). */
tsr_status tsr_kv_cache_seq_add(struct tsr_kv_cache *c, int32_t seq, int32_t p0, int32_t p1,
                                int32_t delta);
/* Drops every sequence but seq. */
void tsr_kv_cache_seq_keep(struct tsr_kv_cache *c, int32_t seq);
/* The smallest position seq can resume at after removing its tail: a query
** at p needs the sliding ring's keys (p - window, p], and the ring may have
** released older ones (0 when nothing was released). seq_rm of a tail below
** it is refused. */
int32_t tsr_kv_cache_seq_resume_min(const struct tsr_kv_cache *c, int32_t seq);
/* Largest position of seq, -1 if it holds none. */
int32_t tsr_kv_cache_seq_pos_max(const struct tsr_kv_cache *c, int32_t seq);
/* The same for every sequence: out[n_seq]. Both are kept as cells change (a decode step
** costs no pass over the cells) and recounted after removals, copies and shifts. */
void tsr_kv_cache_seq_pos_max_all(const struct tsr_kv_cache *c, int32_t *out);
/* Cells of pool that hold no sequence, kept as cells change. */
int32_t tsr_kv_cache_n_free(const struct tsr_kv_cache *c, enum tsr_kv_pool pool);
/* Empties every pool and zeroes every state. */
void tsr_kv_cache_clear(struct tsr_kv_cache *c);

/* A linear layer's state slot for seq: state_bytes / 4 floats; NULL for a
** layer without state or a bad seq. */
float *tsr_kv_cache_state(struct tsr_kv_cache *c, int32_t layer, int32_t seq);

/* Calls fn on every buffer whose bytes graphs read or write (each layer's K,
** V and state allocation), so a device backend can keep them
** (tsr_backend_keep); stops at the first error fn returns. */
tsr_status tsr_kv_cache_each_buffer(const struct tsr_kv_cache *c,
                                    tsr_status (*fn)(void *ctx, void *p, size_t bytes), void *ctx);

#endif
