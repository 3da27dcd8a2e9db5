/*
 * bench/lg_opts.c — pc-loadgen's usage text and option parser.
 *
 * Owns: the getopt table. Main thread only, before any worker exists.
 * Invariants: a value out of its bound is refused with the option's name,
 * never clamped; --request and --params-hex decode into fixed buffers of
 * LG_REQUEST_BYTES_MAX and refuse anything longer.
 */
#include "lg_opts.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common/util.h"

static void lg_usage(FILE *out)
{
	fprintf(out,
		"usage: pc-loadgen --port P [options]\n"
		"\n"
		"Closed-loop TCP load generator: every connection keeps --pipeline\n"
		"requests in flight and sends a new one each time a reply completes.\n"
		"\n"
		"  --host H          server address (default 127.0.0.1)\n"
		"  --port P          server port (required)\n"
		"  --conns N         connections (default 1, max %d)\n"
		"  --threads T       worker threads, connections spread round-robin\n"
		"                    (default 1, max %d, at most N)\n"
		"  --duration SEC    measured window (default 5)\n"
		"  --warmup SEC      load before the window, not measured (default 1)\n"
		"  --pipeline K      requests in flight per connection (default 1, max %d)\n"
		"  --mode M          wire protocol: raw (default) or msgpack-rpc\n"
		"  --reply-bytes B   raw: reply bytes per request (default: request\n"
		"                    length, i.e. an echo server; redis PING needs 7);\n"
		"                    msgpack-rpc: largest reply accepted (default %d)\n"
		"\n"
		"raw mode: a fixed request, replies framed by length only.\n"
		"  --request STR     request bytes; escapes \\r \\n \\t \\0 \\\\ \\xNN\n"
		"                    (default \"PING\\r\\n\")\n"
		"\n"
		"msgpack-rpc mode: requests [0, msgid, method, params]; replies\n"
		"[1, msgid, error, result] matched by msgid in any order; a reply\n"
		"whose error is not nil is counted in reply_errors, not in ops.\n"
		"  --method NAME     method to call (required), e.g. node.health\n"
		"  --params-hex HEX  params as one pre-encoded msgpack array in hex\n"
		"                    (default 90, i.e. [])\n"
		"\n"
		"  --timeout SEC     connect deadline and longest silence from a busy\n"
		"                    connection before it counts as dead (default 2)\n"
		"  --json            print one JSON object instead of a text line\n"
		"  --help            this text\n"
		"\n"
		"Exit status: 0 on a clean run, 1 when a connection failed, a reply\n"
		"carried an error or no request completed, 2 on bad usage.\n",
		LG_CONNS_MAX, LG_THREADS_MAX, LG_PIPELINE_MAX,
		LG_RPC_REPLY_BYTES_DEFAULT);
}

