/*
 * client/peercache_cli.c — `peercache`, the operator's command-line tool:
 * put/get/exists/del one node's pages, show who the node is (info,
 * members, config; stats lives in cli_stats.c), flush its pages, drain it
 * before a shutdown, and wait until it is ready (wait-ready).
 *
 * Owns: the process (only main() exits) and one blocking RPC client
 * (rpc/sync.c) to the node named by --node / $PEERCACHE_NODE / the default
 * socket. Single-threaded. Commands are a table (cli_cmds: name, operands,
 * the options each takes, its help page); each runs one or two RPC calls
 * and returns an exit status:
 *
 *   0 ok; 1 miss, not stored, not all keys exist, a remote error, a local
 *   write error, or (wait-ready) not ready within --timeout; 2 usage error
 *   or bad input (key, value, FILE), or flush without --yes; 3 the node
 *   could not be reached or gave no usable answer.
 *
 * Options: peercache's own (--node, --secret-file, --timeout, --json) go
 * before the command; a command's own (--json, --yes, --off, --watch,
 * --count, --help) anywhere after it, until "--". --json makes a read
 * command print one JSON document (common/json.h writes its strings and
 * numbers, cli_json_mp converts the node's MessagePack).
 *
 * Invariants: every limit is checked before anything is sent (keys 1..512
 * bytes, at most CLI_KEYS_MAX per call, values 1..CLI_VALUE_BYTES_MAX), so an
 * over-limit input gets a clear message instead of the node closing the
 * connection. Binary values never reach a terminal unasked: `get KEY` with
 * stdout on a terminal prints a hex preview; `-` or a pipe gets raw bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/cli.h"
#include "common/config.h"
#include "common/json.h"

#define CLI_DEFAULT_SOCKET "/run/peercache/peercached.sock"
#define CLI_KEY_BYTES_MAX 512   /* kv.*: keys of 1..512 bytes */
#define CLI_KEYS_MAX 65536      /* kv.*: keys per call */
/* The node's default rpc_max_message_bytes (64 MiB), less room for the
 * envelope and a 512-byte key: a bigger request would be a closed
 * connection, not an error reply. */
#define CLI_MESSAGE_BYTES_MAX (64u << 20)
#define CLI_VALUE_BYTES_MAX (CLI_MESSAGE_BYTES_MAX - 4096u)
#define CLI_TIMEOUT_MS_DEFAULT 5000
#define CLI_TIMEOUT_MS_MAX (24ull * 3600 * 1000)
#define CLI_PREVIEW_BYTES 256   /* hex preview of a value on a terminal */
#define CLI_PRINT_DEPTH_MAX 8   /* nesting shown by `info` */
#define CLI_FLUSH_MS_DEFAULT (10u * 60 * 1000) /* flush without --timeout */
#define CLI_WATCH_MS_DEFAULT 1000 /* stats --watch without INTERVAL */

/* Options a command takes (after its name), besides --help. */
#define OPT_JSON 0x1u  /* --json */
#define OPT_YES 0x2u   /* --yes */
#define OPT_OFF 0x4u   /* --off */
#define OPT_WATCH 0x8u /* --watch [INTERVAL], --count N */

struct cli_cmd {
	const char *name;
	const char *args;  /* for usage lines */
	const char *help;  /* lines after the first are indented */
	int min_args, max_args; /* operands after the command; -1: any */
	int (*run)(struct cli *c, int argc, char **argv);
	unsigned opts;     /* OPT_* */
	const char *more;  /* `peercache help CMD`: output, exit status */
};

