/*
** InnerQ: per-channel scales of the keys before the rotation, the queries scaled
** inversely, so q.k is unchanged and channels that carry most of a key's energy
** (a large K bias, an outlier channel) carry less of the block's quantization error.
** Off unless a setting names a file:
**   innerq_calibrate: FILE   the keys' channel statistics of this run, per layer,
**                            written to FILE when the plugin unloads (cpu backend);
**   innerq_scales: FILE      K scales from such a file: s_c = (mean_rms / rms_c) ^
**                            strength, clamped to [1/range, range], one per layer and
**                            channel (shared by the layer's KV heads, so a query of any
**                            head takes the same inverse whatever layout attention
**                            hands it).
** The file is text: a line "kv_turbo-innerq 1", then per layer
** "layer L dim D rows R" and a line of D channel RMS values (%.9g).
*/
#ifndef KV_TURBO_INNERQ_H
#define KV_TURBO_INNERQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tessera/plugin.h>

#define INNERQ_MAX_LAYERS 4096
#define INNERQ_MAX_DIM 4096

struct innerq_layer {
  int32_t dim;    /* 0: no record */
  int64_t rows;   /* rows measured */
  double *values; /* dim of them: sums of squares while calibrating, RMS once loaded */
};

struct innerq {
  struct innerq_layer layer[INNERQ_MAX_LAYERS];
  double strength, range;
};

/* Reads FILE's records into q (RMS per channel); a malformed file is refused with its
** line named. */
tsr_status innerq_load(const struct tsr_host *h, struct innerq *q, const char *path);
/* Writes q's sums of squares as FILE's RMS records, through a new temporary file beside
** it renamed over FILE (a failed write leaves an old FILE whole); false with why[n]. */
bool innerq_write(const struct innerq *q, const char *path, char *why, size_t n);
/* Makes room for layer's sums of squares at head dim dim (layer and dim within
** INNERQ_MAX_LAYERS and INNERQ_MAX_DIM); false when out of memory or the layer has
** another head dim already. */
bool innerq_reserve(struct innerq *q, int32_t layer, int32_t dim);
/* Adds n rows of dim values to the sums of a layer innerq_reserve made room for. */
void innerq_measure(struct innerq *q, int32_t layer, const float *rows, int32_t dim, int64_t n);
/* Layer's K scales (inverse: 1/s, for the queries) into out[dim]; the layer must have
** a record of that dim. */
tsr_status innerq_scales(const struct tsr_host *h, const struct innerq *q, int32_t layer,
                         int32_t dim, bool inverse, float *out);
void innerq_free(struct innerq *q);

#endif