static int lg_parse_uint(const char *s, unsigned lo, unsigned hi,
			 unsigned *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

static int lg_parse_seconds(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int lg_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* C-style unescape of s into out[0..cap). Returns the byte count or -EINVAL. */
static ssize_t lg_unescape(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;
	while (*s) {
		uint8_t c = (uint8_t)*s++;
		if (c == '\\') {
			switch (*s++) {
			case 'r': c = '\r'; break;
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case '0': c = '\0'; break;
			case '\\': c = '\\'; break;
			case '"': c = '"'; break;
			case '\'': c = '\''; break;
			case 'x': {
				int hi = lg_hex_digit(s[0]);
				int lo = hi < 0 ? -1 : lg_hex_digit(s[1]);
				if (lo < 0)
					return -EINVAL;
				c = (uint8_t)(hi << 4 | lo);
				s += 2;
				break;
			}
			default:
				return -EINVAL;
			}
		}
		if (n == cap)
			return -EINVAL;
		out[n++] = c;
	}
	return (ssize_t)n;
}

/* Hex string into out[0..cap). Returns the byte count or -EINVAL. */
static ssize_t lg_unhex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;
	for (; s[0]; s += 2) {
		int hi = lg_hex_digit(s[0]);
		int lo = hi < 0 ? -1 : lg_hex_digit(s[1]);
		if (lo < 0 || n == cap)
			return -EINVAL;
		out[n++] = (uint8_t)(hi << 4 | lo);
	}
	return (ssize_t)n;
}

/* Same order as lg_longopts: error messages index the table by c - HOST. */
enum {
	LG_OPT_HOST = 256,
	LG_OPT_PORT,
	LG_OPT_CONNS,
	LG_OPT_THREADS,
	LG_OPT_DURATION,
	LG_OPT_WARMUP,
	LG_OPT_PIPELINE,
	LG_OPT_REQUEST,
	LG_OPT_REPLY_BYTES,
	LG_OPT_MODE,
	LG_OPT_TIMEOUT,
	LG_OPT_JSON,
	LG_OPT_METHOD,
	LG_OPT_PARAMS_HEX,
	LG_OPT_HELP,
};

static const struct option lg_longopts[] = {
	{ "host", required_argument, NULL, LG_OPT_HOST },
	{ "port", required_argument, NULL, LG_OPT_PORT },
	{ "conns", required_argument, NULL, LG_OPT_CONNS },
	{ "threads", required_argument, NULL, LG_OPT_THREADS },
	{ "duration", required_argument, NULL, LG_OPT_DURATION },
	{ "warmup", required_argument, NULL, LG_OPT_WARMUP },
	{ "pipeline", required_argument, NULL, LG_OPT_PIPELINE },
	{ "request", required_argument, NULL, LG_OPT_REQUEST },
	{ "reply-bytes", required_argument, NULL, LG_OPT_REPLY_BYTES },
	{ "mode", required_argument, NULL, LG_OPT_MODE },
	{ "timeout", required_argument, NULL, LG_OPT_TIMEOUT },
	{ "json", no_argument, NULL, LG_OPT_JSON },
	{ "method", required_argument, NULL, LG_OPT_METHOD },
	{ "params-hex", required_argument, NULL, LG_OPT_PARAMS_HEX },
	{ "help", no_argument, NULL, LG_OPT_HELP },
	{ NULL, 0, NULL, 0 },
};

int lg_opts_parse(int argc, char **argv, struct lg_opts *o)
{
	unsigned port = 0, reply = 0;
	int c;

	o->host = "127.0.0.1";
	o->conns = 1;
	o->threads = 1;
	o->duration_s = 5.0;
	o->warmup_s = 1.0;
	o->timeout_s = 2.0;
	o->pipeline = 1;
	o->request_bytes = (size_t)lg_unescape("PING\\r\\n", o->request,
					       sizeof(o->request));
	o->proto = &lg_proto_raw;

	while ((c = getopt_long(argc, argv, "", lg_longopts, NULL)) != -1) {
		int rc = 0;
		ssize_t n;
		switch (c) {
		case LG_OPT_HOST:
			o->host = optarg;
			break;
		case LG_OPT_PORT:
			rc = lg_parse_uint(optarg, 1, 65535, &port);
			o->port = optarg;
			break;
		case LG_OPT_CONNS:
			rc = lg_parse_uint(optarg, 1, LG_CONNS_MAX, &o->conns);
			break;
		case LG_OPT_THREADS:
			rc = lg_parse_uint(optarg, 1, LG_THREADS_MAX,
					   &o->threads);
			break;
		case LG_OPT_DURATION:
			rc = lg_parse_seconds(optarg, 0.001, LG_DURATION_S_MAX,
					      &o->duration_s);
			break;
		case LG_OPT_WARMUP:
			rc = lg_parse_seconds(optarg, 0.0, LG_DURATION_S_MAX,
					      &o->warmup_s);
			break;
		case LG_OPT_TIMEOUT:
			rc = lg_parse_seconds(optarg, 0.001, 3600.0,
					      &o->timeout_s);
			break;
		case LG_OPT_PIPELINE:
			rc = lg_parse_uint(optarg, 1, LG_PIPELINE_MAX,
					   &o->pipeline);
			break;
		case LG_OPT_REQUEST:
			n = lg_unescape(optarg, o->request, sizeof(o->request));
			if (n <= 0) {
				fprintf(stderr,
					"pc-loadgen: --request: empty, longer than %d bytes, or a bad escape\n",
					LG_REQUEST_BYTES_MAX);
				return -EINVAL;
			}
			o->request_bytes = (size_t)n;
			o->request_given = true;
			break;
		case LG_OPT_REPLY_BYTES:
			rc = lg_parse_uint(optarg, 1, LG_REPLY_BYTES_MAX, &reply);
			o->reply_bytes = reply;
			break;
		case LG_OPT_MODE:
			o->proto = lg_proto_find(optarg);
			if (!o->proto) {
				fprintf(stderr, "pc-loadgen: unknown --mode '%s'\n",
					optarg);
				return -EINVAL;
			}
			break;
		case LG_OPT_JSON:
			o->json = true;
			break;
		case LG_OPT_METHOD:
			o->method = optarg;
			break;
		case LG_OPT_PARAMS_HEX:
			n = lg_unhex(optarg, o->params, sizeof(o->params));
			if (n <= 0) {
				fprintf(stderr,
					"pc-loadgen: --params-hex: empty, odd length, not hex, or longer than %d bytes\n",
					LG_REQUEST_BYTES_MAX);
				return -EINVAL;
			}
			o->params_bytes = (size_t)n;
			o->params_given = true;
			break;
		case LG_OPT_HELP:
			lg_usage(stdout);
			return 1;
		default:
			lg_usage(stderr);
			return -EINVAL;
		}
		if (rc < 0) {
			fprintf(stderr, "pc-loadgen: bad value '%s' for --%s\n",
				optarg, lg_longopts[c - LG_OPT_HOST].name);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pc-loadgen: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	if (!o->port) {
		fprintf(stderr, "pc-loadgen: --port is required (see --help)\n");
		return -EINVAL;
	}
	/* More threads than connections would only spin idle loops. */
	if (o->threads > o->conns)
		o->threads = o->conns;
	return 0;
}