void cli_err(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("peercache: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* -------------------------------------------------------------- local I/O */

static int write_all(int fd, const void *p, size_t len)
{
	const uint8_t *b = p;
	while (len) {
		ssize_t n = write(fd, b, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		b += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Append everything fd holds to b, failing with -EFBIG past cap bytes. */
static int read_capped(int fd, struct pc_wbuf *b, size_t cap)
{
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
	    (uint64_t)st.st_size > cap)
		return -EFBIG; /* no need to read 10 GB to refuse it */
	size_t start = b->len;
	uint8_t chunk[65536];
	for (;;) {
		ssize_t n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return 0;
		if ((size_t)n > cap - (b->len - start))
			return -EFBIG;
		if (pc_wbuf_append(b, chunk, (size_t)n) < 0)
			return -ENOMEM;
	}
}

/* "hexdump -C" lines for a terminal. */
static void hex_preview(const uint8_t *p, size_t len)
{
	for (size_t off = 0; off < len; off += 16) {
		size_t n = PC_MIN((size_t)16, len - off);
		printf("%08zx ", off);
		for (size_t i = 0; i < 16; i++) {
			if (i == 8)
				putchar(' ');
			if (i < n)
				printf(" %02x", p[off + i]);
			else
				fputs("   ", stdout);
		}
		fputs("  |", stdout);
		for (size_t i = 0; i < n; i++)
			putchar(p[off + i] >= 0x20 && p[off + i] < 0x7f ? p[off + i]
									: '.');
		fputs("|\n", stdout);
	}
}

/* A string from the node, with control bytes escaped (a node name must not
 * be able to send escape sequences to the operator's terminal). */
void cli_print_str(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch < 0x20 || ch == 0x7f)
			printf("\\x%02x", ch);
		else
			putchar(ch);
	}
}

/* --------------------------------------------------------------- the node */

/* "host:port" stays TCP; "unix:/p" stays; anything else is a socket path. */
static int cli_set_node(struct cli *c, const char *addr)
{
	bool is_unix = strncmp(addr, "unix:", 5) == 0;
	bool is_path = !is_unix && (strchr(addr, '/') || !strchr(addr, ':'));
	int n = snprintf(c->node, sizeof(c->node), "%s%s",
			 is_path ? "unix:" : "", addr);
	if (!*addr || n < 0 || (size_t)n >= sizeof(c->node))
		return -EINVAL;
	c->tcp = !is_unix && !is_path;
	return 0;
}

/* Why a call got no answer, in an operator's words. */
static const char *unreachable_why(const struct cli *c, int err, char *buf,
				   size_t len)
{
	switch (-err) {
	case ETIMEDOUT:
		snprintf(buf, len, "no answer within %u ms (see --timeout)",
			 c->timeout_ms);
		break;
	case ENOENT:
		snprintf(buf, len, "no such socket file (is peercached running"
			 " there? for TCP give host:port)");
		break;
	case ECONNREFUSED:
		snprintf(buf, len, "connection refused (is peercached running"
			 " and is this its rpc_port or socket?)");
		break;
	case EACCES:
		if (c->tcp)
			snprintf(buf, len, "authentication failed (%s)",
				 c->secret ? "wrong secret (--secret-file, --secret),"
					     " or the node has no cluster_secret"
					   : "the node did not accept the "
					     "connection");
		else
			snprintf(buf, len, "permission denied (the socket or "
				 "its directory is not accessible to this user)");
		break;
	case ECONNRESET:
	case EPIPE:
		snprintf(buf, len, "the node closed the connection%s",
			 strcmp(c->method, "kv.set") == 0
				 ? " (a value over its rpc_max_message_bytes?)"
				 : "");
		break;
	case EPROTO:
		snprintf(buf, len, "the reply is not MessagePack-RPC (is this "
			 "the node's rpc_port, not its metrics or data port?)");
		break;
	case EMSGSIZE:
		snprintf(buf, len, "the reply is over %u bytes",
			 CLI_MESSAGE_BYTES_MAX);
		break;
	default:
		snprintf(buf, len, "%s", strerror(-err));
	}
	return buf;
}

/*
 * One call with params (an encoded array). Returns 0 with rep holding the
 * result, or an exit status after saying why (rep is then already freed).
 */
int cli_call(struct cli *c, const char *method, const struct pc_wbuf *params,
	     struct rpc_sync_reply *rep)
{
	char why[256];
	c->method = method;
	if (params->failed) {
		cli_err("out of memory building the %s call", method);
		return CLI_FAIL;
	}
	int ret = rpc_sync_call(c->rpc, method, params->data, params->len,
				NULL, 0, c->timeout_ms, rep);
	if (ret == 0 && rep->res.err == 0)
		return 0;
	int err = ret < 0 ? ret : rep->res.err;
	if (err == -EREMOTEIO) {
		/* The node asks for the secret only when it has one; a
		 * refusal by user is not cured by a secret. */
		bool auth = strcmp(rep->res.code, "unauthorized") == 0 &&
			    strstr(rep->res.message, "authenticate first");
		cli_err("%s: %s: %s%s", method, rep->res.code,
			rep->res.message,
			auth && c->tcp && !c->secret
				? " (set --secret-file or $PEERCACHE_SECRET_FILE)"
				: "");
		rpc_sync_reply_free(rep);
		return CLI_FAIL;
	}
	cli_err("cannot reach %s: %s", c->node,
		unreachable_why(c, err, why, sizeof(why)));
	rpc_sync_reply_free(rep);
	return CLI_UNREACHABLE;
}

int cli_bad_reply(struct cli *c, struct rpc_sync_reply *rep)
{
	cli_err("%s: unexpected reply from %s (another peercached version?)",
		c->method, c->node);
	rpc_sync_reply_free(rep);
	return CLI_FAIL;
}

/* ------------------------------------------------------------ parameters */

static int check_keys(int n, char **keys)
{
	if (n > CLI_KEYS_MAX) {
		cli_err("%d keys: at most %d per command", n, CLI_KEYS_MAX);
		return CLI_USAGE;
	}
	for (int i = 0; i < n; i++) {
		size_t len = strlen(keys[i]);
		if (len >= 1 && len <= CLI_KEY_BYTES_MAX)
			continue;
		if (n == 1)
			cli_err("key is %zu bytes: keys are 1..%d bytes", len,
				CLI_KEY_BYTES_MAX);
		else
			cli_err("key %d is %zu bytes: keys are 1..%d bytes",
				i + 1, len, CLI_KEY_BYTES_MAX);
		return CLI_USAGE;
	}
	return CLI_OK;
}

/* params = [[key, ...]] */
static void pack_keys(struct pc_wbuf *b, int n, char **keys)
{
	msgpack_packer pk;
	pc_wbuf_packer(b, &pk);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_array(&pk, (size_t)n);
	for (int i = 0; i < n; i++)
		mp_pack_cstr(&pk, keys[i]);
}

/* Look key up in the map at r (r does not move); *v is then at its value. */
bool cli_map_find(struct mp_rd r, const char *key, struct mp_rd *v)
{
	uint32_t n;
	if (mp_rd_map(&r, &n) < 0)
		return false;
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		bool is_str = mp_rd_str(&r, &k, &kl) == 0;
		if (is_str && mp_str_eq(k, kl, key)) {
			*v = r;
			return true;
		}
		if ((!is_str && mp_skip(&r) < 0) || mp_skip(&r) < 0)
			return false; /* the key (unless read), then the value */
	}
	return false;
}

/* ------------------------------------------------------------- put / get */

/*
 * Append the value (FILE, or stdin for "-") to params behind a bin32 header
 * patched once its length is known: the value is read straight into the
 * request (any bin encoding is valid MessagePack). Returns an exit status.
 */
static int put_read_value(const char *file, struct pc_wbuf *params,
			  size_t *vlen)
{
	static const uint8_t bin32[5] = {0xc6, 0, 0, 0, 0};
	bool from_stdin = strcmp(file, "-") == 0;
	pc_wbuf_append(params, bin32, sizeof(bin32));
	size_t hdr = params->len;
	int fd = from_stdin ? STDIN_FILENO : open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		cli_err("cannot open %s: %s", file, strerror(errno));
		return CLI_USAGE;
	}
	if (from_stdin && isatty(fd))
		cli_err("reading the value from the terminal; end it with "
			"Ctrl-D");
	int ret = params->failed ? -ENOMEM
				 : read_capped(fd, params, CLI_VALUE_BYTES_MAX);
	if (!from_stdin)
		close(fd);
	*vlen = params->len - PC_MIN(params->len, hdr);
	if (ret == -EFBIG) {
		cli_err("value too large: over %u bytes (64 MiB, the node's "
			"default message limit, less 4 KiB)",
			CLI_VALUE_BYTES_MAX);
		return CLI_USAGE;
	}
	if (ret < 0) {
		cli_err("cannot read %s: %s", from_stdin ? "stdin" : file,
			strerror(-ret));
		return ret == -ENOMEM ? CLI_FAIL : CLI_USAGE;
	}
	if (*vlen == 0) {
		cli_err("empty value: a page holds at least one byte");
		return CLI_USAGE;
	}
	for (int i = 0; i < 4; i++)
		params->data[hdr - 4 + i] = (uint8_t)(*vlen >> (24 - 8 * i));
	return CLI_OK;
}

/* Does node.info say the node is draining? (false when it cannot say) */
static bool node_draining(struct cli *c)
{
	struct rpc_sync_reply rep;
	struct mp_rd v;
	bool on = false;
	if (cli_call_simple(c, "node.info", &rep))
		return false;
	if (cli_map_find(rep.res.result, "draining", &v))
		mp_rd_bool(&v, &on);
	rpc_sync_reply_free(&rep);
	return on;
}

