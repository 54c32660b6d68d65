/* `tessera gguf`: inspect GGUF files. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common/error.h"
#include "model/gguf.h"

#define MAX_SHOWN_ELEMS 8   /* array elements printed before "..." */
#define MAX_SHOWN_CHARS 64  /* string bytes printed before "..." */

static void usage(FILE *f) {
  fprintf(f,
          "usage: tessera gguf info FILE\n"
          "\n"
          "  info FILE   validate FILE and print its version, alignment, key/value pairs\n"
          "              (arrays summarized: element type, length, first %d elements),\n"
          "              tensors (name, dtype, shape, offset, bytes) and totals by dtype\n"
          "\n"
          "exit codes: 0 ok, 1 runtime error (out of memory),\n"
          "            2 usage error or unreadable/malformed/unsupported file\n",
          MAX_SHOWN_ELEMS);
}

/* Strings come from the file: escape anything that could drive a terminal. */
static void print_str(const char *s, uint64_t len) {
  putchar('"');
  uint64_t n = len < MAX_SHOWN_CHARS ? len : MAX_SHOWN_CHARS;
  for (uint64_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c == '\n') fputs("\\n", stdout);
    else if (c == '\t') fputs("\\t", stdout);
    else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
    else putchar(c); /* bytes >= 0x80 pass through: UTF-8 */
  }
  putchar('"');
  if (len > n) printf("... (%llu bytes)", (unsigned long long)len);
}

/* Keys and tensor names, with control bytes escaped, for aligned columns. */
static const char *clean(const char *s, char *buf, size_t n) {
  size_t o = 0;
  for (; *s && o + 5 < n; s++) {
    unsigned char c = (unsigned char)*s;
    if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
    else buf[o++] = (char)c;
  }
  buf[o] = '\0';
  return buf;
}

/* One scalar, decoded from a pair the reader filled in. */
static void print_scalar(const struct tsr_gguf_kv *v) {
  switch (v->type) {
  case TSR_GGUF_U8: case TSR_GGUF_U16: case TSR_GGUF_U32: case TSR_GGUF_U64:
    printf("%llu", (unsigned long long)v->v.u);
    break;
  case TSR_GGUF_I8: case TSR_GGUF_I16: case TSR_GGUF_I32: case TSR_GGUF_I64:
    printf("%lld", (long long)v->v.i);
    break;
  case TSR_GGUF_F32: printf("%.9g", v->v.f); break;
  case TSR_GGUF_F64: printf("%.17g", v->v.f); break;
  case TSR_GGUF_BOOL: fputs(v->v.b ? "true" : "false", stdout); break;
  case TSR_GGUF_STRING: print_str(v->v.s.ptr, v->v.s.len); break;
  default: fputs("?", stdout); break;
  }
}

static void print_array(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv) {
  char type[32];
  snprintf(type, sizeof type, "[%s x %llu]", tsr_gguf_type_name(kv->elem_type),
           (unsigned long long)kv->n);
  printf("%-18s", type);
  uint64_t shown = kv->n < MAX_SHOWN_ELEMS ? kv->n : MAX_SHOWN_ELEMS;
  for (uint64_t i = 0; i < shown; i++) {
    struct tsr_gguf_kv e = {.type = kv->elem_type};
    if (kv->elem_type == TSR_GGUF_STRING) {
      tsr_gguf_arr_str(g, kv, i, &e.v.s);
    } else { /* decode through a scalar copy so print_scalar handles it */
      size_t sz = tsr_gguf_type_size(kv->elem_type);
      const unsigned char *p = (const unsigned char *)kv->data + i * sz;
      uint64_t u = 0;
      memcpy(&u, p, sz);
      switch (kv->elem_type) {
      case TSR_GGUF_I8: e.v.i = (int8_t)u; break;
      case TSR_GGUF_I16: e.v.i = (int16_t)u; break;
      case TSR_GGUF_I32: e.v.i = (int32_t)u; break;
      case TSR_GGUF_I64: e.v.i = (int64_t)u; break;
      case TSR_GGUF_F32: { float f; memcpy(&f, p, 4); e.v.f = f; break; }
      case TSR_GGUF_F64: memcpy(&e.v.f, p, 8); break;
      case TSR_GGUF_BOOL: e.v.b = (int)u; break;
      default: e.v.u = u; break;
      }
    }
    fputs(i ? ", " : " ", stdout);
    print_scalar(&e);
  }
  if (kv->n > shown) fputs(", ...", stdout);
}

