/*
 * bench/lg_opts.h — pc-loadgen's command line: the options, their limits and
 * the parser.
 *
 * Owns: nothing global. Main thread only: the options are parsed once before
 * any worker starts and are read-only from then on (workers see them through
 * struct lg_run). Invariant: every numeric option is within the bounds below
 * once lg_opts_parse() has returned 0, so later code need not re-check them.
 */
#ifndef PC_BENCH_LG_OPTS_H
#define PC_BENCH_LG_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lg_proto.h"

/* Limits; each one is an option bound checked at parse time (the wire ones,
 * LG_REQUEST_BYTES_MAX and LG_REPLY_BYTES_MAX, are in lg_proto.h). */
#define LG_CONNS_MAX 10000
#define LG_THREADS_MAX 256
#define LG_PIPELINE_MAX 4096
#define LG_DURATION_S_MAX 86400.0

struct lg_opts {
	const char *host;
	const char *port;
	unsigned conns;
	unsigned threads;
	double duration_s;
	double warmup_s;
	double timeout_s;  /* connect deadline, and silence before a conn is dead */
	unsigned pipeline;
	uint8_t request[LG_REQUEST_BYTES_MAX];	/* raw: --request */
	size_t request_bytes;
	bool request_given;
	size_t reply_bytes;  /* 0 until given: the mode picks a default */
	const char *method;  /* msgpack-rpc: --method */
	uint8_t params[LG_REQUEST_BYTES_MAX];	/* msgpack-rpc: --params-hex */
	size_t params_bytes;
	bool params_given;
	const struct lg_proto *proto;
	bool json;
};

/* Fills *o (zeroed by the caller) from the command line. Returns 0, 1 when
 * --help was printed, or -EINVAL after a message on stderr. */
int lg_opts_parse(int argc, char **argv, struct lg_opts *o);

#endif /* PC_BENCH_LG_OPTS_H */