static int cmd_put(struct cli *c, int argc, char **argv)
{
	const char *key = argv[0];
	int rc = check_keys(1, argv);
	if (rc)
		return rc;
	struct pc_wbuf params; /* [[key], [value]] */
	msgpack_packer pk;
	pc_wbuf_init(&params, 0);
	pc_wbuf_packer(&params, &pk);
	msgpack_pack_array(&pk, 2);
	msgpack_pack_array(&pk, 1);
	mp_pack_cstr(&pk, key);
	msgpack_pack_array(&pk, 1);
	size_t vlen = 0;
	rc = put_read_value(argc > 1 ? argv[1] : "-", &params, &vlen);
	if (rc) {
		pc_wbuf_free(&params);
		return rc;
	}
	struct rpc_sync_reply rep;
	rc = cli_call(c, "kv.set", &params, &rep);
	pc_wbuf_free(&params);
	if (rc)
		return rc;
	struct mp_rd r = rep.res.result;
	uint32_t n;
	bool stored;
	if (mp_rd_array(&r, &n) < 0 || n != 1 || mp_rd_bool(&r, &stored) < 0)
		return cli_bad_reply(c, &rep);
	rpc_sync_reply_free(&rep);
	if (!stored && node_draining(c)) {
		cli_err("not stored: %s: the node is draining (it stores no "
			"page until 'peercache drain --off')", key);
		return CLI_FAIL;
	}
	if (!stored) {
		cli_err("not stored: %s (no pool space for %zu bytes, or the "
			"key's directory owner is unreachable; the node's log "
			"says more)", key, vlen);
		return CLI_FAIL;
	}
	puts("stored");
	return CLI_OK;
}

/* Where `get` puts the bytes: FILE, raw stdout, or a terminal preview. */
static int get_output(const char *file, const uint8_t *v, uint32_t len)
{
	if (!file && isatty(STDOUT_FILENO)) {
		hex_preview(v, PC_MIN(len, (uint32_t)CLI_PREVIEW_BYTES));
		fflush(stdout);
		cli_err("%u bytes%s shown as hex because stdout is a terminal; "
			"give a FILE, '-' or a pipe (| cat) for the raw bytes",
			len, len > CLI_PREVIEW_BYTES ? ", the first 256" : "");
		return CLI_OK;
	}
	bool to_stdout = !file || strcmp(file, "-") == 0;
	int fd = to_stdout ? STDOUT_FILENO
			   : open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
				  0666);
	int ret = fd < 0 ? -errno : write_all(fd, v, len);
	if (!to_stdout && fd >= 0 && close(fd) < 0 && ret == 0)
		ret = -errno;
	if (ret < 0) {
		cli_err("cannot write %s: %s", to_stdout ? "stdout" : file,
			strerror(-ret));
		return CLI_FAIL;
	}
	return CLI_OK;
}

static int cmd_get(struct cli *c, int argc, char **argv)
{
	int rc = check_keys(1, argv);
	if (rc)
		return rc;
	struct pc_wbuf params;
	pc_wbuf_init(&params, 0);
	pack_keys(&params, 1, argv);
	struct rpc_sync_reply rep;
	rc = cli_call(c, "kv.get", &params, &rep);
	pc_wbuf_free(&params);
	if (rc)
		return rc;
	struct mp_rd r = rep.res.result;
	uint32_t n, len = 0;
	const uint8_t *v = NULL;
	if (mp_rd_array(&r, &n) < 0 || n != 1 ||
	    (!mp_rd_try_nil(&r) && mp_rd_bin(&r, &v, &len) < 0))
		return cli_bad_reply(c, &rep);
	if (!v) {
		rpc_sync_reply_free(&rep);
		fprintf(stderr, "miss: %s\n", argv[0]);
		return CLI_FAIL;
	}
	rc = get_output(argc > 1 ? argv[1] : NULL, v, len);
	rpc_sync_reply_free(&rep);
	return rc;
}

/* ------------------------------------------------------------ exists / del */

/* Call method with [keys] and read its uint answer. */
static int call_count(struct cli *c, const char *method, int argc,
		      char **argv, uint64_t *count)
{
	int rc = check_keys(argc, argv);
	if (rc)
		return rc;
	struct pc_wbuf params;
	pc_wbuf_init(&params, 0);
	pack_keys(&params, argc, argv);
	struct rpc_sync_reply rep;
	rc = cli_call(c, method, &params, &rep);
	pc_wbuf_free(&params);
	if (rc)
		return rc;
	struct mp_rd r = rep.res.result;
	if (mp_rd_uint(&r, count) < 0)
		return cli_bad_reply(c, &rep);
	rpc_sync_reply_free(&rep);
	if (!c->json) {
		printf("%llu\n", (unsigned long long)*count);
		return CLI_OK;
	}
	struct pc_wbuf b;
	pc_wbuf_init(&b, 0);
	pc_wbuf_printf(&b, "{\"keys\":%d,\"%s\":%llu}", argc,
		       strcmp(method, "kv.exists") ? "existed" : "exist",
		       (unsigned long long)*count);
	return cli_json_out(&b);
}

static int cmd_exists(struct cli *c, int argc, char **argv)
{
	uint64_t count;
	int rc = call_count(c, "kv.exists", argc, argv, &count);
	if (rc)
		return rc;
	return count == (uint64_t)argc ? CLI_OK : CLI_FAIL;
}

static int cmd_del(struct cli *c, int argc, char **argv)
{
	uint64_t count;
	return call_count(c, "kv.delete", argc, argv, &count);
}

/* ------------------------------------------------------- info / members */

static void print_scalar(struct mp_rd *r)
{
	bool b;
	uint64_t u;
	int64_t i;
	double d;
	const char *s;
	const uint8_t *bin;
	uint32_t len;
	if (mp_rd_try_nil(r))
		fputs("nil", stdout);
	else if (mp_rd_bool(r, &b) == 0)
		fputs(b ? "true" : "false", stdout);
	else if (mp_rd_uint(r, &u) == 0)
		printf("%llu", (unsigned long long)u);
	else if (mp_rd_int(r, &i) == 0)
		printf("%lld", (long long)i);
	else if (mp_rd_float(r, &d) == 0)
		printf("%.3f", d);
	else if (mp_rd_str(r, &s, &len) == 0)
		cli_print_str(s, len);
	else if (mp_rd_bin(r, &bin, &len) == 0)
		printf("<%u bytes>", len);
	else if (mp_skip(r) == 0)
		fputs("<?>", stdout);
}

static int print_block(struct mp_rd *r, int indent, int depth);

/* After "key:" or "-": a scalar on the same line, a container below. */
static int print_item(struct mp_rd *r, int indent, int depth)
{
	enum mp_type t = mp_peek(r);
	if (t != MP_T_MAP && t != MP_T_ARRAY) {
		putchar(' ');
		print_scalar(r);
		putchar('\n');
		return 0;
	}
	if (depth >= CLI_PRINT_DEPTH_MAX) {
		puts(" ...");
		return mp_skip(r);
	}
	putchar('\n');
	return print_block(r, indent + 2, depth + 1);
}

/* A map as "key: value" lines, an array as "- value" lines. */
static int print_block(struct mp_rd *r, int indent, int depth)
{
	uint32_t n;
	bool map = mp_peek(r) == MP_T_MAP;
	if ((map ? mp_rd_map(r, &n) : mp_rd_array(r, &n)) < 0)
		return -EINVAL;
	if (n == 0)
		printf("%*s(none)\n", indent, "");
	for (uint32_t i = 0; i < n; i++) {
		printf("%*s", indent, "");
		if (map) {
			print_scalar(r);
			putchar(':');
		} else {
			putchar('-');
		}
		if (print_item(r, indent, depth) < 0)
			return -EINVAL;
	}
	return 0;
}

