/*
 * common/json.c — JSON strings and numbers (common/json.h): the CLI's
 * --json output and the discovery view on the metrics port.
 *
 * Owns: nothing. Thread: any (no state).
 */
#include "json.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Bytes of the valid UTF-8 sequence at s (n > 0 available), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t k;
	uint32_t cp, min;
	if (c >= 0xc2 && c <= 0xdf)
		k = 2, cp = c & 0x1fu, min = 0x80;
	else if (c >= 0xe0 && c <= 0xef)
		k = 3, cp = c & 0x0fu, min = 0x800;
	else if (c >= 0xf0 && c <= 0xf4)
		k = 4, cp = c & 0x07u, min = 0x10000;
	else
		return 0;
	if (n < k)
		return 0;
	for (size_t i = 1; i < k; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	/* overlong forms, past U+10FFFF, UTF-16 surrogates: not text */
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return k;
}

void pc_json_str(struct pc_wbuf *b, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	pc_wbuf_append(b, "\"", 1);
	while (len) {
		unsigned char c = *p;
		size_t k = 1;
		if (c == '"' || c == '\\')
			pc_wbuf_printf(b, "\\%c", c);
		else if (c == '\n')
			pc_wbuf_append(b, "\\n", 2);
		else if (c < 0x20 || c == 0x7f)
			pc_wbuf_printf(b, "\\u%04x", c);
		else if (c < 0x80)
			pc_wbuf_append(b, p, 1);
		else if ((k = utf8_len(p, len)) != 0)
			pc_wbuf_append(b, p, k);
		else
			pc_wbuf_append(b, "\\ufffd", 6), k = 1;
		p += k;
		len -= k;
	}
	pc_wbuf_append(b, "\"", 1);
}

void pc_json_double(struct pc_wbuf *b, double v)
{
	if (!isfinite(v)) {
		pc_wbuf_append(b, "null", 4);
		return;
	}
	char buf[40];
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	pc_wbuf_printf(b, "%s", buf);
}
