/* Plugin-registered ops on the CPU: hand the kernel plain tensor infos. */
#include "abi/op_registry.h"
#include "graph/tensor.h"
#include "cpu_ops.h"

static void fill_info(const struct tsr_tensor *t, struct tsr_tensor_info *info) {
  *info = (struct tsr_tensor_info){.struct_size = sizeof *info, .dtype = (int32_t)t->dtype,
                                   .n_dims = 4, .data = t->data, .name = t->name};
  for (int i = 0; i < 4; i++) info->ne[i] = t->ne[i], info->nb[i] = t->nb[i];
}

void tsr_tensor_get_info(const struct tsr_tensor *t, struct tsr_tensor_info *out) {
  fill_info(t, out);
}

tsr_status tsr_cpu_custom_check(const struct tsr_tensor *dst) {
  void *ctx;
  if (!tsr_op_registry_kernel(dst->op_params[0], "cpu", &ctx)) {
    const char *name = tsr_op_registry_name(dst->op_params[0]);
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "op '%s' has no cpu kernel",
                         name ? name : "(unregistered)");
  }
  return TSR_OK;
}

void tsr_cpu_custom(const struct tsr_cpu_compute *c, struct tsr_tensor *dst) {
  void *ctx = NULL;
  tsr_plugin_kernel_fn fn = tsr_op_registry_kernel(dst->op_params[0], "cpu", &ctx);
  struct tsr_tensor_info out, src[TSR_MAX_SRC];
  int n_src = 0;
  fill_info(dst, &out);
  while (n_src < TSR_MAX_SRC && dst->src[n_src]) {
    fill_info(dst->src[n_src], &src[n_src]);
    n_src++;
  }
  fn(ctx, c->ith, c->nth, &out, src, n_src, &dst->op_params[2]);
}
