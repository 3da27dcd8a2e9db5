/*
 * common/json.h — the pieces of a JSON writer: strings and numbers, into a
 * byte buffer (common/buf.h). Callers write the punctuation themselves.
 *
 * Owns: nothing. Thread: the caller's buffer.
 *
 * Invariant: whatever the input bytes, the output is valid JSON (RFC 8259):
 * control bytes are escaped, a byte that does not start a valid UTF-8
 * sequence becomes U+FFFD, and a number that is not finite becomes null.
 */
#ifndef PC_COMMON_JSON_H
#define PC_COMMON_JSON_H

#include <stddef.h>

#include "buf.h"

/* len bytes of s as a JSON string, quotes included. */
void pc_json_str(struct pc_wbuf *b, const char *s, size_t len);
/* v as the shortest JSON number that reads back as v; null if not finite. */
void pc_json_double(struct pc_wbuf *b, double v);

#endif /* PC_COMMON_JSON_H */
