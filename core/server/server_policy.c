/*
** What the server decides from a request's headers alone: where its body ends,
** whether its body is declared JSON, whether its origin may call, whether its key
** is right. Plain functions of strings, so the HTTP fuzzer reaches them without a
** socket (tests/fuzz/fuzz_http.c).
*/
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server_internal.h"

const char *srv_allowed_origin(const char *list, const char *origin) {
  if (!origin || !list) return NULL;
  const size_t n = strlen(origin);
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == ',') p++;
    const char *end = p;
    while (*end && *end != ',') end++;
    const char *last = end;
    while (last > p && last[-1] == ' ') last--;
    if (last - p == 1 && *p == '*') return "*";
    if ((size_t)(last - p) == n && n && !strncasecmp(p, origin, n)) return origin;
    p = end;
  }
  return NULL;
}

bool srv_same_origin(const char *origin, const char *host) {
  static const char scheme[] = "http://";
  if (!origin || !host || strncasecmp(origin, scheme, sizeof scheme - 1) ||
      strcasecmp(origin + sizeof scheme - 1, host))
    return false;
  /* the name the browser reached must be an address or localhost, never a DNS name: a
  ** name an attacker controls could point at this server and pass as its own origin */
  size_t name = strcspn(host, ":");
  if (host[0] == '[') { /* [IPv6]:port */
    const char *close = strchr(host, ']');
    if (!close || (close[1] && close[1] != ':')) return false;
    for (const char *p = host + 1; p < close; p++)
      if (!strchr("0123456789abcdefABCDEF:.", *p)) return false;
    return close > host + 1;
  }
  if (name == 9 && !strncasecmp(host, "localhost", 9)) return true;
  int dots = 0;
  for (size_t i = 0; i < name; i++) {
    if (host[i] == '.') dots++;
    else if (host[i] < '0' || host[i] > '9') return false;
  }
  return dots == 3 && name >= 7;
}

bool srv_json_content_type(const char *type, char *msg, size_t cap) {
  const char *v = type ? type : "";
  while (*v == ' ' || *v == '\t') v++;
  static const char json[] = "application/json";
  const size_t n = sizeof json - 1;
  if (!strncasecmp(v, json, n) && (!v[n] || v[n] == ';' || v[n] == ' ' || v[n] == '\t'))
    return true;
  if (type)
    snprintf(msg, cap, "Content-Type is '%.200s': a request body must be application/json", type);
  else
    snprintf(msg, cap, "no Content-Type: a request body must be application/json (curl: -H "
             "'Content-Type: application/json')");
  return false;
}

bool srv_bearer_ok(const char *authorization, const char *key) {
  if (!key) return true;
  /* the scheme is case-insensitive (RFC 9110 11.1), the key is not */
  return authorization && !strncasecmp(authorization, "Bearer ", 7) &&
         !strcmp(authorization + 7, key);
}

static bool same_token(const char *a, const char *b) {
  while (*a == ' ' || *a == '\t') a++;
  size_t n = strlen(b);
  if (strncasecmp(a, b, n)) return false;
  for (a += n; *a == ' ' || *a == '\t'; a++) {}
  return !*a;
}

void srv_framing_add(struct srv_framing *f, const char *key, const char *value) {
  if (!key || !value) return;
  if (!strcasecmp(key, "Content-Length")) {
    if (f->n_length++ && strcmp(f->length, value)) f->lengths_differ = true;
    snprintf(f->length, sizeof f->length, "%s", value);
  } else if (!strcasecmp(key, "Transfer-Encoding")) {
    f->n_coding++;
    if (!same_token(value, "chunked")) f->unknown_coding = true;
    snprintf(f->coding, sizeof f->coding, "%s", value);
  }
}

int srv_framing_error(const struct srv_framing *f, char *msg, size_t cap) {
  if (f->lengths_differ)
    return snprintf(msg, cap, "%d Content-Length headers that differ", f->n_length), 400;
  if (f->n_coding && f->n_length)
    return snprintf(msg, cap, "both Transfer-Encoding and Content-Length"), 400;
  if (f->unknown_coding || f->n_coding > 1)
    return snprintf(msg, cap, "transfer coding '%s' is not supported (only chunked)", f->coding),
           501;
  return 0;
}
