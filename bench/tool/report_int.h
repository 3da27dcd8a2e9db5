/*
 * bench/tool/report_int.h — what report.c, json.c and compare.c share that
 * the rest of peercache-bench does not need: the lists of a row's fields
 * (one list drives both the JSON writer and its reader, so the two cannot
 * drift apart), a series' label, and the strict JSON reader (json.c), which
 * a fuzz target can call on any bytes.
 *
 * Owns: nothing. A parsed pcb_json_doc is plain memory of its caller.
 */
#ifndef PC_BENCH_TOOL_REPORT_INT_H
#define PC_BENCH_TOOL_REPORT_INT_H

#include "pcb.h"
#include "common/utf8.h" /* pc_utf8_seq */

/* The fields of struct pcb_row by type, in the order JSON writes them. */
#define PCB_ROW_STRS(X) X(target) X(via) X(op) X(mode)
#define PCB_ROW_UINTS(X) \
	X(processes) X(threads) X(concurrency) X(batch) X(page_tokens)
#define PCB_ROW_U64S(X) \
	X(page_bytes) X(calls) X(pages) X(hits) X(errors) X(wrong) X(bytes)
#define PCB_ROW_DBLS(X) \
	X(seconds) X(hit_rate) X(pages_s) X(tokens_s) X(gbps)
#define PCB_LAT_DBLS(X) \
	X(mean_us) X(p50_us) X(p95_us) X(p99_us) X(p999_us) X(max_us)
/* and peak, a bool, written last. */

/* The strings of struct pcb_report's top level (the host's live under
 * "host" in JSON, see pcb_report_json). */
#define PCB_REPORT_TOP_STRS(X) X(version) X(build) X(started) X(command)

/* Copy of s for a terminal: control bytes (a report read back may hold
 * any) become '?'. */
void pcb_printable(char *buf, size_t len, const char *s);
/* "target/via op mode b=N": the name of a row's series, for people
 * (printable). */
void pcb_series_label(const struct pcb_row *row, char *buf, size_t len);

/* Copy src into dst[len] whole or cut at a character boundary. */
void pcb_copy_utf8(char *dst, size_t len, const char *src);

/* ------------------------------------------------------------ JSON reader */

#define PCB_JSON_BYTES_MAX (8u << 20) /* a report is far smaller */
#define PCB_JSON_DEPTH_MAX 32         /* a report nests 4 deep */
#define PCB_REPORT_ROWS_MAX 100000u

enum pcb_jtype {
	PCB_J_NULL,
	PCB_J_FALSE,
	PCB_J_TRUE,
	PCB_J_NUM,
	PCB_J_STR,
	PCB_J_ARR,
	PCB_J_OBJ,
};

/*
 * One value. Children of a container are linked through next, starting at
 * first; an object's children alternate key (a string) and value. Index 0
 * is the root, so 0 also means "none" in first and next.
 */
struct pcb_jnode {
	uint8_t type;   /* enum pcb_jtype */
	uint32_t off;   /* byte offset of the value in the input */
	uint32_t start; /* STR: in doc->strs (NUL-terminated); NUM: in input */
	uint32_t len;   /* STR, NUM: bytes; ARR, OBJ: children (OBJ: pairs) */
	uint32_t first;
	uint32_t next;
};

struct pcb_json_doc {
	const char *in; /* the input, as given to pcb_json_parse */
	size_t inlen;
	struct pcb_jnode *nodes; /* malloc'd */
	uint32_t nnodes, capnodes;
	char *strs; /* decoded strings (UTF-8), malloc'd */
	size_t nstrs, capstrs;
};

/*
 * Parse len bytes (RFC 8259, strictly: valid UTF-8, no trailing bytes, at
 * most PCB_JSON_BYTES_MAX bytes and PCB_JSON_DEPTH_MAX levels; "\u0000" is
 * refused since strings are C strings). The input must stay alive and
 * unchanged while the doc is used. Returns 0, -EINVAL (err says at which
 * byte and why) or -ENOMEM; on failure the doc holds nothing to free.
 */
int pcb_json_parse(struct pcb_json_doc *doc, const char *in, size_t len,
		   char *err, size_t errlen);
void pcb_json_free(struct pcb_json_doc *doc);
/* The value of key in object node obj (the last one if repeated), or NULL. */
const struct pcb_jnode *pcb_json_member(const struct pcb_json_doc *doc,
					const struct pcb_jnode *obj,
					const char *key);

/* pcb_report_load_json on bytes in memory (what a fuzz target calls). */
int pcb_report_parse_json(const char *in, size_t len, struct pcb_report *out,
			  char *err, size_t errlen);

#endif /* PC_BENCH_TOOL_REPORT_INT_H */