int cli_call_simple(struct cli *c, const char *method,
		    struct rpc_sync_reply *rep)
{
	static const uint8_t empty[] = {0x90}; /* [] */
	struct pc_wbuf params = {.data = (uint8_t *)empty, .len = 1};
	return cli_call(c, method, &params, rep);
}

static int print_result(struct cli *c, struct rpc_sync_reply *rep);

static int cmd_info(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	struct rpc_sync_reply rep;
	int rc = cli_call_simple(c, "node.info", &rep);
	if (rc)
		return rc;
	return print_result(c, &rep);
}

/* A map result as "key: value" lines, or (--json) as one JSON object;
 * frees rep. */
static int print_result(struct cli *c, struct rpc_sync_reply *rep)
{
	struct mp_rd r = rep->res.result;
	if (mp_peek(&r) != MP_T_MAP)
		return cli_bad_reply(c, rep);
	if (c->json) {
		struct pc_wbuf b;
		pc_wbuf_init(&b, 0);
		if (cli_json_mp(&b, &r, 0) < 0) {
			pc_wbuf_free(&b);
			return cli_bad_reply(c, rep);
		}
		rpc_sync_reply_free(rep);
		return cli_json_out(&b);
	}
	if (print_block(&r, 0, 0) < 0)
		return cli_bad_reply(c, rep);
	rpc_sync_reply_free(rep);
	return CLI_OK;
}

/* cluster.members as "id [self] state" lines; *count = members. */
int cli_print_members(struct cli *c, const char *indent, unsigned *count)
{
	struct rpc_sync_reply rep;
	int rc = cli_call_simple(c, "cluster.members", &rep);
	if (rc)
		return rc;
	struct mp_rd r = rep.res.result;
	uint32_t n;
	if (mp_rd_array(&r, &n) < 0)
		return cli_bad_reply(c, &rep);
	if (count) {
		*count = n;
		printf("members: %u\n", n);
	}
	for (uint32_t i = 0; i < n; i++) {
		struct mp_rd v, m = r;
		const char *id = "?", *state = "?";
		uint32_t idl = 1, stl = 1;
		bool self = false;
		if (cli_map_find(m, "id", &v))
			mp_rd_str(&v, &id, &idl);
		if (cli_map_find(m, "state", &v))
			mp_rd_str(&v, &state, &stl);
		if (cli_map_find(m, "self", &v))
			mp_rd_bool(&v, &self);
		if (mp_peek(&r) != MP_T_MAP || mp_skip(&r) < 0)
			return cli_bad_reply(c, &rep);
		fputs(indent, stdout);
		cli_print_str(id, idl);
		fputs(self ? " self " : " ", stdout);
		cli_print_str(state, stl);
		putchar('\n');
	}
	rpc_sync_reply_free(&rep);
	return CLI_OK;
}

/* A string field of map m, or "?". */
static void print_field(struct mp_rd m, const char *key)
{
	struct mp_rd v;
	const char *s = "?";
	uint32_t len = 1;
	if (cli_map_find(m, key, &v))
		mp_rd_str(&v, &s, &len);
	cli_print_str(s, len);
}

/* discovery.view: "epoch E from M", then "id role state age" lines. -1
 * when the node runs no discovery (the caller lists cluster.members then). */
static int print_view(struct cli *c)
{
	static const uint8_t empty[] = {0x90}; /* [] */
	struct rpc_sync_reply rep;
	int ret = rpc_sync_call(c->rpc, "discovery.view", empty, 1, NULL, 0,
				c->timeout_ms, &rep);
	if (ret < 0 || rep.res.err) {
		rpc_sync_reply_free(&rep);
		return -1;
	}
	struct mp_rd r = rep.res.result, v, list;
	uint64_t epoch = 0, age;
	uint32_t n;
	const char *self = "", *s;
	uint32_t selfl = 0, len;
	if (cli_map_find(r, "epoch", &v))
		mp_rd_uint(&v, &epoch);
	if (cli_map_find(r, "self", &v))
		mp_rd_str(&v, &self, &selfl);
	if (!cli_map_find(r, "members", &list) || mp_rd_array(&list, &n) < 0)
		return cli_bad_reply(c, &rep);
	printf("epoch %llu from ", (unsigned long long)epoch);
	print_field(r, "from");
	printf(", %u member%s\n", n, n == 1 ? "" : "s");
	for (uint32_t i = 0; i < n; i++) {
		struct mp_rd m = list;
		if (mp_peek(&list) != MP_T_MAP || mp_skip(&list) < 0)
			return cli_bad_reply(c, &rep);
		print_field(m, "id");
		putchar(' ');
		print_field(m, "role");
		putchar(' ');
		print_field(m, "state");
		age = 0;
		if (cli_map_find(m, "age_ms", &v))
			mp_rd_uint(&v, &age);
		printf(" %.1fs", (double)age / 1000);
		if (cli_map_find(m, "id", &v) && mp_rd_str(&v, &s, &len) == 0 &&
		    len == selfl && memcmp(s, self, len) == 0)
			fputs(" self", stdout);
		putchar('\n');
	}
	rpc_sync_reply_free(&rep);
	return CLI_OK;
}

/* {"members": cluster.members, "view": discovery.view or null} */
static int members_json(struct cli *c)
{
	static const uint8_t empty[] = {0x90}; /* [] */
	struct rpc_sync_reply rep;
	int rc = cli_call_simple(c, "cluster.members", &rep);
	if (rc)
		return rc;
	struct pc_wbuf b;
	pc_wbuf_init(&b, 0);
	pc_wbuf_append(&b, "{\"members\":", 11);
	struct mp_rd r = rep.res.result;
	if (mp_peek(&r) != MP_T_ARRAY || cli_json_mp(&b, &r, 0) < 0) {
		pc_wbuf_free(&b);
		return cli_bad_reply(c, &rep);
	}
	rpc_sync_reply_free(&rep);
	pc_wbuf_append(&b, ",\"view\":", 8);
	/* No discovery on the node: an error reply, "view" is null. */
	int ret = rpc_sync_call(c->rpc, "discovery.view", empty, 1, NULL, 0,
				c->timeout_ms, &rep);
	r = rep.res.result;
	if (ret < 0 || rep.res.err || cli_json_mp(&b, &r, 0) < 0)
		pc_wbuf_append(&b, "null", 4);
	rpc_sync_reply_free(&rep);
	pc_wbuf_append(&b, "}", 1);
	return cli_json_out(&b);
}

static int cmd_members(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	if (c->json)
		return members_json(c);
	int rc = print_view(c);
	return rc < 0 ? cli_print_members(c, "", NULL) : rc;
}

/* ----------------------------------------------- config / flush / drain */

/* node.config as "key = value" lines (a config file, as peercached
 * --print-config prints it), or one JSON object. */
