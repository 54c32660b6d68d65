/*
** The CUDA backend loader on a machine that may have no GPU: every way the
** backend can fail to open is an error that names what is wrong, never a
** crash. Runs in CI (no GPU there).
**
** argv[1]: path of the built libtessera-cuda.so, or "" when this build has none.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/backend.h"
#include "harness.h"

static const char *g_so = "";

static bool says(const char *needle) { return strstr(tsr_error_message(), needle) != NULL; }

static void cuda_open_with(const char *env, tsr_status *st, struct tsr_backend **b) {
  if (env) setenv("TESSERA_CUDA_BACKEND", env, 1);
  else unsetenv("TESSERA_CUDA_BACKEND");
  *b = (struct tsr_backend *)1; /* must be cleared on failure */
  *st = tsr_backend_cuda_new(b);
}

static void missing_library_is_named(void) {
  tsr_status st;
  struct tsr_backend *b;
  cuda_open_with("/nonexistent/dir/libtessera-cuda.so", &st, &b);
  CHECK(st == TSR_ERR_UNSUPPORTED);
  CHECK(b == NULL);
  CHECK_MSG(says("/nonexistent/dir/libtessera-cuda.so") && says("not found"), "message: %s",
            tsr_error_message());
}

static void a_file_that_is_no_library_is_refused(void) {
  char path[] = "/tmp/tsr_cuda_loader_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(write(fd, "not an ELF file\n", 16) == 16);
  close(fd);
  tsr_status st;
  struct tsr_backend *b;
  cuda_open_with(path, &st, &b);
  CHECK(st == TSR_ERR_UNSUPPORTED);
  CHECK(b == NULL);
  CHECK_MSG(says("cannot load") && says(path), "message: %s", tsr_error_message());
  unlink(path);
}

static void a_library_without_the_entry_point_is_refused(void) {
  const char *libs[] = {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                        "/lib64/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6"};
  const char *lib = NULL;
  for (size_t i = 0; i < sizeof libs / sizeof *libs && !lib; i++)
    if (access(libs[i], R_OK) == 0) lib = libs[i];
  if (!lib) {
    printf("  (no libm.so.6 at a known path: check skipped)\n");
    return;
  }
  tsr_status st;
  struct tsr_backend *b;
  cuda_open_with(lib, &st, &b);
  CHECK(st == TSR_ERR_UNSUPPORTED);
  CHECK(b == NULL);
  CHECK_MSG(says("no entry point") && says("tsr_cuda_backend_open"), "message: %s",
            tsr_error_message());
}

/* The built .so on this machine: with no GPU or driver the error names which;
** on a GPU machine it opens and calls itself cuda. */
static void built_backend_opens_or_names_the_gap(void) {
  if (!*g_so) {
    tsr_status st;
    struct tsr_backend *b;
    cuda_open_with(NULL, &st, &b);
    /* no .so in this build: the default search finds none, unless one is installed */
    if (st != TSR_OK) {
      CHECK(b == NULL);
      CHECK_MSG(says("libtessera-cuda.so"), "message: %s", tsr_error_message());
    } else {
      tsr_backend_free(b);
    }
    return;
  }
  tsr_status st;
  struct tsr_backend *b;
  cuda_open_with(g_so, &st, &b);
  if (st == TSR_OK) {
    CHECK(b != NULL);
    CHECK(strcmp(tsr_backend_name(b), "cuda") == 0);
    printf("  (a GPU is present: the backend opened)\n");
    tsr_backend_free(b);
    return;
  }
  CHECK(b == NULL);
  CHECK(st == TSR_ERR_UNSUPPORTED);
  /* one of the named causes, and the library's path for context */
  const bool named = says("no CUDA driver") || says("no CUDA GPU") || says("driver supports CUDA") ||
                     says("cannot load") || says("compute capability");
  CHECK_MSG(named && says(g_so), "message: %s", tsr_error_message());
  printf("  (expected on a machine without a GPU) %s\n", tsr_error_message());
}

int main(int argc, char **argv) {
  if (argc > 1) g_so = argv[1];
  TSR_RUN(missing_library_is_named);
  TSR_RUN(a_file_that_is_no_library_is_refused);
  TSR_RUN(a_library_without_the_entry_point_is_refused);
  TSR_RUN(built_backend_opens_or_names_the_gap);
  return TSR_TEST_EXIT();
}
