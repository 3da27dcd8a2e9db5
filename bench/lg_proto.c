/*
 * bench/lg_proto.c — pc-loadgen's two modes: raw (fixed request, replies framed
 * by length) and msgpack-rpc (requests built from a template, replies framed
 * by skipping one msgpack object and matched by msgid).
 *
 * Owns: the mode table and, per run, the msgpack-rpc request template
 * (cfg->tmpl, freed by main). setup() runs once on the main thread; the
 * other callbacks run on every worker at once and only read cfg.
 *
 * Invariants: request_build() writes exactly request_bytes_max bytes (every
 * request of a run has the same size); reply_frame() decides "complete or
 * not" before it looks at content, so a partial reply is never rejected for
 * what its missing bytes would have said.
 */
#include "lg_proto.h"

#include <errno.h>
#include <string.h>

#include "common/util.h"
#include "lg_msgpack.h"

static int lg_raw_setup(struct lg_proto_cfg *cfg, const char **why)
{
	if (cfg->method || cfg->params) {
		*why = "--method and --params-hex need --mode msgpack-rpc";
		return -EINVAL;
	}
	/* Default: an echo server answers with the request itself. */
	if (cfg->reply_bytes == 0)
		cfg->reply_bytes = cfg->request_bytes;
	if (cfg->request_bytes == 0) {
		*why = "an empty --request";
		return -EINVAL;
	}
	cfg->request_bytes_max = cfg->request_bytes;
	cfg->reply_bytes_max = cfg->reply_bytes;
	return 0;
}

static ssize_t lg_raw_request_build(const struct lg_proto_cfg *cfg,
				    uint32_t msgid, uint8_t *buf, size_t cap)
{
	if (cap < cfg->request_bytes)
		return -ENOSPC;
	memcpy(buf, cfg->request, cfg->request_bytes);
	return (ssize_t)cfg->request_bytes;
}

/* Length only: redis answers "+PONG\r\n" to "PING\r\n" and an echo server
 * "PING\r\n"; both are right, and checking content would cost the client
 * time that belongs to the measurement. */
static ssize_t lg_raw_reply_frame(const struct lg_proto_cfg *cfg,
				  uint32_t expect_msgid, const uint8_t *buf,
				  size_t len, struct lg_reply *out)
{
	if (len < cfg->reply_bytes)
		return 0;
	out->msgid = expect_msgid;
	return (ssize_t)cfg->reply_bytes;
}

const struct lg_proto lg_proto_raw = {
	.name = "raw",
	.ordered = true,
	.setup = lg_raw_setup,
	.request_build = lg_raw_request_build,
	.reply_frame = lg_raw_reply_frame,
};

/* MessagePack-RPC, https://github.com/msgpack-rpc/msgpack-rpc/blob/master/spec.md */
#define LG_RPC_REQUEST 0
#define LG_RPC_RESPONSE 1
#define LG_RPC_METHOD_BYTES_MAX 255

/*
 * Every request differs only in its msgid, so setup encodes one whole request
 * once, msgid as a fixed-width uint32 (0xce: any msgpack decoder accepts the
 * wider form), and request_build copies it and patches four bytes.
 */
static int lg_rpc_setup(struct lg_proto_cfg *cfg, const char **why)
{
	static const uint8_t params_empty[] = { 0x90 };	 /* [] */

	if (cfg->request_given) {
		*why = "--request is for --mode raw; msgpack-rpc builds requests from --method and --params-hex";
		return -EINVAL;
	}
	if (!cfg->method || !*cfg->method) {
		*why = "needs --method NAME (e.g. node.health)";
		return -EINVAL;
	}
	size_t mlen = strlen(cfg->method);
	if (mlen > LG_RPC_METHOD_BYTES_MAX) {
		*why = "--method is longer than 255 bytes";
		return -EINVAL;
	}
	const uint8_t *params = cfg->params ? cfg->params : params_empty;
	size_t plen = cfg->params ? cfg->params_bytes : sizeof(params_empty);
	struct lg_mp_head h;
	if (lg_mp_skip(params, plen, plen) != (ssize_t)plen ||
	    lg_mp_head(params, plen, &h) <= 0 || h.kind != LG_MP_ARRAY) {
		*why = "--params-hex is not exactly one msgpack array";
		return -EINVAL;
	}

	size_t cap = 1 + 1 + 5 + 2 + mlen + plen;
	if (cap > LG_REQUEST_BYTES_MAX) {
		*why = "the request would exceed 65536 bytes";
		return -EINVAL;
	}
	uint8_t *b = pc_xcalloc(cap, 1);
	size_t n = 0;
	b[n++] = 0x94;			/* fixarray, 4 elements */
	b[n++] = LG_RPC_REQUEST;	/* positive fixint */
	b[n++] = 0xce;			/* uint32 msgid, patched per request */
	cfg->msgid_off = n;
	n += 4;
	if (mlen <= 31) {
		b[n++] = (uint8_t)(0xa0 | mlen);  /* fixstr */
	} else {
		b[n++] = 0xd9;			   /* str8 */
		b[n++] = (uint8_t)mlen;
	}
	memcpy(b + n, cfg->method, mlen);
	n += mlen;
	memcpy(b + n, params, plen);
	n += plen;

	cfg->tmpl = b;
	cfg->tmpl_bytes = n;
	cfg->request_bytes_max = n;
	cfg->reply_bytes_max = cfg->reply_bytes ? cfg->reply_bytes
						: LG_RPC_REPLY_BYTES_DEFAULT;
	return 0;
}

