/*
 * client/peercache_cli.c — `peercache`, the operator's command-line tool:
 * put/get/exists/del one node's pages, show who the node is (info,
 * members, stats), and wait until it is ready (wait-ready).
 *
 * Owns: the process (only main() exits) and one blocking RPC client
 * (rpc/sync.c) to the node named by --node / $PEERCACHE_NODE / the default
 * socket. Single-threaded. Commands are a table (cli_cmds); each runs one or
 * two RPC calls and returns an exit status:
 *
 *   0 ok; 1 miss, not stored, not all keys exist, a remote error, a local
 *   write error, or (wait-ready) not ready within --timeout; 2 usage error or bad input (key, value, FILE); 3 the node
 *   could not be reached or gave no usable answer.
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

#include "common/buf.h"
#include "common/config.h"
#include "common/secret.h"
#include "common/util.h"
#include "rpc/client.h"
#include "rpc/mp.h"

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
#define CLI_METRICS_BYTES_MAX (16u << 20) /* one /metrics response */

enum {
	CLI_OK = 0,
	CLI_FAIL = 1,        /* miss, not stored, remote error, local write */
	CLI_USAGE = 2,       /* bad arguments or input */
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
};

struct cli_cmd {
	const char *name;
	const char *args;  /* for usage lines */
	const char *help;  /* lines after the first are indented */
	int min_args, max_args; /* operands after the command; -1: any */
	int (*run)(struct cli *c, int argc, char **argv);
};

static void cli_err(const char *fmt, ...) PC_PRINTF(1, 2);
static void cli_err(const char *fmt, ...)
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
static void print_str(const char *s, size_t len)
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
static int cli_call(struct cli *c, const char *method,
		    const struct pc_wbuf *params, struct rpc_sync_reply *rep)
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

static int bad_reply(struct cli *c, struct rpc_sync_reply *rep)
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
static bool map_find(struct mp_rd r, const char *key, struct mp_rd *v)
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
		return bad_reply(c, &rep);
	rpc_sync_reply_free(&rep);
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
		return bad_reply(c, &rep);
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
		return bad_reply(c, &rep);
	rpc_sync_reply_free(&rep);
	printf("%llu\n", (unsigned long long)*count);
	return CLI_OK;
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
		print_str(s, len);
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

static int call_simple(struct cli *c, const char *method,
		       struct rpc_sync_reply *rep)
{
	static const uint8_t empty[] = {0x90}; /* [] */
	struct pc_wbuf params = {.data = (uint8_t *)empty, .len = 1};
	return cli_call(c, method, &params, rep);
}

static int cmd_info(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	struct rpc_sync_reply rep;
	int rc = call_simple(c, "node.info", &rep);
	if (rc)
		return rc;
	struct mp_rd r = rep.res.result;
	if (mp_peek(&r) != MP_T_MAP || print_block(&r, 0, 0) < 0)
		return bad_reply(c, &rep);
	rpc_sync_reply_free(&rep);
	return CLI_OK;
}