static int cmd_config(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	struct rpc_sync_reply rep;
	int rc = cli_call_simple(c, "node.config", &rep);
	if (rc)
		return rc;
	if (c->json)
		return print_result(c, &rep);
	struct mp_rd r = rep.res.result;
	uint32_t n;
	if (mp_rd_map(&r, &n) < 0)
		return cli_bad_reply(c, &rep);
	for (uint32_t i = 0; i < n; i++) {
		const char *k, *v;
		uint32_t kl, vl;
		if (mp_rd_str(&r, &k, &kl) < 0 || mp_rd_str(&r, &v, &vl) < 0)
			return cli_bad_reply(c, &rep);
		cli_print_str(k, kl);
		fputs(" = ", stdout);
		cli_print_str(v, vl);
		putchar('\n');
	}
	rpc_sync_reply_free(&rep);
	return CLI_OK;
}

static int cmd_flush(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	if (!c->yes) {
		cli_err("flush drops every page this node holds (its memory "
			"pool and its disk tier) and its directory records of "
			"them; other nodes then miss those keys. Give --yes to "
			"do it");
		return CLI_USAGE;
	}
	/* The node answers when the last slice is done: a large pool takes
	 * a while. */
	if (!c->timeout_set)
		c->timeout_ms = CLI_FLUSH_MS_DEFAULT;
	struct rpc_sync_reply rep;
	int rc = cli_call_simple(c, "kv.flush", &rep);
	if (rc)
		return rc;
	struct mp_rd v;
	uint64_t pages, disk;
	if (!cli_map_find(rep.res.result, "pages", &v) ||
	    mp_rd_uint(&v, &pages) < 0 ||
	    !cli_map_find(rep.res.result, "disk_pages", &v) ||
	    mp_rd_uint(&v, &disk) < 0)
		return cli_bad_reply(c, &rep);
	rpc_sync_reply_free(&rep);
	printf("flushed: %llu pages from the pool, %llu more from the disk "
	       "tier\n", (unsigned long long)pages, (unsigned long long)disk);
	return CLI_OK;
}

static int cmd_drain(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	struct pc_wbuf params;
	msgpack_packer pk;
	pc_wbuf_init(&params, 0);
	pc_wbuf_packer(&params, &pk);
	msgpack_pack_array(&pk, 1);
	if (c->off)
		msgpack_pack_false(&pk);
	else
		msgpack_pack_true(&pk);
	struct rpc_sync_reply rep;
	int rc = cli_call(c, "node.drain", &params, &rep);
	pc_wbuf_free(&params);
	if (rc)
		return rc;
	struct mp_rd v;
	bool changed = false;
	if (cli_map_find(rep.res.result, "changed", &v))
		mp_rd_bool(&v, &changed);
	rpc_sync_reply_free(&rep);
	if (c->off)
		printf("not draining%s: sets are stored\n",
		       changed ? "" : " (it was not)");
	else
		printf("draining%s: sets store nothing and answer false, reads "
		       "are served ('peercache drain --off' ends it)\n",
		       changed ? "" : " (already)");
	return CLI_OK;
}

/* ------------------------------------------------------------------ JSON */

int cli_json_mp(struct pc_wbuf *b, struct mp_rd *r, int depth)
{
	bool bv;
	uint64_t u;
	int64_t i;
	double d;
	const char *s;
	const uint8_t *bin;
	uint32_t len, n;
	enum mp_type t = mp_peek(r);
	if ((t == MP_T_MAP || t == MP_T_ARRAY) && depth >= CLI_PRINT_DEPTH_MAX) {
		pc_wbuf_append(b, "null", 4);
		return mp_skip(r);
	}
	if (t == MP_T_MAP || t == MP_T_ARRAY) {
		bool map = t == MP_T_MAP;
		if ((map ? mp_rd_map(r, &n) : mp_rd_array(r, &n)) < 0)
			return -EINVAL;
		pc_wbuf_append(b, map ? "{" : "[", 1);
		for (uint32_t k = 0; k < n; k++) {
			if (k)
				pc_wbuf_append(b, ",", 1);
			if (map && mp_rd_str(r, &s, &len) == 0) {
				pc_json_str(b, s, len);
			} else if (map) {
				/* a key that is not a string: its JSON text,
				 * as a string */
				struct pc_wbuf kb;
				pc_wbuf_init(&kb, 0);
				int ret = cli_json_mp(&kb, r, depth + 1);
				pc_json_str(b, (const char *)kb.data, kb.len);
				pc_wbuf_free(&kb);
				if (ret < 0)
					return ret;
			}
			if (map)
				pc_wbuf_append(b, ":", 1);
			if (cli_json_mp(b, r, depth + 1) < 0)
				return -EINVAL;
		}
		pc_wbuf_append(b, map ? "}" : "]", 1);
		return 0;
	}
	if (mp_rd_try_nil(r))
		pc_wbuf_append(b, "null", 4);
	else if (mp_rd_bool(r, &bv) == 0)
		pc_wbuf_printf(b, "%s", bv ? "true" : "false");
	else if (mp_rd_uint(r, &u) == 0)
		pc_wbuf_printf(b, "%llu", (unsigned long long)u);
	else if (mp_rd_int(r, &i) == 0)
		pc_wbuf_printf(b, "%lld", (long long)i);
	else if (mp_rd_float(r, &d) == 0)
		pc_json_double(b, d);
	else if (mp_rd_str(r, &s, &len) == 0)
		pc_json_str(b, s, len);
	else if (mp_rd_bin(r, &bin, &len) == 0)
		pc_wbuf_printf(b, "{\"bytes\":%u}", len);
	else if (mp_skip(r) == 0)
		pc_wbuf_append(b, "null", 4); /* an extension type */
	else
		return -EINVAL;
	return 0;
}

int cli_json_out(struct pc_wbuf *b)
{
	bool failed = b->failed || pc_wbuf_append(b, "\n", 1) < 0;
	if (failed)
		cli_err("out of memory building the JSON output");
	else
		fwrite(b->data, 1, b->len, stdout);
	pc_wbuf_free(b);
	return failed ? CLI_FAIL : CLI_OK;
}

/* ------------------------------------------------------------- wait-ready */

#define CLI_WAIT_MS_DEFAULT 30000 /* wait-ready without --timeout */
#define CLI_WAIT_RETRY_MS 100
#define CLI_WAIT_CALL_MS 1000     /* one node.health attempt */

/* node.health's status, or NULL if the reply has none. */
static const char *health_status(struct rpc_sync_reply *rep, char *buf,
				 size_t len)
{
	struct mp_rd v;
	const char *st;
	uint32_t stl;
	if (!cli_map_find(rep->res.result, "status", &v) ||
	    mp_rd_str(&v, &st, &stl) < 0)
		return NULL;
	snprintf(buf, len, "%.*s", (int)stl, st);
	return buf;
}

/*
 * Ask node.health until the node says "ok" (every module started), retrying
 * while it is not there yet (refused, no socket file, no answer, "starting")
 * until the --timeout deadline (default 30 s). An error reply (e.g. a
 * missing secret) will not cure itself: it ends the wait at once.
 */
