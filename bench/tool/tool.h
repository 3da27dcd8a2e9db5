/*
 * bench/tool/tool.h — peercache-bench's subcommands and the working-set
 * manifest they share (pcb.h has the parts' common types).
 *
 * Owns: nothing global but the stop flag (set by SIGINT/SIGTERM).
 */
#ifndef PC_BENCH_TOOL_TOOL_H
#define PC_BENCH_TOOL_TOOL_H

#include <signal.h>
#include <sys/types.h>

#include "pcb.h"

#define PCB_DEFAULT_SOCKET "/run/peercache/peercached.sock"
#define PCB_MANIFEST_BYTES 4096 /* the manifest page's fixed size */
#define PCB_VS_MAX 4

/* What serve published and drive reads back: "<prefix>/manifest". */
struct pcb_manifest {
	uint64_t pages;
	uint64_t page_bytes;
	unsigned page_tokens; /* 0: raw --page-bytes */
	uint64_t seed;
	char layout[16];      /* "mha", "mla", "raw" */
	char node[128];       /* node id of the producer */
};

/* The manifest as its page, and back (-EINVAL: not a manifest). */
void pcb_manifest_page(const struct pcb_manifest *m, uint8_t *page);
int pcb_manifest_parse(const uint8_t *page, struct pcb_manifest *m);
/* Keys: "<prefix>/manifest", "<prefix>/driver/<id>". */
int pcb_manifest_key(char *buf, size_t len, const char *prefix);
int pcb_driver_key(char *buf, size_t len, const char *prefix, unsigned id);

/* Page shape options, shared by serve and drive (--op set). */
struct pcb_shape {
	const char *layout;      /* "mha" or "mla" */
	unsigned page_tokens;    /* --page-size */
	unsigned layers, kv_heads, head_dim, kv_lora_rank, rope_dim;
	unsigned dtype_bytes, tp;
	uint64_t bytes_per_token; /* --bytes-per-token; 0: from the model */
	uint64_t page_bytes;      /* --page-bytes: raw, tokens unknown */
};
void pcb_shape_default(struct pcb_shape *s);
/* An option of the shape at argv[*i] (advances *i past its value): 1 taken,
 * 0 not a shape option, -1 bad value (message printed). */
int pcb_shape_option(struct pcb_shape *s, int argc, char **argv, int *i);
/* Bytes and tokens of a page; -EINVAL with a message printed. */
int pcb_shape_resolve(const struct pcb_shape *s, uint64_t *page_bytes,
		      unsigned *page_tokens);
void pcb_shape_help(FILE *out);

/* Numbers and durations with a message on failure (-1). */
int pcb_parse_u64(const char *opt, const char *v, uint64_t min, uint64_t max,
		  uint64_t *out);
int pcb_parse_ms(const char *opt, const char *v, uint64_t *out);
/* A key prefix: 1 to 128 bytes, no whitespace or control bytes. */
int pcb_parse_prefix(const char *v);
/* Read a secret file (rpc over TCP); -1 with a message. */
int pcb_read_secret(const char *path, char *buf, size_t len);

/* What the node says of itself (node.info), through the session API
 * (rpc false: addr is its socket path) or kv RPC (addr host:port or
 * unix:/path). 0, or -errno with err set. */
struct pcb_node_info {
	char id[128], mode[32], transport[32], version[64];
};
int pcb_node_info(const char *addr, bool rpc, const char *secret,
		  unsigned timeout_ms, struct pcb_node_info *out, char *err,
		  size_t errlen);

/* A node the tool started (`-- ARGS`): node_spawn.c. */
struct pcb_spawned {
	pid_t pid;
	char dir[64];     /* private directory: log, socket */
	char log[96];
	char socket[108]; /* its Unix socket (from ARGS' --socket, or dir's) */
};
/* Start peercached with argv and wait until it answers on its socket
 * (timeout_ms); 0, or -1 with the reason and its log's end printed. */
int pcb_node_spawn(int argc, char **argv, unsigned timeout_ms,
		   struct pcb_spawned *sp);
/* Stop it (SIGTERM, then SIGKILL after 15 s) and remove its directory when
 * it stopped cleanly. Safe when none was started. */
void pcb_node_reap(struct pcb_spawned *sp);

extern volatile sig_atomic_t pcb_stop;
void pcb_catch_signals(void);

int pcb_serve_main(int argc, char **argv);
int pcb_drive_main(int argc, char **argv);
int pcb_compare_main(int argc, char **argv);

#endif /* PC_BENCH_TOOL_TOOL_H */
