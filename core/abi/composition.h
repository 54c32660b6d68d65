/*
** Negotiation: for every layer of the model, the chosen attention
** implementation says how it reads that layer's K and V codecs on the
** active backend; each decode policy and the speculator say whether they
** can act. Any gap is an error naming the layer, the plugin, the codec and
** what is missing. The result is printed per layer kind.
*/
#ifndef TSR_COMPOSITION_H
#define TSR_COMPOSITION_H

#include <stdio.h>

#include "abi/plugin_host.h"

#define TSR_COMPOSE_MAX_POLICIES 8

struct tsr_composition_request {
  const char *backend;
  const char *attention;                          /* every layer kind's ... */
  const char *attention_kind[TSR_LAYER_KIND_COUNT]; /* ... unless named here per kind */
  const char *k_codec[TSR_LAYER_KIND_COUNT]; /* per layer kind */
  const char *v_codec[TSR_LAYER_KIND_COUNT];
  /* kv.boundary: the first and last boundary_layers layers that keep K/V store them in
  ** boundary_k / boundary_v instead (NULL: the kind's) */
  int boundary_layers;
  const char *boundary_k, *boundary_v;
  bool refuse_lift; /* a codec attention reads only by lifting it to f16 is refused */
  bool decode_on_tiles; /* cuda's backend.attention.decode is `tiles`: no GQA decode kernel,
                        ** which is where decode policies act on cuda */
  bool exact_f32;       /* cuda's backend.precision f32: no codec read with f16 operands */
  const char *const *policies;
  int n_policies;
  const char *speculator; /* NULL: none */
  const struct tsr_gguf *model; /* the speculator's negotiate reads it */
  const struct tsr_arch_layer *layers;
  int n_layers;
};

/* A group is the layers of one kind with one K/V codec pair: a kind's own, and its
** boundary layers' (and, for layers reading another's K/V, their source's). */
#define TSR_COMPOSITION_MAX_GROUPS (4 * TSR_LAYER_KIND_COUNT)

struct tsr_composition_group {
  enum tsr_layer_kind kind;
  bool boundary;           /* kv.boundary's layers */
  int n_layers;
  char layer_list[96];     /* "0-4,6-10,..." */
  bool uniform_heads;      /* every layer of the group has the same head shape */
  struct tsr_arch_layer first; /* head shape of the group's first layer */
  char k_codec[32], v_codec[32];
  enum tsr_read_path k_path, v_path;
  /* how each is read, as printed: "in-register", or for a plugin's codec
  ** "example_codec 1.0.0; native as f16; hooks prepare_rows, prepare_q" */
  char k_how[160], v_how[160];
  char attention[160];     /* "dca (attn_dca 1.0.0)"; "" for linear layers */
  /* what the decode policies do on the group's first layer, as printed, and whether
  ** a later layer of the group got other parameters */
  char policies[320];
  struct tsr_decode_params policy_params;
  bool policies_vary;
};

struct tsr_composition {
  char backend[16];
  char attention[160];       /* the request's `attention`: "flash (core 0.1.0)" */
  char policies[256];        /* "sparse_v (sparse_v 0.1.0)" or "none" */
  char speculator[128];      /* or "none" */
  struct tsr_composition_group groups[TSR_COMPOSITION_MAX_GROUPS];
  int n_groups;
};

tsr_status tsr_compose(const struct tsr_plugin_host *h, const struct tsr_composition_request *r,
                       struct tsr_composition *out);
/* Layer i's K and V codec names under r: its kind's ("f16" where the request names
** none), or kv.boundary's where the layer is among the first or last boundary_layers
** layers that keep K/V; a layer reading layer j's K/V has layer j's codecs. NULL, NULL
** for a layer with recurrent state. *boundary (may be NULL): the boundary's were taken. */
void tsr_compose_layer_codecs(const struct tsr_composition_request *r, int i, const char **k,
                              const char **v, bool *boundary);
/* Layer i's description as plugins see it (struct tsr_layer_desc), from r. */
void tsr_compose_layer_desc(const struct tsr_composition_request *r, int i,
                            struct tsr_layer_desc *d);
/* Layer i's decode parameters from r's decode policies (their params hooks): zeroed
** but for struct_size and p->counters (kept) where none acts, else what the one acting
** policy (*policy, its plugin *owner) set. Two policies setting one layer's threshold,
** and parameters out of range, are refused naming the layer and the policy. */
tsr_status tsr_compose_decode_params(const struct tsr_plugin_host *h,
                                     const struct tsr_composition_request *r, int i,
                                     struct tsr_decode_params *p,
                                     const struct tsr_decode_policy_v1 **policy,
                                     const struct tsr_plugin **owner);
/* The group holding layer i, as tsr_compose made it from r; NULL for none. */
const struct tsr_composition_group *tsr_composition_group_of(const struct tsr_composition *c,
                                                             const struct tsr_composition_request *r,
                                                             int i);
void tsr_composition_print(const struct tsr_composition *c, FILE *f);
const char *tsr_layer_kind_name(enum tsr_layer_kind kind);
/* Parses "full", "sliding", "linear"; -1 if none. */
int tsr_layer_kind_from_name(const char *name);
const char *tsr_read_path_name(enum tsr_read_path path);

#endif
