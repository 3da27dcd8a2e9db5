/*
 * common/endpoint.h — "host:port", "[v6]:port" and "unix:/path" endpoints.
 *
 * Owns: the endpoint syntax every client (RPC, data transport, CLI) accepts.
 * Any thread.
 */
#ifndef PC_COMMON_ENDPOINT_H
#define PC_COMMON_ENDPOINT_H

#include <sys/socket.h>

/* Resolve endpoint into a socket address: 0, -EINVAL (syntax),
 * -ENAMETOOLONG, -EHOSTUNREACH (no such host). */
int pc_endpoint_parse(const char *endpoint, struct sockaddr_storage *ss,
		      socklen_t *len);

#endif /* PC_COMMON_ENDPOINT_H */
