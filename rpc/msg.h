/*
 * rpc/msg.h — the MessagePack-RPC envelope: parse one scanned message.
 *
 * Owns: nothing. Any thread. Used by the server (requests, notifications),
 * the clients (responses) and the fuzz target.
 */
#ifndef PC_RPC_MSG_H
#define PC_RPC_MSG_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc/mp.h"

enum rpc_msg_type {
	RPC_REQUEST = 0,
	RPC_RESPONSE = 1,
	RPC_NOTIFY = 2,
};

struct rpc_msg {
	int type;               /* enum rpc_msg_type */
	bool has_msgid;         /* msgid was read (requests, responses) */
	uint32_t msgid;
	const char *method;     /* requests and notifications */
	uint32_t method_len;
	struct mp_rd params;    /* at the params array (not consumed) */
	struct mp_rd error;     /* responses: at the error object */
	struct mp_rd result;    /* responses: at the result object */
};

/*
 * Parse a complete message p[0..len) (already checked by mp_scan).
 * Returns 0; or -EBADMSG when it is not an RPC message and no msgid could be
 * read (the connection must close); or -EINVAL when the shape is wrong but
 * the msgid is known (m->has_msgid; answer with an error). *why explains.
 */
int rpc_msg_parse(const uint8_t *p, size_t len, struct rpc_msg *m,
		  const char **why);

/* Pack the envelope of a request ([0, msgid, method, <params follow>]) with
 * nparams params to be packed next as one array. */
void rpc_pack_request(msgpack_packer *pk, uint32_t msgid, const char *method,
		      uint32_t nparams);

#endif /* PC_RPC_MSG_H */
