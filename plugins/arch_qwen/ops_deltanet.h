/*
** Gated DeltaNet's two ops that the core does not have, as plugin ops with
** CPU kernels (ops_deltanet.c); forward_qwen35.c appends them through
** host->graph->custom_op.
**
**   conv1d      depthwise causal convolution over time, no bias:
**               x f32 [C, N], w [K, C] (GGUF ssm_conv1d) -> [C, N],
**               y[c,t] = sum_j w[c,j] * x[c, t-K+1+j], x before t=0 is zero;
**               or, with srcs 2 and 3 (history in / out, f32 [K-1, C], may be
**               the same memory), x before t=0 is history[K-1+t, c] and the
**               last K-1 inputs are written to history out (a decode step);
**               src 4 (with the history), checkpoints f32 [K-1, C, N]: the
**               history after each step t into [:, :, t] (a speculation step).
**   delta_rule  the gated delta rule per value head, state S [dk x dv]:
**               S <- exp(g)*S; u = S^T k; S <- S + k (beta (v - u))^T; o = S^T q.
**               srcs q [dk, Hk, N], k [dk, Hk, N], v [dv, Hv, N], g [Hv, N],
**               beta [Hv, N], optional initial state [dv, Hv, dk] (else zero);
**               dst [dv, Hv, N + dk]: o for t < N, then the final state
**               (dst[j, h, N + i] = S_h[i][j]), which the kernel works in;
**               params[1] (when the initial state is given): 1 also writes
**               the final state back over it (the KV cache's state slot).
**               src 6 (with the initial state), checkpoints f32 [dv, Hv, dk, N]:
**               the state after each step t into [:, :, :, t].
**               params[0]: how value head h picks its key head:
**               0 tiled (h mod Hk, qwen35 GGUFs), 1 grouped (h / (Hv/Hk));
**               both params are always read.
** Sources are read through their byte strides (views need no copy); all
** are f32, which the builder checks.
*/
#ifndef TSR_OPS_DELTANET_H
#define TSR_OPS_DELTANET_H

#include "tessera/plugin.h"

/* the widest head (dk or dv) the delta-rule kernel takes: its per-step
** vectors live on the stack */
#define TSR_DELTA_MAX_DIM 1024

enum { TSR_DELTA_TILED = 0, TSR_DELTA_GROUPED = 1 };

/* op ids, filled when arch_qwen's init registers the ops */
struct tsr_qwen_ops {
  int32_t conv1d, delta_rule;
};

void tsr_qwen_conv1d_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                         const struct tsr_tensor_info *src, int n_src, const int32_t *params);
void tsr_qwen_delta_rule_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                             const struct tsr_tensor_info *src, int n_src, const int32_t *params);

#endif
