/*
 * common/buf.c — see buf.h.
 */
#include "buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pc_wbuf_init(struct pc_wbuf *b, size_t max)
{
	memset(b, 0, sizeof(*b));
	b->max = max ? max : SIZE_MAX;
}

void pc_wbuf_free(struct pc_wbuf *b)
{
	free(b->data);
	memset(b, 0, sizeof(*b));
}

void pc_wbuf_reset(struct pc_wbuf *b)
{
	b->len = 0;
	b->failed = false;
}

static int reserve(struct pc_wbuf *b, size_t len)
{
	if (b->failed)
		return -ENOMEM;
	if (len > b->max - b->len) {
		b->failed = true;
		return -EMSGSIZE;
	}
	if (b->len + len <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->len + len)
		cap *= 2;
	uint8_t *d = realloc(b->data, cap);
	if (!d) {
		b->failed = true;
		return -ENOMEM;
	}
	b->data = d;
	b->cap = cap;
	return 0;
}

int pc_wbuf_append(struct pc_wbuf *b, const void *p, size_t len)
{
	int ret = reserve(b, len);
	if (ret < 0)
		return ret;
	memcpy(b->data + b->len, p, len);
	b->len += len;
	return 0;
}

int pc_wbuf_printf(struct pc_wbuf *b, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	if ((size_t)n < sizeof(small))
		return pc_wbuf_append(b, small, (size_t)n);
	int ret = reserve(b, (size_t)n + 1);
	if (ret < 0)
		return ret;
	va_start(ap, fmt);
	vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
	return 0;
}
