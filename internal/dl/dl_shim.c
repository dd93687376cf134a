//go:build cgo

// dl_shim.c is the C helper declared in dl_shim.h. It is compiled only
// with cgo (the build constraint above): without it dl_nocgo.go stands in.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

#include "dl_shim.h"

// wc_dl_error copies the loader's last message, or fallback, into err.
static void wc_dl_error(char *err, size_t errlen, const char *fallback) {
  const char *msg = dlerror();
  snprintf(err, errlen, "%s", msg ? msg : fallback);
}

uintptr_t wc_dl_open(const char *name, char *err, size_t errlen) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL)
    wc_dl_error(err, errlen, "dlopen failed");
  return (uintptr_t)h;
}

void *wc_dl_sym(uintptr_t h, const char *name, char *err, size_t errlen) {
  dlerror(); // clear: a NULL from dlsym is an error only if dlerror says so
  void *p = dlsym((void *)h, name);
  if (p == NULL) {
    const char *msg = dlerror();
    if (msg != NULL)
      snprintf(err, errlen, "%s", msg);
    else
      snprintf(err, errlen, "dlsym: symbol %s is NULL", name);
  }
  return p;
}

int wc_dl_path(uintptr_t h, char *out, size_t outlen) {
  struct link_map *lm = NULL;
  if (dlinfo((void *)h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL || lm->l_name == NULL || lm->l_name[0] == 0)
    return -1;
  snprintf(out, outlen, "%s", lm->l_name);
  return 0;
}

int wc_dl_close(uintptr_t h, char *err, size_t errlen) {
  if (dlclose((void *)h) != 0) {
    wc_dl_error(err, errlen, "dlclose failed");
    return -1;
  }
  return 0;
}
