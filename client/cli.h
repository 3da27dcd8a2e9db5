/*
 * client/cli.h — what the files of `peercache` (the operator's CLI) share:
 * peercache_cli.c (options, commands, help, main) and cli_stats.c (stats
 * and stats --watch, from the node's metrics endpoint).
 *
 * Owns: declarations only. Single-threaded, like the whole tool.
 */
#ifndef PC_CLIENT_CLI_H
#define PC_CLIENT_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"
#include "common/secret.h"
#include "common/util.h"
#include "rpc/client.h"
#include "rpc/mp.h"

/* Exit statuses (documented in --help, each command's help and the
 * README). */
enum {
	CLI_OK = 0,
	CLI_FAIL = 1,        /* miss, not stored, remote error, local write */
	CLI_USAGE = 2,       /* bad arguments or input; a refusal (flush
			      * without --yes) */
	CLI_UNREACHABLE = 3, /* no (usable) answer from the node */
};

struct cli {
	char node[160];      /* endpoint as rpc_sync takes it */
	bool tcp;            /* node is host:port (secret applies) */
	const char *secret;  /* NULL: none */
	char secret_buf[PC_SECRET_MAX + 1]; /* read from --secret-file */
	unsigned timeout_ms; /* per call (wait-ready: in all) */
	bool timeout_set;    /* --timeout given */
	struct rpc_sync *rpc;
	const char *method;  /* the call in progress, for messages */
	/* the command's options */
	bool json;           /* --json: one JSON document on stdout */
	bool yes;            /* flush --yes */
	bool off;            /* drain --off */
	bool watch;          /* stats --watch */
	unsigned watch_ms;   /* its interval */
	long count;          /* stats --watch --count N (0: until Ctrl-C) */
};

void cli_err(const char *fmt, ...) PC_PRINTF(1, 2);

/* One call with params (an encoded array). Returns 0 with rep holding the
 * result, or an exit status after saying why (rep is then already freed). */
int cli_call(struct cli *c, const char *method, const struct pc_wbuf *params,
	     struct rpc_sync_reply *rep);
/* The same with no params ([]). */
int cli_call_simple(struct cli *c, const char *method,
		    struct rpc_sync_reply *rep);
/* Say the reply to c->method was not what this version expects; frees rep;
 * returns CLI_FAIL. */
int cli_bad_reply(struct cli *c, struct rpc_sync_reply *rep);

/* Look key up in the map at r (r does not move); *v is then at its value. */
bool cli_map_find(struct mp_rd r, const char *key, struct mp_rd *v);
/* A string from the node on stdout, control bytes escaped. */
void cli_print_str(const char *s, size_t len);
/* cluster.members as "id [self] state" lines after indent; with count,
 * "members: N" first and *count = N. */
int cli_print_members(struct cli *c, const char *indent, unsigned *count);

/* The MessagePack value at r (r moves past it) as JSON into b. Bins become
 * {"bytes": N}, a map key that is not a string its JSON text as a string;
 * deeper than a few levels: null. -EINVAL for bytes that are not one value. */
int cli_json_mp(struct pc_wbuf *b, struct mp_rd *r, int depth);
/* Write b and a newline to stdout, free b. CLI_OK, or CLI_FAIL when b
 * failed (out of memory). */
int cli_json_out(struct pc_wbuf *b);

/* `stats` and `stats --watch` (cli_stats.c). */
int cli_cmd_stats(struct cli *c, int argc, char **argv);

#endif /* PC_CLIENT_CLI_H */
