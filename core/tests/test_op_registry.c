/*
** The op registry's kernels for device backends (plugin.h register_kernel_lib):
** a kernel library is opened at the first lookup for its backend and its
** symbol resolved; a missing file or symbol is an error naming it and the
** op; a plain lookup that finds nothing leaves the error message alone; the
** device call a backend publishes is per thread; a plugin declares only its own
** kernels replayable (CUDA graph capture), and a device call says how a graph holds
** it only where it is new enough to carry the field.
*/
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "common/error.h"
#include "harness.h"
#include "abi/op_registry.h"
#include "abi/plugin_host.h"
#include "abi/plugin_host_internal.h"

static void a_library_kernel_resolves_to_its_symbol_on_first_lookup(void) {
  int32_t id = -1;
  CHECK_OK(tsr_op_registry_add("test_reg.lib_ok", &id));
  int ctx_word = 7;
  CHECK_OK(tsr_op_registry_add_kernel_lib(id, "cuda", "libm.so.6", "cos", &ctx_word));
  tsr_plugin_kernel_fn fn = NULL;
  void *ctx = NULL;
  CHECK_OK(tsr_op_registry_resolve(id, "cuda", &fn, &ctx));
  void *libm = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  CHECK(libm && (void *)fn == dlsym(libm, "cos"));
  CHECK(ctx == &ctx_word);
  CHECK(tsr_op_registry_find("test_reg.lib_ok") == id);
  CHECK(tsr_op_registry_find("test_reg.absent") == -1);
  /* the op has no cpu kernel: named */
  CHECK(tsr_op_registry_resolve(id, "cpu", &fn, &ctx) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "test_reg.lib_ok") && strstr(tsr_error_message(), "no cpu"));
}

static void a_missing_library_or_symbol_is_named(void) {
  int32_t a = -1, b = -1;
  CHECK_OK(tsr_op_registry_add("test_reg.no_file", &a));
  CHECK_OK(tsr_op_registry_add("test_reg.no_symbol", &b));
  CHECK_OK(tsr_op_registry_add_kernel_lib(a, "cuda", "/nonexistent/x_cuda.so", "k", NULL));
  CHECK_OK(tsr_op_registry_add_kernel_lib(b, "cuda", "libm.so.6", "tsr_no_such_kernel", NULL));
  tsr_plugin_kernel_fn fn = NULL;
  void *ctx = NULL;
  CHECK(tsr_op_registry_resolve(a, "cuda", &fn, &ctx) == TSR_ERR_UNSUPPORTED && !fn);
  CHECK_MSG(strstr(tsr_error_message(), "/nonexistent/x_cuda.so") &&
            strstr(tsr_error_message(), "test_reg.no_file"), "%s", tsr_error_message());
  CHECK(tsr_op_registry_resolve(b, "cuda", &fn, &ctx) == TSR_ERR_UNSUPPORTED && !fn);
  CHECK_MSG(strstr(tsr_error_message(), "tsr_no_such_kernel"), "%s", tsr_error_message());
  /* a plain lookup (the cpu backend's) finds nothing and sets no message */
  tsr_error_set(TSR_OK, "earlier message");
  CHECK(tsr_op_registry_kernel(a, "cuda", &ctx) == NULL);
  CHECK(!strcmp(tsr_error_message(), "earlier message"));
  /* a second kernel for the same backend is refused */
  CHECK(tsr_op_registry_add_kernel_lib(a, "cuda", "libm.so.6", "cos", NULL) == TSR_ERR_INVALID_ARG);
}

static void *other_thread(void *arg) {
  *(bool *)arg = tsr_op_registry_device_call() == NULL;
  return NULL;
}

static void the_device_call_is_per_thread(void) {
  struct tsr_device_call call = {.struct_size = sizeof call, .backend = "cuda", .device = 3};
  CHECK(tsr_op_registry_device_call() == NULL);
  tsr_op_registry_set_device_call(&call);
  CHECK(tsr_op_registry_device_call() == &call);
  bool other_sees_none = false;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread, &other_sees_none) == 0);
  pthread_join(t, NULL);
  CHECK(other_sees_none);
  tsr_op_registry_set_device_call(NULL);
  CHECK(tsr_op_registry_device_call() == NULL);
}