/* cluster.members as "id [self] state" lines; *count = members. */
static int print_members(struct cli *c, const char *indent, unsigned *count)
{
	struct rpc_sync_reply rep;
	int rc = call_simple(c, "cluster.members", &rep);
	if (rc)
		return rc;
	struct mp_rd r = rep.res.result;
	uint32_t n;
	if (mp_rd_array(&r, &n) < 0)
		return bad_reply(c, &rep);
	if (count) {
		*count = n;
		printf("members: %u\n", n);
	}
	for (uint32_t i = 0; i < n; i++) {
		struct mp_rd v, m = r;
		const char *id = "?", *state = "?";
		uint32_t idl = 1, stl = 1;
		bool self = false;
		if (map_find(m, "id", &v))
			mp_rd_str(&v, &id, &idl);
		if (map_find(m, "state", &v))
			mp_rd_str(&v, &state, &stl);
		if (map_find(m, "self", &v))
			mp_rd_bool(&v, &self);
		if (mp_peek(&r) != MP_T_MAP || mp_skip(&r) < 0)
			return bad_reply(c, &rep);
		fputs(indent, stdout);
		print_str(id, idl);
		fputs(self ? " self " : " ", stdout);
		print_str(state, stl);
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
	if (map_find(m, key, &v))
		mp_rd_str(&v, &s, &len);
	print_str(s, len);
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
	if (map_find(r, "epoch", &v))
		mp_rd_uint(&v, &epoch);
	if (map_find(r, "self", &v))
		mp_rd_str(&v, &self, &selfl);
	if (!map_find(r, "members", &list) || mp_rd_array(&list, &n) < 0)
		return bad_reply(c, &rep);
	printf("epoch %llu from ", (unsigned long long)epoch);
	print_field(r, "from");
	printf(", %u member%s\n", n, n == 1 ? "" : "s");
	for (uint32_t i = 0; i < n; i++) {
		struct mp_rd m = list;
		if (mp_peek(&list) != MP_T_MAP || mp_skip(&list) < 0)
			return bad_reply(c, &rep);
		print_field(m, "id");
		putchar(' ');
		print_field(m, "role");
		putchar(' ');
		print_field(m, "state");
		age = 0;
		if (map_find(m, "age_ms", &v))
			mp_rd_uint(&v, &age);
		printf(" %.1fs", (double)age / 1000);
		if (map_find(m, "id", &v) && mp_rd_str(&v, &s, &len) == 0 &&
		    len == selfl && memcmp(s, self, len) == 0)
			fputs(" self", stdout);
		putchar('\n');
	}
	rpc_sync_reply_free(&rep);
	return CLI_OK;
}

static int cmd_members(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	int rc = print_view(c);
	return rc < 0 ? print_members(c, "", NULL) : rc;
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
	if (!map_find(rep->res.result, "status", &v) ||
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

/* ------------------------------------------------------------------ stats */

/* GET /metrics from "host:port" into in: the whole response, which ends
 * when the node closes (Connection: close). 0 or -errno. */
static int http_fetch(const char *addr, unsigned timeout_ms,
		      struct pc_wbuf *in)
{
	uint64_t deadline = pc_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	struct sockaddr_storage ss;
	socklen_t sl;
	int ret = pc_endpoint_parse(addr, &ss, &sl);
	if (ret < 0)
		return ret;
	int fd = rpc_connect_by(&ss, sl, deadline);
	if (fd < 0)
		return fd;
	char req[512];
	int rlen = snprintf(req, sizeof(req), "GET /metrics HTTP/1.1\r\nHost: "
			    "%s\r\nUser-Agent: peercache/%s\r\nConnection: "
			    "close\r\n\r\n", addr, PEERCACHE_VERSION);
	/* The request is far smaller than any socket buffer: one send. */
	if (ret == 0 && send(fd, req, (size_t)rlen, MSG_NOSIGNAL) != rlen)
		ret = -EIO;
	while (ret == 0) {
		uint8_t chunk[65536];
		ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
		if (n == 0)
			break; /* the whole response */
		if (n > 0)
			ret = pc_wbuf_append(in, chunk, (size_t)n) < 0 ? -EMSGSIZE
								       : 0;
		else if (errno == EAGAIN)
			ret = rpc_wait_fd(fd, POLLIN, deadline);
		else if (errno != EINTR)
			ret = -errno;
	}
	close(fd);
	return ret;
}

/* The body of a 200 response, or NULL with *why set. */
static const char *http_body(struct pc_wbuf *in, size_t *len,
			     const char **why)
{
	char *p = (char *)in->data;
	char *end = in->len ? memmem(p, in->len, "\r\n\r\n", 4) : NULL;
	if (!end || in->len < 12 || strncmp(p, "HTTP/1.", 7) != 0) {
		*why = "not an HTTP response";
		return NULL;
	}
	if (strncmp(p + 8, " 200", 4) != 0) {
		*why = "the response is not 200 OK";
		return NULL;
	}
	*end = '\0'; /* headers are a C string from here */
	if (strcasestr(p, "\r\ntransfer-encoding:")) {
		*why = "a chunked response (unsupported)";
		return NULL;
	}
	*len = in->len - (size_t)(end + 4 - p);
	return end + 4;
}

/* Keep a sample line: a peercache_* counter or gauge of the family
 * announced by the last # TYPE line, with no label but node. */
static bool metric_wanted(const char *line, size_t len, const char *family)
{
	size_t nl = strcspn(line, "{ ");
	if (!*family || nl != strlen(family) || memcmp(line, family, nl) ||
	    nl >= len)
		return false;
	const char *p = line + nl, *end = line + len;
	if (*p != '{')
		return true;
	for (p++; p < end && *p != '}';) {
		const char *eq = memchr(p, '=', (size_t)(end - p));
		if (!eq || eq + 1 >= end || eq[1] != '"')
			return false;
		if (eq - p != 4 || memcmp(p, "node", 4) != 0)
			return false;
		for (p = eq + 2; p < end && *p != '"'; p++)
			if (*p == '\\')
				p++;
		if (p >= end)
			return false; /* no closing quote */
		p++;
		if (p < end && *p == ',')
			p++;
	}
	return p < end;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Print the wanted samples of a Prometheus text body, sorted by name. */
static int print_metrics(char *body, size_t len)
{
	char family[128] = "";
	char **lines = NULL;
	size_t n = 0, cap = 0;
	body[len] = '\0'; /* show_metrics appended a NUL past the body */
	for (char *save = NULL, *l = strtok_r(body, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		char name[128], type[32];
		if (sscanf(l, "# TYPE %127s %31s", name, type) == 2) {
			bool keep = strncmp(name, "peercache_", 10) == 0 &&
				    (!strcmp(type, "counter") ||
				     !strcmp(type, "gauge"));
			snprintf(family, sizeof(family), "%s", keep ? name : "");
			continue;
		}
		if (l[0] == '#' || !metric_wanted(l, strlen(l), family))
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 128;
			char **nl = realloc(lines, cap * sizeof(*nl));
			if (!nl) {
				free(lines);
				return -ENOMEM;
			}
			lines = nl;
		}
		/* "name{node=...} value [ts]" -> "name value", in place: the
		 * value always lies past the name and one more byte. */
		size_t nlen = strcspn(l, "{ ");
		char *v = strrchr(l, '}');
		v = v ? v + 1 : l + nlen;
		v += strspn(v, " ");
		v[strcspn(v, " \r")] = '\0';
		l[nlen] = ' ';
		memmove(l + nlen + 1, v, strlen(v) + 1);
		lines[n++] = l;
	}
	if (n)
		qsort(lines, n, sizeof(*lines), cmp_str);
	for (size_t i = 0; i < n; i++)
		puts(lines[i]);
	free(lines);
	return 0;
}

/* "0.0.0.0:9" or "[::]:9" is where the node listens, not where to reach
 * it: use the host of --node (or loopback for a Unix socket). */
static void metrics_addr(const struct cli *c, const char *published,
			 char *out, size_t len)
{
	const char *port = strrchr(published, ':');
	bool wild = port && (!strncmp(published, "0.0.0.0:", 8) ||
			     !strncmp(published, "[::]:", 5));
	if (!wild) {
		snprintf(out, len, "%s", published);
		return;
	}
	const char *host = c->tcp ? c->node : "127.0.0.1:";
	const char *hend = strrchr(host, ':');
	snprintf(out, len, "%.*s%s", (int)(hend - host), host, port);
}

static int show_metrics(struct cli *c, struct mp_rd info)
{
	struct mp_rd addrs, v;
	const char *a;
	uint32_t al;
	if (!map_find(info, "addresses", &addrs) ||
	    !map_find(addrs, "metrics", &v) || mp_rd_str(&v, &a, &al) < 0) {
		puts("metrics: not published by the node (metrics_enabled "
		     "off?)");
		return CLI_OK;
	}
	char pub[256], addr[256];
	snprintf(pub, sizeof(pub), "%.*s", (int)al, a);
	metrics_addr(c, pub, addr, sizeof(addr));
	printf("metrics: %s\n", addr);
	struct pc_wbuf in;
	pc_wbuf_init(&in, CLI_METRICS_BYTES_MAX);
	const char *why = NULL;
	char ebuf[160];
	size_t blen = 0;
	char *body = NULL;
	int ret = http_fetch(addr, c->timeout_ms, &in);
	if (ret == -ETIMEDOUT) {
		why = "no complete answer in time";
	} else if (ret < 0) {
		snprintf(ebuf, sizeof(ebuf), "%s", strerror(-ret));
		why = ebuf;
	} else if (pc_wbuf_append(&in, "", 1) < 0) { /* room for a NUL */
		why = "the response is too large";
	} else {
		in.len--;
		body = (char *)http_body(&in, &blen, &why);
	}
	if (body && print_metrics(body, blen) < 0)
		why = "out of memory";
	fflush(stdout);
	pc_wbuf_free(&in);
	if (why) {
		cli_err("cannot read metrics from http://%s/metrics: %s", addr,
			why);
		return CLI_FAIL;
	}
	return CLI_OK;
}

static int cmd_stats(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	struct rpc_sync_reply rep;
	int rc = call_simple(c, "node.info", &rep);
	if (rc)
		return rc;
	struct mp_rd info = rep.res.result, v;
	const char *id;
	uint32_t idl;
	double up;
	if (!map_find(info, "node_id", &v) || mp_rd_str(&v, &id, &idl) < 0 ||
	    !map_find(info, "uptime_s", &v) || mp_rd_float(&v, &up) < 0)
		return bad_reply(c, &rep);
	fputs("node_id: ", stdout);
	print_str(id, idl);
	printf("\nuptime_s: %.3f\n", up);
	unsigned members;
	rc = print_members(c, "  ", &members);
	if (rc == CLI_OK)
		rc = show_metrics(c, info);
	rpc_sync_reply_free(&rep);
	return rc;
}

/* ------------------------------------------------------------------- main */

static const struct cli_cmd cli_cmds[] = {
	{"put", "KEY [FILE|-]",
	 "store one page; the value is FILE, or stdin when FILE is\n"
	 "absent or '-'. Prints \"stored\"; \"not stored\" exits 1",
	 1, 2, cmd_put},
	{"get", "KEY [FILE|-]",
	 "fetch one page into FILE, or to stdout ('-' or no FILE).\n"
	 "With no FILE and stdout a terminal, prints a hex preview\n"
	 "of the first 256 bytes instead of raw binary (give a FILE,\n"
	 "'-' or pipe it, e.g. '| cat', for the raw bytes).\n"
	 "A missing page: \"miss: KEY\" on stderr, exit 1",
	 1, 2, cmd_get},
	{"exists", "KEY...",
	 "print how many leading keys exist (exit 1 unless all do)", 1, -1,
	 cmd_exists},
	{"del", "KEY...", "delete the keys; print how many existed", 1, -1,
	 cmd_del},
	{"info", "", "node.info as \"key: value\" lines", 0, 0, cmd_info},
	{"stats", "",
	 "node id, uptime and members, then the node's peercache_*\n"
	 "counters and gauges (\"name value\", sorted) from its\n"
	 "metrics endpoint when it publishes one",
	 0, 0, cmd_stats},
	{"members", "", "cluster members: with discovery \"epoch E from "
	 "MASTER\" and one \"id role state last-heartbeat-age [self]\" line "
	 "each, else one \"id [self] state\" line each", 0,
	 0, cmd_members},
	{"wait-ready", "",
	 "wait until the node answers and says it is ready (every\n"
	 "module started); --timeout is the whole wait [default 30s].\n"
	 "Prints \"ready: NODE\"; not ready in time exits 1",
	 0, 0, cmd_wait_ready},
};

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
		"  -h, --help          show this help and exit\n"
		"  --version           show the version and exit\n"
		"\nCommands:\n");
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
	fprintf(out,
		"\nLimits: keys of 1..%d bytes, at most %d per command; "
		"values of 1 byte\nto 64 MiB less 4 KiB (%u bytes): the "
		"node's default\nrpc_max_message_bytes, less room for the "
		"request around the value.\n"
		"\nExit status: 0 ok; 1 miss, not stored, not all keys exist, "
		"an error from\nthe node (its code and message are printed), "
		"a failed local write,\nor a node not ready within "
		"wait-ready's --timeout;\n2 usage error or bad input (key, "
		"value, FILE); 3 the node cannot be\nreached or gave no "
		"usable answer (the address and reason are printed).\n",
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
		if ((v = pc_opt_value(argc, argv, &i, "--node", &missing))) {
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

/* Check a command's operands; returns 0 or an exit status. */
static int check_operands(const struct cli_cmd *k, int argc, char **argv)
{
	static const char *const opts[] = {"--node", "--secret",
					   "--secret-file", "--timeout",
					   "--help", "-h", "--version"};
	/* An option after the command would silently become a key or a file
	 * name; say where options go instead. */
	for (int i = 0; i < argc; i++)
		for (size_t j = 0; j < PC_ARRAY_LEN(opts); j++) {
			size_t n = strlen(opts[j]);
			if (!strncmp(argv[i], opts[j], n) &&
			    (argv[i][n] == '\0' || argv[i][n] == '='))
				return usage_error("options go before COMMAND",
						   argv[i]);
		}
	if (argc < k->min_args || (k->max_args >= 0 && argc > k->max_args)) {
		cli_err("usage: peercache [OPTIONS] %s%s%s", k->name,
			*k->args ? " " : "", k->args);
		return usage_error(argc < k->min_args ? "missing operand"
						      : "too many operands",
				   NULL);
	}
	return CLI_OK;
}

int main(int argc, char **argv)
{
	struct cli c = {.timeout_ms = CLI_TIMEOUT_MS_DEFAULT};
	int i = parse_options(&c, argc, argv);
	if (i <= 0)
		return -i;
	if (i >= argc)
		return usage_error("no command given", NULL);
	const struct cli_cmd *k = NULL;
	for (size_t j = 0; j < PC_ARRAY_LEN(cli_cmds); j++)
		if (strcmp(argv[i], cli_cmds[j].name) == 0)
			k = &cli_cmds[j];
	if (!k)
		return usage_error("unknown command", argv[i]);
	int nops = argc - i - 1;
	char **ops = argv + i + 1;
	int rc = check_operands(k, nops, ops);
	if (rc)
		return rc;
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