static ssize_t lg_rpc_request_build(const struct lg_proto_cfg *cfg,
				    uint32_t msgid, uint8_t *buf, size_t cap)
{
	if (cap < cfg->tmpl_bytes)
		return -ENOSPC;
	memcpy(buf, cfg->tmpl, cfg->tmpl_bytes);
	uint8_t *m = buf + cfg->msgid_off;
	m[0] = (uint8_t)(msgid >> 24);
	m[1] = (uint8_t)(msgid >> 16);
	m[2] = (uint8_t)(msgid >> 8);
	m[3] = (uint8_t)msgid;
	return (ssize_t)cfg->tmpl_bytes;
}

/*
 * One reply is one msgpack object; it must be [1, msgid, error, result] with
 * a msgid that fits 32 bits. Integers are accepted in any width the spec
 * allows, not only the shortest. Whether the msgid is in flight is the loop's
 * question, not the framer's.
 */
static ssize_t lg_rpc_reply_frame(const struct lg_proto_cfg *cfg,
				  uint32_t expect_msgid, const uint8_t *buf,
				  size_t len, struct lg_reply *out)
{
	size_t limit = cfg->reply_bytes_max;
	/* Frame first: "complete or not" must not depend on which of the
	 * checks below a partial reply happens to reach. */
	ssize_t total = lg_mp_skip(buf, len, limit);
	if (total <= 0)
		return total;

	struct lg_mp_head h;
	uint64_t v;
	size_t pos = 0;
	/* total bytes are one complete object, so no step below runs short. */
	ssize_t n = lg_mp_head(buf, (size_t)total, &h);
	if (n <= 0 || h.kind != LG_MP_ARRAY || h.val != 4)
		return -EBADMSG;
	pos += (size_t)n;
	n = lg_mp_head(buf + pos, (size_t)total - pos, &h);
	if (n <= 0 || !lg_mp_head_u64(&h, &v) || v != LG_RPC_RESPONSE)
		return -EBADMSG;
	pos += (size_t)n;
	n = lg_mp_head(buf + pos, (size_t)total - pos, &h);
	if (n <= 0 || !lg_mp_head_u64(&h, &v) || v > UINT32_MAX)
		return -EBADMSG;
	out->msgid = (uint32_t)v;
	pos += (size_t)n;
	n = lg_mp_skip(buf + pos, (size_t)total - pos, (size_t)total - pos);
	if (n <= 0)
		return -EBADMSG;
	if (buf[pos] != 0xc0) {	 /* anything but nil is an error */
		out->err_off = (uint32_t)pos;
		out->err_len = (uint32_t)n;
	}
	return total;
}

static const struct lg_proto lg_proto_rpc = {
	.name = "msgpack-rpc",
	.ordered = false,
	.setup = lg_rpc_setup,
	.request_build = lg_rpc_request_build,
	.reply_frame = lg_rpc_reply_frame,
};

/* Every mode --mode accepts; a new protocol is one more line here. */
static const struct lg_proto *const lg_protos[] = {
	&lg_proto_raw,
	&lg_proto_rpc,
};

const struct lg_proto *lg_proto_find(const char *name)
{
	for (size_t i = 0; i < PC_ARRAY_LEN(lg_protos); i++)
		if (strcmp(name, lg_protos[i]->name) == 0)
			return lg_protos[i];
	return NULL;
}
