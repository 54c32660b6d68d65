/*
** Liveness planner. Each tensor that owns arena memory lives from the node
** that produces it to the last node that reads it (through any view of it).
** Inputs and outputs live for the whole graph. Offsets come from a
** first-fit allocator over a free list, so the peak is known before any
** memory exists.
*/
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"

struct free_block {
  size_t offset, size;
};

struct allocator {
  struct free_block *blocks; /* sorted by offset, never adjacent */
  int n, cap;
  size_t high_water;
};

static size_t align_up(size_t n) { return (n + TSR_ARENA_ALIGN - 1) & ~(size_t)(TSR_ARENA_ALIGN - 1); }

/* First fit in the free list, else grow the arena at its end. */
static size_t alloc_bytes(struct allocator *a, size_t size) {
  for (int i = 0; i < a->n; i++) {
    struct free_block *b = &a->blocks[i];
    if (b->size < size) continue;
    size_t off = b->offset;
    b->offset += size;
    b->size -= size;
    if (b->size == 0) {
      memmove(b, b + 1, (size_t)(a->n - i - 1) * sizeof *b);
      a->n--;
    }
    return off;
  }
  /* a free block touching the end of the arena can be extended */
  if (a->n > 0) {
    struct free_block *last = &a->blocks[a->n - 1];
    if (last->offset + last->size == a->high_water) {
      size_t off = last->offset;
      a->high_water = off + size;
      a->n--;
      return off;
    }
  }
  size_t off = a->high_water;
  a->high_water += size;
  return off;
}

static int free_bytes(struct allocator *a, size_t offset, size_t size) {
  int i = 0;
  while (i < a->n && a->blocks[i].offset < offset) i++;
  bool merge_prev = i > 0 && a->blocks[i - 1].offset + a->blocks[i - 1].size == offset;
  bool merge_next = i < a->n && offset + size == a->blocks[i].offset;
  if (merge_prev && merge_next) {
    a->blocks[i - 1].size += size + a->blocks[i].size;
    memmove(&a->blocks[i], &a->blocks[i + 1], (size_t)(a->n - i - 1) * sizeof *a->blocks);
    a->n--;
  } else if (merge_prev) {
    a->blocks[i - 1].size += size;
  } else if (merge_next) {
    a->blocks[i].offset = offset;
    a->blocks[i].size += size;
  } else {
    if (a->n == a->cap) {
      int cap = a->cap ? a->cap * 2 : 16;
      struct free_block *nb = realloc(a->blocks, (size_t)cap * sizeof *nb);
      if (!nb) return 0;
      a->blocks = nb;
      a->cap = cap;
    }
    memmove(&a->blocks[i + 1], &a->blocks[i], (size_t)(a->n - i) * sizeof *a->blocks);
    a->blocks[i] = (struct free_block){offset, size};
    a->n++;
  }
  return 1;
}

static const struct tsr_tensor *owner_of(const struct tsr_tensor *t) {
  return t->view_src ? t->view_src : t;
}

tsr_status tsr_graph_plan(struct tsr_graph *g, struct tsr_graph_plan *plan) {
  memset(plan, 0, sizeof *plan);
  if (g->status != TSR_OK) return tsr_error_set(g->status, "graph has a builder error");
  const int n = g->n;
  int *last_use = malloc((size_t)(n ? n : 1) * sizeof *last_use);
  if (!last_use) return tsr_error_set(TSR_ERR_NOMEM, "planner: no memory for %d tensors", n);

  for (int i = 0; i < n; i++) last_use[i] = i;
  for (int i = 0; i < n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (tsr_op_computes(t)) plan->n_nodes++;
    /* a node that writes through a view keeps the owner alive until it runs */
    if (t->view_src && last_use[t->view_src->index] < i) last_use[t->view_src->index] = i;
    for (int s = 0; s < TSR_MAX_SRC; s++) {
      if (!t->src[s]) continue;
      int o = owner_of(t->src[s])->index;
      if (last_use[o] < i) last_use[o] = i;
    }
  }
  /* inputs are written before the graph runs; outputs read after it ends */
  for (int i = 0; i < n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (t->flags & TSR_FLAG_OUTPUT) last_use[owner_of(t)->index] = n;
  }
  for (int i = 0; i < n; i++)
    if (g->tensors[i].flags & TSR_FLAG_INPUT) last_use[i] = n;

  struct allocator a = {0};
  tsr_status st = TSR_OK;
  /* inputs first: they must exist before node 0 runs */
  for (int pass = 0; pass < 2 && st == TSR_OK; pass++) {
    for (int i = 0; i < n; i++) {
      struct tsr_tensor *t = &g->tensors[i];
      bool input = (t->flags & TSR_FLAG_INPUT) != 0;
      if ((pass == 0) != input) continue;
      g->offsets[i] = TSR_NO_OFFSET;
      if (tsr_graph_owns_memory(t)) {
        size_t size = align_up(tsr_tensor_nbytes(t));
        g->offsets[i] = alloc_bytes(&a, size);
        plan->naive_bytes += size;
      }
      if (pass == 0) continue;
      /* free every owner whose last reader is this node */
      for (int s = 0; s <= TSR_MAX_SRC; s++) {
        const struct tsr_tensor *src = s < TSR_MAX_SRC ? t->src[s] : t;
        if (!src) continue;
        const struct tsr_tensor *o = owner_of(src);
        if (last_use[o->index] != i || g->offsets[o->index] == TSR_NO_OFFSET) continue;
        if (!tsr_graph_owns_memory(o)) continue;
        if (!free_bytes(&a, g->offsets[o->index], align_up(tsr_tensor_nbytes(o)))) {
          st = tsr_error_set(TSR_ERR_NOMEM, "planner: free list allocation failed");
          break;
        }
        last_use[o->index] = -1; /* freed once even if read twice by this node */
      }
    }
  }
  free(a.blocks);
  free(last_use);
  if (st != TSR_OK) return st;
  plan->arena_bytes = a.high_water;
  g->arena_bytes = a.high_water;
  g->planned = true;
  return TSR_OK;
}

tsr_status tsr_graph_bind_arena(struct tsr_graph *g, void *arena) {
  if (!g->planned) return tsr_error_set(TSR_ERR_INVALID_ARG, "bind before plan");
  if (g->arena_bytes && !arena) return tsr_error_set(TSR_ERR_INVALID_ARG, "bind: no arena");
  for (int i = 0; i < g->n; i++) {
    struct tsr_tensor *t = &g->tensors[i];
    if (g->offsets[i] != TSR_NO_OFFSET) t->data = (char *)arena + g->offsets[i];
  }
  for (int i = 0; i < g->n; i++) {
    struct tsr_tensor *t = &g->tensors[i];
    if (t->view_src) t->data = (char *)t->view_src->data + t->view_offs;
  }
  return TSR_OK;
}

size_t tsr_graph_offset_of(const struct tsr_graph *g, const struct tsr_tensor *t) {
  if (!t || t->index < 0 || t->index >= g->n || &g->tensors[t->index] != t) return TSR_NO_OFFSET;
  return g->offsets[t->index];
}
