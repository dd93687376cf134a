#include <stdlib.h>
#include <string.h>
#include "shim.h"

/* The last error of each thread, and its field detail (a JSON object, or
 * NULL): C thread-locals, set by exported Go functions, which run on their
 * caller's thread. */
static __thread char *last_error;
static __thread char *last_field;

void wc_set_error(char *text, char *field) {
	free(last_error);
	free(last_field);
	last_error = text ? strdup(text) : NULL;
	last_field = field && *field ? strdup(field) : NULL;
}

int64_t wc_copy_error(char *buf, int64_t cap, int field) {
	char *s = field ? last_field : last_error;
	int64_t n = s ? (int64_t)strlen(s) : 0;
	if (buf && cap > 0) {
		int64_t k = n < cap - 1 ? n : cap - 1;
		if (k > 0) memcpy(buf, s, (size_t)k);
		buf[k] = 0;
	}
	return n;
}

void *wc_ptr(uint64_t addr) { return (void *)(uintptr_t)addr; }
