/* CUDA graph capture: what may be captured and the signature of a compute (cuda_graphs.h). */
#include "cuda_graphs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"

bool tsr_cuda_graph_capturable(const struct tsr_graph *g,
                               bool (*on_device)(void *ctx, const struct tsr_tensor *node),
                               void *ctx, int (*replayable)(int32_t op_id, const char *backend),
                               char *why, size_t why_len) {
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (!tsr_op_computes(t)) continue;
    const char *no = NULL;
    if (t->op == TSR_OP_CUSTOM && !(replayable && replayable(t->op_params[0], "cuda")))
      no = "a plugin op whose cuda kernel is not declared replayable";
    else if (t->op == TSR_OP_MAT_MUL && !on_device(ctx, t)) no = "a batched product";
    else if (t->op == TSR_OP_MAT_MUL_ID && !on_device(ctx, t))
      no = "an expert product of many pairs";
    if (no) {
      snprintf(why, why_len, "%s ('%s')", no, t->name);
      return false;
    }
  }
  return true;
}

/* What a launch reads of tensor t: its layout and where it lives. */
struct sig_tensor {
  int32_t dtype;
  int64_t ne[TSR_MAX_DIMS];
  size_t nb[TSR_MAX_DIMS];
  const char *dptr;
};

struct sig_node {
  int32_t op;
  int32_t op_params[TSR_MAX_OP_PARAMS];
  struct sig_tensor self, src[TSR_MAX_SRC]; /* every slot: sources may skip one (no mask) */
};

static void sig_tensor_of(const struct tsr_tensor *t, char *const *dptr, struct sig_tensor *s) {
  s->dtype = (int32_t)t->dtype;
  memcpy(s->ne, t->ne, sizeof s->ne);
  memcpy(s->nb, t->nb, sizeof s->nb);
  s->dptr = dptr[t->index];
}

size_t tsr_cuda_graph_signature(const struct tsr_graph *g, char *const *dptr, const void *extra,
                                size_t extra_len, unsigned char **buf, size_t *cap) {
  size_t len = 0;
  for (int pass = 0; pass < 2; pass++) { /* 0: the length; 1: the bytes */
    if (pass == 1 && len > *cap) {
      unsigned char *b = realloc(*buf, len);
      if (!b) return 0;
      *buf = b, *cap = len;
    }
    size_t at = 0;
    for (int i = 0; i < g->n; i++) {
      const struct tsr_tensor *t = &g->tensors[i];
      if (!tsr_op_computes(t)) continue;
      if (pass == 1) {
        struct sig_node n;
        memset(&n, 0, sizeof n); /* padding too: the bytes are compared whole */
        n.op = (int32_t)t->op;
        memcpy(n.op_params, t->op_params, sizeof n.op_params);
        sig_tensor_of(t, dptr, &n.self);
        for (int k = 0; k < TSR_MAX_SRC; k++)
          if (t->src[k]) sig_tensor_of(t->src[k], dptr, &n.src[k]);
        memcpy(*buf + at, &n, sizeof n);
      }
      at += sizeof(struct sig_node);
    }
    if (pass == 1) memcpy(*buf + at, extra, extra_len);
    len = at + extra_len;
  }
  return len;
}

struct tsr_cuda_graph_slot *tsr_cuda_graph_find(struct tsr_cuda_graph_cache *c,
                                                const unsigned char *sig, size_t len) {
  for (int i = 0; i < c->n_slots; i++) {
    struct tsr_cuda_graph_slot *s = &c->slot[i];
    if (s->sig && s->len == len && !memcmp(s->sig, sig, len)) {
      s->used = ++c->clock;
      return s;
    }
  }
  return NULL;
}

static void slot_drop(struct tsr_cuda_graph_cache *c, struct tsr_cuda_graph_slot *s) {
  if (s->exec && c->drop) c->drop(s->exec);
  s->exec = NULL;
  s->refused = false;
}

struct tsr_cuda_graph_slot *tsr_cuda_graph_take(struct tsr_cuda_graph_cache *c,
                                                const unsigned char *sig, size_t len) {
  struct tsr_cuda_graph_slot *s = &c->slot[0];
  for (int i = 0; i < c->n_slots; i++) {
    if (!c->slot[i].sig) {
      s = &c->slot[i];
      break;
    }
    if (c->slot[i].used < s->used) s = &c->slot[i];
  }
  slot_drop(c, s);
  if (len > s->cap) {
    unsigned char *b = realloc(s->sig, len);
    if (!b) {
      free(s->sig);
      *s = (struct tsr_cuda_graph_slot){0};
      return NULL;
    }
    s->sig = b, s->cap = len;
  }
  if (!s->sig) return NULL; /* len 0: no signature to keep */
  memcpy(s->sig, sig, len);
  s->len = len;
  s->used = ++c->clock;
  return s;
}

void tsr_cuda_graph_cache_clear(struct tsr_cuda_graph_cache *c) {
  for (int i = 0; i < TSR_CUDA_GRAPH_SLOTS_MAX; i++) {
    slot_drop(c, &c->slot[i]);
    free(c->slot[i].sig);
    c->slot[i] = (struct tsr_cuda_graph_slot){0};
  }
}
