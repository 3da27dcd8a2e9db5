/*
 * common/json.c — JSON strings and numbers (common/json.h): the CLI's
 * --json output and the discovery view on the metrics port.
 *
 * Owns: nothing. Thread: any (no state).
 */
#include "json.h"

#include "utf8.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
		else if (c == '\t')
			pc_wbuf_append(b, "\\t", 2);
		else if (c == '\r')
			pc_wbuf_append(b, "\\r", 2);
		else if (c < 0x20 || c == 0x7f)
			pc_wbuf_printf(b, "\\u%04x", c);
		else if (c < 0x80)
			pc_wbuf_append(b, p, 1);
		else if ((k = pc_utf8_seq(p, len)) != 0)
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
