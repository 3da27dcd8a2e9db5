/*
 * common/buf.h — a growable byte buffer with a size cap.
 *
 * Owns: its heap block. Thread: whoever owns the struct. A write that would
 * pass max fails and marks the buffer failed (writers check once at the end
 * instead of after every append).
 */
#ifndef PC_COMMON_BUF_H
#define PC_COMMON_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct pc_wbuf {
	uint8_t *data;
	size_t len;
	size_t cap;
	size_t max;  /* writes past this fail */
	bool failed; /* a write failed: out of memory or over max */
};

/* max 0 = no cap. */
void pc_wbuf_init(struct pc_wbuf *b, size_t max);
void pc_wbuf_free(struct pc_wbuf *b);
void pc_wbuf_reset(struct pc_wbuf *b);
int pc_wbuf_append(struct pc_wbuf *b, const void *p, size_t len);
int pc_wbuf_printf(struct pc_wbuf *b, const char *fmt, ...) PC_PRINTF(2, 3);

#endif /* PC_COMMON_BUF_H */
