/*
 * rpc/msg.c — the MessagePack-RPC envelope (see msg.h).
 *
 * Owns: nothing. Any thread. Every field is type-checked; the cursors it
 * returns point into the caller's buffer. Also turns a response into a
 * struct rpc_result for both clients.
 */
#include "msg.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "rpc/client.h"

int rpc_msg_parse(const uint8_t *p, size_t len, struct rpc_msg *m,
		  const char **why)
{
	struct mp_rd r;
	uint32_t n;
	uint64_t type, msgid;
	memset(m, 0, sizeof(*m));
	mp_rd_init(&r, p, len);
	if (mp_rd_array(&r, &n) < 0 || n < 3 || n > 4) {
		*why = "a message must be an array of 3 or 4 elements";
		return -EBADMSG;
	}
	if (mp_rd_uint(&r, &type) < 0 || type > RPC_NOTIFY) {
		*why = "the first element must be 0, 1 or 2";
		return -EBADMSG;
	}
	m->type = (int)type;
	if (type == RPC_NOTIFY) {
		if (n != 3) {
			*why = "a notification is [2, method, params]";
			return -EBADMSG;
		}
	} else {
		if (n != 4) {
			*why = type == RPC_REQUEST
				       ? "a request is [0, msgid, method, params]"
				       : "a response is [1, msgid, error, result]";
			return -EBADMSG;
		}
		if (mp_rd_uint(&r, &msgid) < 0 || msgid > UINT32_MAX) {
			*why = "msgid must be an unsigned 32-bit integer";
			return -EBADMSG;
		}
		m->has_msgid = true;
		m->msgid = (uint32_t)msgid;
	}
	if (type == RPC_RESPONSE) {
		m->error = r;
		if (mp_skip(&r) < 0) {
			*why = "truncated error object";
			return -EBADMSG;
		}
		m->result = r;
		return 0;
	}
	if (mp_rd_str(&r, &m->method, &m->method_len) < 0) {
		*why = "method must be a string";
		return -EINVAL;
	}
	m->params = r;
	if (mp_peek(&r) != MP_T_ARRAY) {
		*why = "params must be an array";
		return -EINVAL;
	}
	return 0;
}

void rpc_pack_request(msgpack_packer *pk, uint32_t msgid, const char *method,
		      uint32_t nparams)
{
	msgpack_pack_array(pk, 4);
	msgpack_pack_uint8(pk, RPC_REQUEST);
	msgpack_pack_uint32(pk, msgid);
	mp_pack_cstr(pk, method);
	msgpack_pack_array(pk, nparams);
}

/* ------------------------------------------------------------- results */

const char *rpc_result_str(const struct rpc_result *res, char *buf,
			   size_t len)
{
	if (res->err == 0)
		snprintf(buf, len, "ok");
	else if (res->err == -EREMOTEIO)
		snprintf(buf, len, "%s: %s", res->code, res->message);
	else if (res->err == -ETIMEDOUT)
		snprintf(buf, len, "timeout");
	else
		snprintf(buf, len, "%s", strerror(-res->err));
	return buf;
}

static void copy_str(struct mp_rd *r, char *out, size_t cap)
{
	const char *s;
	uint32_t n;
	if (mp_rd_str(r, &s, &n) == 0) {
		snprintf(out, cap, "%.*s", (int)PC_MIN(n, (uint32_t)cap - 1), s);
	} else {
		mp_skip(r);
		snprintf(out, cap, "(not a string)");
	}
}

void rpc_result_from_response(const struct rpc_msg *m, struct rpc_result *res)
{
	memset(res, 0, sizeof(*res));
	struct mp_rd e = m->error;
	if (mp_rd_try_nil(&e)) {
		res->result = m->result;
		return;
	}
	res->err = -EREMOTEIO;
	snprintf(res->code, sizeof(res->code), "error");
	uint32_t n;
	if (mp_peek(&e) == MP_T_STR) {
		copy_str(&e, res->message, sizeof(res->message));
	} else if (mp_rd_map(&e, &n) == 0) {
		for (uint32_t i = 0; i < n; i++) {
			const char *k;
			uint32_t kl;
			if (mp_rd_str(&e, &k, &kl) < 0) {
				mp_skip(&e);
				mp_skip(&e);
				continue;
			}
			if (mp_str_eq(k, kl, "code"))
				copy_str(&e, res->code, sizeof(res->code));
			else if (mp_str_eq(k, kl, "message"))
				copy_str(&e, res->message, sizeof(res->message));
			else
				mp_skip(&e);
		}
	} else {
		snprintf(res->message, sizeof(res->message),
			 "error object of type %s", mp_type_name(mp_peek(&e)));
	}
}