static void nothing(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                    const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)ith, (void)nth, (void)dst, (void)src, (void)n_src, (void)params;
}

static void a_plugin_declares_its_own_kernels_replayable(void) {
  const struct tsr_host *h = tsr_plugin_host_services();
  const struct tsr_plugin_descriptor desc = {.name = "test_rep"};
  struct tsr_plugin self = {.desc = &desc};
  int32_t mine = -1, theirs = -1, prefix = -1;
  CHECK_OK(tsr_op_registry_add("test_rep.step", &mine));
  CHECK_OK(tsr_op_registry_add("test_other.step", &theirs));
  CHECK_OK(tsr_op_registry_add("test_rep_longer.step", &prefix));
  for (int32_t id = mine; id <= prefix; id++) {
    CHECK_OK(tsr_op_registry_add_kernel(id, "cpu", nothing, NULL));
    CHECK_OK(tsr_op_registry_add_kernel_lib(id, "cuda", "libm.so.6", "cos", NULL));
  }
  CHECK(!tsr_op_registry_replayable(mine, "cuda"));
  CHECK_OK(h->kernel->declare_replayable(&self, mine, "cuda"));
  CHECK(tsr_op_registry_replayable(mine, "cuda") && !tsr_op_registry_replayable(mine, "cpu"));
  /* another plugin's op, or one whose name only starts with this plugin's */
  CHECK(h->kernel->declare_replayable(&self, theirs, "cuda") == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "test_other.step") != NULL, "%s", tsr_error_message());
  CHECK(h->kernel->declare_replayable(&self, prefix, "cuda") == TSR_ERR_INVALID_ARG);
  CHECK(h->kernel->declare_replayable(&self, 100000, "cuda") == TSR_ERR_INVALID_ARG);
  CHECK(!tsr_op_registry_replayable(theirs, "cuda") && !tsr_op_registry_replayable(prefix, "cuda"));
  /* a backend the op has no kernel for */
  CHECK(h->kernel->declare_replayable(&self, mine, "metal") == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "no metal kernel") != NULL, "%s", tsr_error_message());
}

static void a_graph_mode_is_read_from_the_call_and_eager_outside_one(void) {
  struct tsr_device_call call = {.struct_size = sizeof call, .backend = "cuda",
                                 .graph = TSR_DEVICE_CALL_REPLAY};
  CHECK(tsr_device_call_graph(&call) == TSR_DEVICE_CALL_REPLAY);
  call.graph = TSR_DEVICE_CALL_CAPTURE;
  CHECK(tsr_device_call_graph(&call) == TSR_DEVICE_CALL_CAPTURE);
  CHECK(tsr_device_call_graph(NULL) == TSR_DEVICE_CALL_EAGER);
}

/* The backend's attention choices reach a plugin's kernels; outside a call, the defaults. */
static void attention_choices_are_read_from_the_call_and_default_outside_one(void) {
  struct tsr_device_call call = {.struct_size = sizeof call, .backend = "cuda",
                                 .attn_pipelined = 1, .attn_gqa_decode = 1,
                                 .attn_split_keys = 64};
  int32_t pipelined, gqa, split;
  tsr_device_call_attn(&call, &pipelined, &gqa, &split);
  CHECK(pipelined == 1 && gqa == 1 && split == 64);
  tsr_device_call_attn(NULL, &pipelined, &gqa, &split);
  CHECK(pipelined == 0 && gqa == TSR_ATTN_GQA_DECODE_DEFAULT && split == 0);
}

int main(void) {
  TSR_RUN(attention_choices_are_read_from_the_call_and_default_outside_one);
  TSR_RUN(a_library_kernel_resolves_to_its_symbol_on_first_lookup);
  TSR_RUN(a_missing_library_or_symbol_is_named);
  TSR_RUN(the_device_call_is_per_thread);
  TSR_RUN(a_plugin_declares_its_own_kernels_replayable);
  TSR_RUN(a_graph_mode_is_read_from_the_call_and_eager_outside_one);
  return TSR_TEST_EXIT();
}
