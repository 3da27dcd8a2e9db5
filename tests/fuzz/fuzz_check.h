/*
 * tests/fuzz/fuzz_check.h — the invariant check of the fuzz targets: on a
 * broken invariant, name it (file, line, expression) and stop as a crash
 * would, so that libFuzzer keeps the input.
 */
#ifndef PC_TESTS_FUZZ_CHECK_H
#define PC_TESTS_FUZZ_CHECK_H

#include <stdio.h>

#define check(ok)                                                              \
	do {                                                                   \
		if (!(ok)) {                                                   \
			fprintf(stderr, "%s:%d: invariant broken: %s\n",       \
				__FILE__, __LINE__, #ok);                      \
			__builtin_trap();                                      \
		}                                                              \
	} while (0)

#endif