static int cmd_wait_ready(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	static const uint8_t empty[] = {0x90}; /* [] */
	unsigned total = c->timeout_set ? c->timeout_ms : CLI_WAIT_MS_DEFAULT;
	uint64_t t0 = pc_now_ns(), deadline = t0 + total * 1000000ull;
	char why[256] = "no attempt made", st[32];
	c->method = "node.health";
	for (;;) {
		uint64_t now = pc_now_ns();
		if (now >= deadline)
			break;
		unsigned left = (unsigned)((deadline - now) / 1000000ull) + 1;
		struct rpc_sync_reply rep;
		int ret = rpc_sync_call(c->rpc, "node.health", empty,
					sizeof(empty), NULL, 0,
					PC_MIN(left, CLI_WAIT_CALL_MS), &rep);
		if (ret == 0 && rep.res.err == -EREMOTEIO) {
			cli_err("node.health: %s: %s", rep.res.code,
				rep.res.message);
			rpc_sync_reply_free(&rep);
			return CLI_FAIL;
		}
		if (ret == 0 && rep.res.err == 0) {
			const char *s = health_status(&rep, st, sizeof(st));
			rpc_sync_reply_free(&rep);
			if (s && strcmp(s, "ok") == 0) {
				printf("ready: %s (after %.1f s)\n", c->node,
				       (double)(pc_now_ns() - t0) / 1e9);
				return CLI_OK;
			}
			snprintf(why, sizeof(why), "it says \"%s\"",
				 s ? s : "(no status)");
		} else {
			unreachable_why(c, ret < 0 ? ret : rep.res.err, why,
					sizeof(why));
			rpc_sync_reply_free(&rep);
		}
		usleep(CLI_WAIT_RETRY_MS * 1000);
	}
	cli_err("%s not ready after %.1f s: %s", c->node, total / 1e3, why);
	return CLI_FAIL;
}

/* ------------------------------------------------------------------- main */

static const struct cli_cmd cli_cmds[] = {
	{"put", "KEY [FILE|-]",
	 "store one page; the value is FILE, or stdin when FILE is\n"
	 "absent or '-'. Prints \"stored\"; \"not stored\" exits 1",
	 1, 2, cmd_put, 0,
	 "Exit status: 0 stored; 1 not stored (no pool space, no directory "
	 "owner\nreachable, or the node is draining: the message says which); 2 "
	 "also a bad\nkey, value or FILE."},
	{"get", "KEY [FILE|-]",
	 "fetch one page into FILE, or to stdout ('-' or no FILE).\n"
	 "With no FILE and stdout a terminal, prints a hex preview\n"
	 "of the first 256 bytes instead of raw binary (give a FILE,\n"
	 "'-' or pipe it, e.g. '| cat', for the raw bytes).\n"
	 "A missing page: \"miss: KEY\" on stderr, exit 1",
	 1, 2, cmd_get, 0,
	 "Exit status: 0 found; 1 a miss or a failed write of FILE."},
	{"exists", "KEY...",
	 "print how many leading keys exist (exit 1 unless all do)", 1, -1,
	 cmd_exists, OPT_JSON,
	 "--json prints {\"keys\": N, \"exist\": M}.\n"
	 "Exit status: 0 every key exists; 1 not all do."},
	{"del", "KEY...", "delete the keys; print how many existed", 1, -1,
	 cmd_del, 0,
	 "Exit status: 0 done (whether or not the keys existed)."},
	{"info", "", "node.info as \"key: value\" lines (draining among them)",
	 0, 0, cmd_info, OPT_JSON,
	 "--json prints node.info as one JSON object.\n"
	 "Exit status: 0 ok."},
	{"stats", "",
	 "node id, uptime and members, then the node's peercache_*\n"
	 "counters and gauges (\"name value\", sorted) from its\n"
	 "metrics endpoint when it publishes one",
	 0, 0, cli_cmd_stats, OPT_JSON | OPT_WATCH,
	 "--watch [INTERVAL] samples the metrics every INTERVAL (default 1s)\n"
	 "until Ctrl-C: the first sample shows totals, the next ones show\n"
	 "counters as rates per second over the interval (\"name 12.5/s\";\n"
	 "\"-\" when a counter went down: the node restarted) and gauges as\n"
	 "values. --count N stops after N samples.\n"
	 "--json prints one object {node_id, uptime_s, members,\n"
	 "metrics_address, metrics: {name: value}}; with --watch one object\n"
	 "per line {sample, time, interval_s, gauges, counters, rates}.\n"
	 "Exit status: 0 ok (Ctrl-C included); 1 the metrics could not be "
	 "read."},
	{"members", "", "cluster members: with discovery \"epoch E from "
	 "MASTER\" and one \"id role state last-heartbeat-age [self]\" line "
	 "each, else one \"id [self] state\" line each", 0,
	 0, cmd_members, OPT_JSON,
	 "--json prints {\"members\": cluster.members, \"view\": "
	 "discovery.view\nor null without discovery}.\n"
	 "Exit status: 0 ok."},
	{"config", "",
	 "the settings the node started with, as \"key = value\"\n"
	 "lines (a config file); secrets show as \"***\"",
	 0, 0, cmd_config, OPT_JSON,
	 "Every key of the settings table, from the node itself (its\n"
	 "defaults, config file, environment and command line applied), like\n"
	 "`peercached --print-config`. Secret keys (cluster_secret) are\n"
	 "never sent: \"***\" when set. --json prints one object {key: "
	 "value}.\n"
	 "Exit status: 0 ok."},
	{"flush", "--yes",
	 "drop every page this node holds (pool and disk tier) and\n"
	 "its directory records of them; prints how many",
	 0, 0, cmd_flush, OPT_YES,
	 "Without --yes nothing is done: a message says why, exit 2.\n"
	 "Other nodes miss the dropped keys from then on. The node works in\n"
	 "slices and answers when done; --timeout is the whole wait\n"
	 "[default 10m]. Pages set while a flush runs may survive it: drain\n"
	 "first. Dropped disk pages may come back after a restart of the node\n"
	 "(a delete is not written to the disk log). p2p mode only.\n"
	 "Exit status: 0 flushed; 2 no --yes (nothing done)."},
	{"drain", "[--off]",
	 "stop storing pages (sets answer false) but keep serving\n"
	 "reads, before a planned shutdown; --off ends it",
	 0, 0, cmd_drain, OPT_OFF,
	 "While draining, kv.set and session.set store nothing and answer\n"
	 "false for every page (a normal \"not stored\" for SGLang), counted\n"
	 "in peercache_writes_refused_draining_total; `info` shows\n"
	 "draining: true and the gauge peercache_node_draining is 1. A\n"
	 "restart ends it.\n"
	 "Exit status: 0 done (also when it was so already)."},
	{"wait-ready", "",
	 "wait until the node answers and says it is ready (every\n"
	 "module started); --timeout is the whole wait [default 30s].\n"
	 "Prints \"ready: NODE\"; not ready in time exits 1",
	 0, 0, cmd_wait_ready, 0,
	 "Exit status: 0 ready; 1 not ready within --timeout."},
};

