// dl_shim.h declares the C helper of package dl: dlopen, dlsym, dlclose and
// dlinfo, each reading dlerror in the same call, because the loader's error
// is per thread. Handles cross into Go as integers (uintptr_t), never as
// pointers.
#ifndef WEIGHTCAST_DL_SHIM_H
#define WEIGHTCAST_DL_SHIM_H

#include <stddef.h>
#include <stdint.h>

// wc_dl_open opens name (RTLD_NOW | RTLD_LOCAL) and returns its handle, or
// 0 with the loader's message in err.
uintptr_t wc_dl_open(const char *name, char *err, size_t errlen);

// wc_dl_sym returns the address of name in the library h, or NULL with the
// loader's message in err.
void *wc_dl_sym(uintptr_t h, const char *name, char *err, size_t errlen);

// wc_dl_path writes the file the library h was loaded from into out and
// returns 0, or returns -1 where the loader does not say.
int wc_dl_path(uintptr_t h, char *out, size_t outlen);

// wc_dl_close closes h and returns 0, or -1 with the loader's message in
// err.
int wc_dl_close(uintptr_t h, char *err, size_t errlen);

#endif
