#include "op_registry.h"

#include <pthread.h>
#include <string.h>

#include "error.h"

#define MAX_BACKENDS 4

struct custom_op {
  char name[64];
  struct {
    char backend[16];
    tsr_plugin_kernel_fn fn;
    void *ctx;
  } kernels[MAX_BACKENDS];
  int n_kernels;
};

static struct custom_op g_ops[TSR_MAX_CUSTOM_OPS];
static int g_n_ops;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

tsr_status tsr_op_registry_add(const char *name, int32_t *op_id) {
  if (!name || !*name || strlen(name) >= sizeof g_ops[0].name)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "op name must be 1..63 characters");
  tsr_status st = TSR_OK;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_n_ops && st == TSR_OK; i++)
    if (!strcmp(g_ops[i].name, name))
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "op '%s' is already registered", name);
  if (st == TSR_OK && g_n_ops == TSR_MAX_CUSTOM_OPS)
    st = tsr_error_set(TSR_ERR_NOMEM, "too many registered ops (%d)", TSR_MAX_CUSTOM_OPS);
  if (st == TSR_OK) {
    strcpy(g_ops[g_n_ops].name, name);
    *op_id = g_n_ops++;
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

tsr_status tsr_op_registry_add_kernel(int32_t op_id, const char *backend, tsr_plugin_kernel_fn fn,
                                      void *ctx) {
  if (!backend || !*backend || strlen(backend) >= sizeof g_ops[0].kernels[0].backend || !fn)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kernel registration needs a backend name and a function");
  tsr_status st = TSR_OK;
  pthread_mutex_lock(&g_lock);
  if (op_id < 0 || op_id >= g_n_ops) {
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "no op registered with id %d", op_id);
  } else {
    struct custom_op *op = &g_ops[op_id];
    for (int i = 0; i < op->n_kernels && st == TSR_OK; i++)
      if (!strcmp(op->kernels[i].backend, backend))
        st = tsr_error_set(TSR_ERR_INVALID_ARG, "op '%s' already has a %s kernel", op->name,
                           backend);
    if (st == TSR_OK && op->n_kernels == MAX_BACKENDS)
      st = tsr_error_set(TSR_ERR_NOMEM, "op '%s' has kernels for %d backends already", op->name,
                         MAX_BACKENDS);
    if (st == TSR_OK) {
      strcpy(op->kernels[op->n_kernels].backend, backend);
      op->kernels[op->n_kernels].fn = fn;
      op->kernels[op->n_kernels].ctx = ctx;
      op->n_kernels++;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

const char *tsr_op_registry_name(int32_t op_id) {
  pthread_mutex_lock(&g_lock);
  const char *name = (op_id >= 0 && op_id < g_n_ops) ? g_ops[op_id].name : NULL;
  pthread_mutex_unlock(&g_lock);
  return name;
}

tsr_plugin_kernel_fn tsr_op_registry_kernel(int32_t op_id, const char *backend, void **ctx) {
  tsr_plugin_kernel_fn fn = NULL;
  pthread_mutex_lock(&g_lock);
  if (op_id >= 0 && op_id < g_n_ops) {
    struct custom_op *op = &g_ops[op_id];
    for (int i = 0; i < op->n_kernels; i++)
      if (!strcmp(op->kernels[i].backend, backend)) {
        fn = op->kernels[i].fn;
        *ctx = op->kernels[i].ctx;
      }
  }
  pthread_mutex_unlock(&g_lock);
  return fn;
}