/* The options a command takes, for its help. */
static const struct {
	unsigned opt;
	const char *text;
} cli_opt_help[] = {
	{OPT_JSON, "  --json              one JSON document on stdout\n"},
	{OPT_YES, "  --yes               confirm: really drop the pages\n"},
	{OPT_OFF, "  --off               end the drain: store pages again\n"},
	{OPT_WATCH, "  --watch [INTERVAL]  repeat every INTERVAL (e.g. 500ms, "
		    "2s) [default 1s]\n"
		    "  --count N           with --watch: stop after N samples\n"},
};

static const struct cli_cmd *find_cmd(const char *name)
{
	for (size_t j = 0; j < PC_ARRAY_LEN(cli_cmds); j++)
		if (strcmp(name, cli_cmds[j].name) == 0)
			return &cli_cmds[j];
	return NULL;
}

/* `peercache help CMD`, `peercache CMD --help`. */
static void cmd_usage(const struct cli_cmd *k, FILE *out)
{
	fprintf(out, "Usage: peercache [OPTIONS] %s%s%s%s%s\n\n", k->name,
		*k->args ? " " : "", k->args,
		k->opts & OPT_JSON ? " [--json]" : "",
		k->opts & OPT_WATCH ? " [--watch [INTERVAL]] [--count N]" : "");
	for (const char *h = k->help; *h; h++)
		fputc(*h == '\n' ? ' ' : *h, out);
	fputs(".\n\nOptions of the command:\n", out);
	for (size_t i = 0; i < PC_ARRAY_LEN(cli_opt_help); i++)
		if (k->opts & cli_opt_help[i].opt)
			fputs(cli_opt_help[i].text, out);
	fputs("  -h, --help          show this help and exit\n"
	      "  --                  what follows is an operand, even if it "
	      "starts with -\n\n", out);
	fprintf(out, "%s\nAny command: 1 an error from the node (its code and "
		"message are printed);\n2 a usage error; 3 the node cannot be "
		"reached or gave no usable answer.\n\nOPTIONS (--node, "
		"--secret-file, --timeout, --json): see 'peercache --help'.\n",
		k->more);
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: peercache [OPTIONS] COMMAND [ARGS...]\n"
		"\n"
		"Operator tool for one PeerCache node (peercached), over its "
		"RPC port or\nUnix socket.\n"
		"\n"
		"Options (they go before COMMAND):\n"
		"  --node ADDR         the node: host:port (its rpc_port), "
		"unix:/path, or a\n"
		"                      path to its Unix socket [default: "
		"$PEERCACHE_NODE,\n"
		"                      else " CLI_DEFAULT_SOCKET "]\n"
		"  --secret-file F     read the cluster secret (for TCP) from "
		"F [default:\n"
		"                      $PEERCACHE_SECRET_FILE]; the file must "
		"not be readable\n"
		"                      by other users\n"
		"  --secret S          the cluster secret itself [default: "
		"$PEERCACHE_SECRET;\n"
		"                      prefer a file: command lines are "
		"visible to other users]\n"
		"  --timeout DURATION  per call, e.g. 500ms, 10s, 2m "
		"[default: 5s;\n"
		"                      wait-ready: the whole wait, default "
		"30s]\n"
		"  --json              JSON output (the read commands: info, "
		"stats, members,\n"
		"                      config, exists); also accepted after "
		"COMMAND\n"
		"  -h, --help          show this help and exit\n"
		"  --version           show the version and exit\n"
		"\nCommands (options of a command go after it; 'peercache help "
		"COMMAND' or\n'peercache COMMAND --help' explains one):\n");
	for (size_t i = 0; i < PC_ARRAY_LEN(cli_cmds); i++) {
		const struct cli_cmd *k = &cli_cmds[i];
		char head[64];
		snprintf(head, sizeof(head), "%s %s", k->name, k->args);
		fprintf(out, "  %-18s  ", head);
		for (const char *h = k->help; *h; h++) {
			fputc(*h, out);
			if (*h == '\n')
				fprintf(out, "%22s", "");
		}
		fputc('\n', out);
	}
	fprintf(out, "  %-18s  %s\n", "help [COMMAND]",
		"this help, or one command's: its options, output and exit "
		"status");
	fprintf(out,
		"\nLimits: keys of 1..%d bytes, at most %d per command; "
		"values of 1 byte\nto 64 MiB less 4 KiB (%u bytes): the "
		"node's default\nrpc_max_message_bytes, less room for the "
		"request around the value.\n"
		"\nExit status: 0 ok; 1 miss, not stored, not all keys exist, "
		"an error from\nthe node (its code and message are printed), "
		"a failed local write,\nor a node not ready within "
		"wait-ready's --timeout;\n2 usage error or bad input (key, "
		"value, FILE), or flush without --yes;\n3 the node cannot be "
		"reached or gave no usable answer (the address and\nreason are "
		"printed).\n",
		CLI_KEY_BYTES_MAX, CLI_KEYS_MAX, CLI_VALUE_BYTES_MAX);
}

static int usage_error(const char *what, const char *arg)
{
	cli_err("%s%s%s", what, arg ? ": " : "", arg ? arg : "");
	fprintf(stderr, "peercache: see 'peercache --help'\n");
	return CLI_USAGE;
}

/* Global options into c; returns the index of COMMAND, or -exit status. */
static int parse_options(struct cli *c, int argc, char **argv)
{
	const char *node = getenv("PEERCACHE_NODE");
	const char *secret = getenv("PEERCACHE_SECRET");
	const char *secret_file = getenv("PEERCACHE_SECRET_FILE");
	int i;
	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		const char *a = argv[i], *v;
		bool missing = false;
		uint64_t ms;
		if (!strcmp(a, "--")) {
			i++;
			break;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return -CLI_OK;
		}
		if (!strcmp(a, "--version")) {
			printf("peercache %s (%s)\n", PEERCACHE_VERSION,
			       PEERCACHE_GIT_REV);
			return -CLI_OK;
		}
		if (!strcmp(a, "--json")) {
			c->json = true;
		} else if ((v = pc_opt_value(argc, argv, &i, "--node",
					     &missing))) {
			node = v;
		} else if ((v = pc_opt_value(argc, argv, &i, "--secret-file",
					  &missing))) {
			secret_file = v;
			secret = NULL;
		} else if ((v = pc_opt_value(argc, argv, &i, "--secret",
					  &missing))) {
			secret = v;
			secret_file = NULL;
			cli_err("warning: --secret on the command line is "
				"visible to every local user; use "
				"--secret-file or $PEERCACHE_SECRET_FILE");
		} else if ((v = pc_opt_value(argc, argv, &i, "--timeout",
					  &missing))) {
			if (pc_parse_duration_ms(v, &ms) < 0 || ms == 0 ||
			    ms > CLI_TIMEOUT_MS_MAX)
				return -usage_error("--timeout takes a duration"
						    " from 1ms to 24h, e.g. 10s",
						    v);
			c->timeout_ms = (unsigned)ms;
			c->timeout_set = true;
		} else {
			return -usage_error(missing ? "option needs a value"
						    : "unknown option", a);
		}
	}
	if (!node || !*node)
		node = CLI_DEFAULT_SOCKET;
	if (cli_set_node(c, node) < 0)
		return -usage_error("not a node address (host:port, unix:/path"
				    " or a socket path)", node);
	if (secret_file && *secret_file && (!secret || !*secret)) {
		char why[512];
		if (pc_secret_read_file(secret_file, c->secret_buf,
					sizeof(c->secret_buf), NULL, why,
					sizeof(why)) < 0)
			return -usage_error("--secret-file", why);
		secret = c->secret_buf;
	}
	c->secret = c->tcp && secret && *secret ? secret : NULL;
	return i;
}

