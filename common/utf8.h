/*
 * common/utf8.h — UTF-8 validation, one sequence at a time: for the JSON
 * writers (common/json.c, the bench tool's report) and the bench tool's
 * JSON reader.
 *
 * Owns: nothing. Thread: any (no state).
 */
#ifndef PC_COMMON_UTF8_H
#define PC_COMMON_UTF8_H

#include <stddef.h>

/* Bytes of the valid UTF-8 sequence at s (of n bytes available), 1 for an
 * ASCII byte, or 0 when it is not one (n == 0, a stray continuation byte,
 * a sequence cut short, overlong forms, UTF-16 surrogates, code points
 * past U+10FFFF). */
size_t pc_utf8_seq(const unsigned char *s, size_t n);

#endif /* PC_COMMON_UTF8_H */
