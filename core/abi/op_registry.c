#include "abi/op_registry.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"

#define MAX_BACKENDS 4

struct custom_op {
  char name[64];
  struct {
    char backend[16];
    tsr_plugin_kernel_fn fn; /* NULL until a library kernel is opened */
    void *ctx;
    char lib[1024];          /* "" for a kernel registered as a function */
    char symbol[128];
    bool replayable; /* declare_replayable: a device backend may capture and replay it */
  } kernels[MAX_BACKENDS];
  int n_kernels;
};

static struct custom_op g_ops[TSR_MAX_CUSTOM_OPS];
static int g_n_ops;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* The index of op's kernel for backend, or -1; under g_lock. */
static int kernel_index(const struct custom_op *op, const char *backend) {
  for (int i = 0; op && backend && i < op->n_kernels; i++)
    if (!strcmp(op->kernels[i].backend, backend)) return i;
  return -1;
}

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

static tsr_status add_kernel(int32_t op_id, const char *backend, tsr_plugin_kernel_fn fn,
                             void *ctx, const char *lib, const char *symbol) {
  tsr_status st = TSR_OK;
  pthread_mutex_lock(&g_lock);
  if (op_id < 0 || op_id >= g_n_ops) {
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "no op registered with id %d", op_id);
  } else {
    struct custom_op *op = &g_ops[op_id];
    if (kernel_index(op, backend) >= 0)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "op '%s' already has a %s kernel", op->name,
                         backend);
    if (st == TSR_OK && op->n_kernels == MAX_BACKENDS)
      st = tsr_error_set(TSR_ERR_NOMEM, "op '%s' has kernels for %d backends already", op->name,
                         MAX_BACKENDS);
    if (st == TSR_OK) {
      strcpy(op->kernels[op->n_kernels].backend, backend);
      op->kernels[op->n_kernels].fn = fn;
      op->kernels[op->n_kernels].ctx = ctx;
      strcpy(op->kernels[op->n_kernels].lib, lib);
      strcpy(op->kernels[op->n_kernels].symbol, symbol);
      op->kernels[op->n_kernels].replayable = false;
      op->n_kernels++;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

static bool backend_name_ok(const char *backend) {
  return backend && *backend && strlen(backend) < sizeof g_ops[0].kernels[0].backend;
}

tsr_status tsr_op_registry_add_kernel(int32_t op_id, const char *backend, tsr_plugin_kernel_fn fn,
                                      void *ctx) {
  if (!backend_name_ok(backend) || !fn)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kernel registration needs a backend name and a function");
  return add_kernel(op_id, backend, fn, ctx, "", "");
}

tsr_status tsr_op_registry_add_kernel_lib(int32_t op_id, const char *backend, const char *path,
                                          const char *symbol, void *ctx) {
  if (!backend_name_ok(backend) || !path || !*path || !symbol || !*symbol)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kernel library registration needs a backend name, "
                         "a file and a symbol");
  if (strlen(path) >= sizeof g_ops[0].kernels[0].lib ||
      strlen(symbol) >= sizeof g_ops[0].kernels[0].symbol)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "kernel library '%s' or symbol '%s' too long", path,
                         symbol);
  return add_kernel(op_id, backend, NULL, ctx, path, symbol);
}

