/*
 * modules/http.h — HTTP routes a module can serve on the metrics port.
 *
 * Owns: the route and response types. A module lists routes in its
 * pc_module.http_routes table (NULL path ends it); the metrics module serves
 * them. Handlers run on the reactor thread that owns the HTTP connection and
 * must answer at once (no asynchronous HTTP).
 */
#ifndef PC_MODULES_HTTP_H
#define PC_MODULES_HTTP_H

#include <stddef.h>

#include "common/buf.h"
#include "modules/http_parse.h"

struct http_response {
	int status;                /* 200 unless the handler says otherwise */
	const char *content_type;  /* default "text/plain; charset=utf-8" */
	struct pc_wbuf body;       /* the handler appends to it ... */
	const void *static_body;   /* ... or points at constant bytes */
	size_t static_len;
	const char *extra_headers; /* CRLF-terminated lines, or NULL */
};

struct http_route {
	const char *path; /* exact match; NULL ends a table */
	void (*fn)(const struct http_request *req, struct http_response *resp);
};

#endif /* PC_MODULES_HTTP_H */