/* --watch's optional INTERVAL and --count's N into c; 0 or exit status. */
static int watch_option(struct cli *c, int argc, char **argv, int *i)
{
	const char *a = argv[*i];
	uint64_t ms;
	if (!strcmp(a, "--watch")) {
		c->watch = true;
		if (*i + 1 >= argc || argv[*i + 1][0] == '-')
			return CLI_OK; /* no INTERVAL: the default */
		a = argv[++*i];
		if (pc_parse_duration_ms(a, &ms) < 0 || ms == 0 ||
		    ms > CLI_TIMEOUT_MS_MAX)
			return usage_error("--watch takes an interval from 1ms "
					   "to 24h, e.g. 2s", a);
		c->watch_ms = (unsigned)ms;
		return CLI_OK;
	}
	char *end;
	errno = 0;
	long n = *i + 1 < argc ? strtol(argv[*i + 1], &end, 10) : 0;
	if (*i + 1 >= argc || errno || *end || n < 1)
		return usage_error("--count takes a number of samples, 1 or "
				   "more", *i + 1 < argc ? argv[*i + 1] : NULL);
	c->count = n;
	++*i;
	return CLI_OK;
}

/*
 * The command's own options (anywhere after it, until "--") into c, its
 * operands compacted at the start of argv; *argc becomes their count.
 * Returns 0, -1 after printing the command's help, or an exit status.
 */
static int command_options(struct cli *c, const struct cli_cmd *k,
			   int *argc, char **argv)
{
	static const char *const global[] = {"--node", "--secret",
					     "--secret-file", "--timeout",
					     "--version"};
	static const struct {
		const char *name;
		unsigned opt;
	} own[] = {{"--json", OPT_JSON}, {"--yes", OPT_YES},
		   {"--off", OPT_OFF}, {"--watch", OPT_WATCH},
		   {"--count", OPT_WATCH}};
	int nops = 0;
	bool operands_only = false;
	for (int i = 0; i < *argc; i++) {
		const char *a = argv[i];
		if (operands_only || a[0] != '-' || !a[1]) {
			argv[nops++] = argv[i];
			continue;
		}
		if (!strcmp(a, "--")) {
			operands_only = true;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			cmd_usage(k, stdout);
			return -1;
		}
		/* An option of peercache's after the command would silently
		 * become a key or a file name; say where options go. */
		for (size_t j = 0; j < PC_ARRAY_LEN(global); j++) {
			size_t n = strlen(global[j]);
			if (!strncmp(a, global[j], n) &&
			    (a[n] == '\0' || a[n] == '='))
				return usage_error("options go before COMMAND",
						   a);
		}
		size_t j = 0;
		while (j < PC_ARRAY_LEN(own) && strcmp(a, own[j].name))
			j++;
		if (j < PC_ARRAY_LEN(own) && !(k->opts & own[j].opt)) {
			cli_err("%s takes no %s (see 'peercache help %s')",
				k->name, a, k->name);
			return CLI_USAGE;
		}
		int rc = CLI_OK;
		if (j == PC_ARRAY_LEN(own) && k->max_args == 0)
			return usage_error("unknown option", a);
		if (j == PC_ARRAY_LEN(own))
			argv[nops++] = argv[i]; /* a key that starts with - */
		else if (own[j].opt == OPT_JSON)
			c->json = true;
		else if (own[j].opt == OPT_YES)
			c->yes = true;
		else if (own[j].opt == OPT_OFF)
			c->off = true;
		else
			rc = watch_option(c, *argc, argv, &i);
		if (rc)
			return rc;
	}
	*argc = nops;
	if (c->json && !(k->opts & OPT_JSON)) {
		cli_err("%s has no --json output (the read commands have: info,"
			" stats, members, config, exists)", k->name);
		return CLI_USAGE;
	}
	if (c->count && !c->watch)
		return usage_error("--count goes with --watch", NULL);
	if (nops < k->min_args || (k->max_args >= 0 && nops > k->max_args)) {
		cli_err("usage: peercache [OPTIONS] %s%s%s", k->name,
			*k->args ? " " : "", k->args);
		return usage_error(nops < k->min_args ? "missing operand"
						      : "too many operands",
				   NULL);
	}
	return CLI_OK;
}

/* `peercache help [COMMAND]`. */
static int cmd_help(int argc, char **argv)
{
	if (argc == 0) {
		usage(stdout);
		return CLI_OK;
	}
	const struct cli_cmd *k = argc == 1 ? find_cmd(argv[0]) : NULL;
	if (!k)
		return usage_error(argc > 1 ? "help takes one command"
					    : "unknown command", argv[0]);
	cmd_usage(k, stdout);
	return CLI_OK;
}

int main(int argc, char **argv)
{
	struct cli c = {.timeout_ms = CLI_TIMEOUT_MS_DEFAULT,
			.watch_ms = CLI_WATCH_MS_DEFAULT};
	int i = parse_options(&c, argc, argv);
	if (i <= 0)
		return -i;
	if (i >= argc)
		return usage_error("no command given", NULL);
	int nops = argc - i - 1;
	char **ops = argv + i + 1;
	if (strcmp(argv[i], "help") == 0)
		return cmd_help(nops, ops);
	const struct cli_cmd *k = find_cmd(argv[i]);
	if (!k)
		return usage_error("unknown command", argv[i]);
	int rc = command_options(&c, k, &nops, ops);
	if (rc)
		return rc < 0 ? CLI_OK : rc;
	struct rpc_sync_opts o;
	rpc_sync_opts_default(&o);
	o.timeout_ms = c.timeout_ms;
	o.max_idle = 1;
	o.secret = c.secret;
	o.max_message_bytes = CLI_MESSAGE_BYTES_MAX;
	int err;
	if (!(c.rpc = rpc_sync_new(c.node, &o, &err))) {
		if (err == -EHOSTUNREACH) {
			cli_err("cannot reach %s: cannot resolve its host name",
				c.node);
			return CLI_UNREACHABLE;
		}
		return usage_error(err == -ENOMEM ? "out of memory"
			: "not a node address (host:port, unix:/path or a "
			  "socket path of at most 107 bytes)", c.node);
	}
	rc = k->run(&c, nops, ops);
	rpc_sync_free(c.rpc);
	if (fflush(stdout) == EOF || ferror(stdout)) {
		cli_err("cannot write to stdout: %s", strerror(errno));
		if (rc == CLI_OK)
			rc = CLI_FAIL;
	}
	return rc;
}