tsr_status tsr_op_registry_resolve(int32_t op_id, const char *backend, tsr_plugin_kernel_fn *fn,
                                   void **ctx) {
  *fn = NULL;
  tsr_status st = TSR_OK;
  pthread_mutex_lock(&g_lock);
  struct custom_op *op = op_id >= 0 && op_id < g_n_ops ? &g_ops[op_id] : NULL;
  const int k = kernel_index(op, backend);
  if (!op) {
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "no op registered with id %d", op_id);
  } else if (k < 0) {
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "plugin op '%s' has no %s kernel (its plugin "
                       "registers none for this backend)", op->name, backend);
  } else if (!op->kernels[k].fn) {
    /* a library kernel: opened here, at the first lookup for its backend. A
    ** failure is not remembered, so a later lookup reports it again. The
    ** library stays loaded for the process, as plugins do. */
    const char *path = op->kernels[k].lib, *sym = op->kernels[k].symbol;
    dlerror();
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *f = dl ? dlsym(dl, sym) : NULL;
    if (!dl) {
      const char *why = dlerror();
      st = tsr_error_set(TSR_ERR_UNSUPPORTED, "plugin op '%s': its %s kernels are in %s, which "
                         "does not load: %s (built only where the %s toolchain is; rebuild with "
                         "it, or run this model on another backend)", op->name, backend, path,
                         why ? why : "unknown dlopen error", backend);
    } else if (!f) {
      st = tsr_error_set(TSR_ERR_UNSUPPORTED, "plugin op '%s': %s has no symbol '%s' (a %s "
                         "kernel library from another build?)", op->name, path, sym, backend);
    } else {
      op->kernels[k].fn = (tsr_plugin_kernel_fn)(uintptr_t)f;
    }
  }
  if (st == TSR_OK) {
    *fn = op->kernels[k].fn;
    *ctx = op->kernels[k].ctx;
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

tsr_status tsr_op_registry_set_replayable(int32_t op_id, const char *backend) {
  tsr_status st = TSR_OK;
  pthread_mutex_lock(&g_lock);
  struct custom_op *op = op_id >= 0 && op_id < g_n_ops ? &g_ops[op_id] : NULL;
  const int k = kernel_index(op, backend);
  if (!op)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "no op registered with id %d", op_id);
  else if (k < 0)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "op '%s' has no %s kernel to declare replayable "
                       "(register the kernel first)", op->name, backend ? backend : "(null)");
  else
    op->kernels[k].replayable = true;
  pthread_mutex_unlock(&g_lock);
  return st;
}

int tsr_op_registry_replayable(int32_t op_id, const char *backend) {
  pthread_mutex_lock(&g_lock);
  const struct custom_op *op = op_id >= 0 && op_id < g_n_ops ? &g_ops[op_id] : NULL;
  const int k = kernel_index(op, backend);
  const int yes = k >= 0 && op->kernels[k].replayable;
  pthread_mutex_unlock(&g_lock);
  return yes;
}

int32_t tsr_op_registry_find(const char *name) {
  int32_t id = -1;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_n_ops && id < 0; i++)
    if (!strcmp(g_ops[i].name, name)) id = i;
  pthread_mutex_unlock(&g_lock);
  return id;
}

static _Thread_local struct tsr_device_call *g_device_call;

void tsr_op_registry_set_device_call(struct tsr_device_call *call) { g_device_call = call; }

struct tsr_device_call *tsr_op_registry_device_call(void) { return g_device_call; }

const char *tsr_op_registry_name(int32_t op_id) {
  pthread_mutex_lock(&g_lock);
  const char *name = (op_id >= 0 && op_id < g_n_ops) ? g_ops[op_id].name : NULL;
  pthread_mutex_unlock(&g_lock);
  return name;
}

bool tsr_op_registry_has_kernel(int32_t op_id, const char *backend) {
  pthread_mutex_lock(&g_lock);
  const bool has = op_id >= 0 && op_id < g_n_ops && kernel_index(&g_ops[op_id], backend) >= 0;
  pthread_mutex_unlock(&g_lock);
  return has;
}

tsr_plugin_kernel_fn tsr_op_registry_kernel(int32_t op_id, const char *backend, void **ctx) {
  /* a library kernel is opened here too; a failure is simply no kernel */
  tsr_plugin_kernel_fn fn = NULL;
  void *c = NULL;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", tsr_error_message());
  if (tsr_op_registry_resolve(op_id, backend, &fn, &c) == TSR_OK) *ctx = c;
  else tsr_error_set(TSR_OK, "%s", saved); /* a lookup that finds nothing sets no error */
  return fn;
}
