/*
 * common/endpoint.c — endpoint strings into socket addresses (endpoint.h).
 *
 * Owns: nothing. Any thread. Numeric ports only (AI_NUMERICSERV); a host
 * name is resolved by getaddrinfo, which may block, so reactor callers pass
 * numeric addresses (the cluster's endpoints are).
 */
#include "common/endpoint.h"

#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/un.h>

int pc_endpoint_parse(const char *endpoint, struct sockaddr_storage *ss,
		       socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (strncmp(endpoint, "unix:", 5) == 0) {
		struct sockaddr_un *sun = (struct sockaddr_un *)ss;
		const char *path = endpoint + 5;
		if (!*path || strlen(path) >= sizeof(sun->sun_path))
			return -ENAMETOOLONG;
		sun->sun_family = AF_UNIX;
		memcpy(sun->sun_path, path, strlen(path) + 1);
		*len = sizeof(*sun);
		return 0;
	}
	const char *colon = strrchr(endpoint, ':');
	if (!colon || colon == endpoint || !colon[1])
		return -EINVAL;
	char host[256];
	size_t hl = (size_t)(colon - endpoint);
	if (hl >= sizeof(host))
		return -EINVAL;
	memcpy(host, endpoint, hl);
	host[hl] = '\0';
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
		return -EHOSTUNREACH;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}
