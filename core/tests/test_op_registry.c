/*
** The op registry's kernels for device backends (plugin.h register_kernel_lib):
** a kernel library is opened at the first lookup for its backend and its
** symbol resolved; a missing file or symbol is an error naming it and the
** op; a plain lookup that finds nothing leaves the error message alone; the
** device call a backend publishes is per thread.
*/
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "error.h"
#include "harness.h"
#include "op_registry.h"

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

int main(void) {
  TSR_RUN(a_library_kernel_resolves_to_its_symbol_on_first_lookup);
  TSR_RUN(a_missing_library_or_symbol_is_named);
  TSR_RUN(the_device_call_is_per_thread);
  return TSR_TEST_EXIT();
}