static void print_shape(const struct tsr_gguf_tensor *t, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (uint32_t d = 0; d < t->n_dims && o < n; d++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

static void print_info(const struct tsr_gguf *g) {
  printf("file:         %s\n", tsr_gguf_path(g));
  printf("version:      %u\n", tsr_gguf_version(g));
  printf("alignment:    %u\n", tsr_gguf_alignment(g));
  printf("data offset:  %llu\n", (unsigned long long)tsr_gguf_data_offset(g));
  printf("file size:    %llu bytes\n", (unsigned long long)tsr_gguf_file_size(g));

  int64_t n_kv = tsr_gguf_n_kv(g);
  printf("\nkey/value pairs: %lld\n", (long long)n_kv);
  for (int64_t i = 0; i < n_kv; i++) {
    const struct tsr_gguf_kv *kv = tsr_gguf_kv_at(g, i);
    char name[256];
    printf("  %-44s ", clean(kv->key, name, sizeof name));
    if (kv->type == TSR_GGUF_ARRAY) {
      fputs("array", stdout);
      print_array(g, kv);
    } else {
      printf("%-23s ", tsr_gguf_type_name(kv->type));
      print_scalar(kv);
    }
    putchar('\n');
  }

  int64_t n_t = tsr_gguf_n_tensors(g);
  uint64_t params = 0, bytes = 0;
  uint64_t by_count[TSR_DTYPE_COUNT] = {0}, by_params[TSR_DTYPE_COUNT] = {0},
           by_bytes[TSR_DTYPE_COUNT] = {0};
  printf("\ntensors: %lld\n", (long long)n_t);
  if (n_t) printf("  %-40s %-8s %-28s %14s %14s\n", "name", "dtype", "shape", "offset", "bytes");
  for (int64_t i = 0; i < n_t; i++) {
    const struct tsr_gguf_tensor *t = tsr_gguf_tensor_at(g, i);
    char shape[128], name[256];
    print_shape(t, shape, sizeof shape);
    printf("  %-40s %-8s %-28s %14llu %14zu\n", clean(t->name, name, sizeof name),
           tsr_dtype_name(t->dtype), shape, (unsigned long long)t->offset, t->nbytes);
    /* Tensors do not overlap and lie inside the file, so these sums are
    ** bounded by a small multiple of the file size and cannot wrap. */
    params += (uint64_t)t->n_elements;
    bytes += t->nbytes;
    by_count[t->dtype]++;
    by_params[t->dtype] += (uint64_t)t->n_elements;
    by_bytes[t->dtype] += t->nbytes;
  }
  printf("\ntotals: %lld tensors, %llu parameters, %llu bytes of tensor data\n", (long long)n_t,
         (unsigned long long)params, (unsigned long long)bytes);
  for (int d = 0; d < TSR_DTYPE_COUNT; d++)
    if (by_count[d])
      printf("  %-8s %8llu tensors %16llu params %16llu bytes\n",
             tsr_dtype_name((enum tsr_dtype)d), (unsigned long long)by_count[d],
             (unsigned long long)by_params[d], (unsigned long long)by_bytes[d]);
}

static int cmd_info(int argc, char **argv) {
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (tsr_cli_is_help(argv[i])) {
      usage(stdout);
      return TSR_EXIT_OK;
    }
    if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "tessera gguf info: unknown option '%s'\n", argv[i]);
      return TSR_EXIT_USAGE;
    }
    if (path) {
      fprintf(stderr, "tessera gguf info: one FILE expected, got '%s' and '%s'\n", path, argv[i]);
      return TSR_EXIT_USAGE;
    }
    path = argv[i];
  }
  if (!path) {
    fprintf(stderr, "tessera gguf info: missing FILE\n");
    usage(stderr);
    return TSR_EXIT_USAGE;
  }
  struct tsr_gguf *g;
  tsr_status st = tsr_gguf_open(path, &g);
  if (st) {
    fprintf(stderr, "tessera gguf info: %s\n", tsr_error_message());
    /* A file that cannot be read or is malformed is an input error; only
    ** running out of resources is a runtime one. */
    return st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
  }
  print_info(g);
  tsr_gguf_close(g);
  if (fflush(stdout) != 0) {
    fprintf(stderr, "tessera gguf info: writing output failed\n");
    return TSR_EXIT_RUNTIME;
  }
  return TSR_EXIT_OK;
}

int tsr_cli_gguf(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return TSR_EXIT_USAGE;
  }
  if (tsr_cli_is_help(argv[1])) {
    usage(stdout);
    return TSR_EXIT_OK;
  }
  if (!strcmp(argv[1], "info")) return cmd_info(argc - 1, argv + 1);
  fprintf(stderr, "tessera gguf: unknown subcommand '%s'\n", argv[1]);
  usage(stderr);
  return TSR_EXIT_USAGE;
}
