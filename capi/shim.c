#include <stdlib.h>
#include <string.h>
#include "shim.h"

/* The last error of each thread: a C thread-local, set by exported Go
 * functions, which run on their caller's thread. */
static __thread char *last_error;

void wc_set_error(char *text) {
	free(last_error);
	last_error = text ? strdup(text) : NULL;
}

int64_t wc_copy_error(char *buf, int64_t cap) {
	int64_t n = last_error ? (int64_t)strlen(last_error) : 0;
	if (buf && cap > 0) {
		int64_t k = n < cap - 1 ? n : cap - 1;
		if (k > 0) memcpy(buf, last_error, (size_t)k);
		buf[k] = 0;
	}
	return n;
}

void *wc_ptr(uint64_t addr) { return (void *)(uintptr_t)addr; }
