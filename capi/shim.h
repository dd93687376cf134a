/* Helpers of the Go side of libweightcast.so; not part of its interface. */
#include <stdint.h>

void wc_set_error(char *text, char *field);
int64_t wc_copy_error(char *buf, int64_t cap, int field);
void *wc_ptr(uint64_t addr);
